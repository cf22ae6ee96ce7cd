"""OperatorModel and anomaly filtering on known-truth synthetic operators (no Ray)."""

import math
from dataclasses import replace

import numpy as np
import pytest
from builders import batch_sample

from benchmarks.sample_sim import Anomalies, Phase, Regime, SimOperator, simulate
from trident_flows.core.types import BatchSample, OpConfig, Outcome
from trident_flows.runtime.costmodel import DeviceCost
from trident_flows.scheduler.anomaly import Reason
from trident_flows.scheduler.model_values import NoModelError
from trident_flows.scheduler.operator_model import OperatorModel

MIB = 2**20
OP = SimOperator("parse", {"cpu": DeviceCost(per_batch_s=0.05, per_item_s=0.004, per_unit_s={"pages": 0.006}, resident_bytes=200 * MIB,
                                             per_item_bytes=2 * MIB, per_unit_bytes={"pages": MIB // 2})}, contention=0.1)
SHORT = Regime("short", {"pages": 3.0})
A = OpConfig.make(batch_size=16)
B = OpConfig.make(batch_size=32)
QUIET = Anomalies(spike_prob=0.0, burst_prob=0.0)


def _truth(run, held):
    return np.array([abs(h.predicted - run.true_throughput(h.window.indices)) / run.true_throughput(h.window.indices) for h in held])


def test_spikes_are_filtered_counted_and_mape_stays_under_five_percent():
    run = simulate(OP, [Phase(A, 4, 300), Phase(B, 2, 300)], [(SHORT, 1000)], anomalies=Anomalies(spike_prob=0.05, burst_prob=0.0), seed=3)
    model = OperatorModel("parse")
    report = model.fit(run.samples)
    assert report.fitted and report.mape is not None and report.mape < 0.05
    assert _truth(run, report.held_out).mean() < 0.05
    spikes = set(np.flatnonzero(run.anomaly == "spike"))
    caught = {f.index for f in report.filtered if f.reason in (Reason.SPIKE, Reason.RESIDUAL)}
    assert len(spikes & caught) >= 0.8 * len(spikes)
    assert report.filtered_counts.get("spike", 0) + report.filtered_counts.get("residual", 0) == len(caught)
    # nothing silently lost: every sample is fitted on, held out, or filtered with a reason
    held = {i for h in report.held_out for i in h.window.indices}
    filtered = {f.index for f in report.filtered}
    parts = [set(report.fitted_on), held, filtered, set(report.subsampled)]
    assert set().union(*parts) == set(range(len(run.samples)))
    assert sum(len(p) for p in parts) == len(run.samples)


def test_sustainable_throughput_counts_busy_time_not_idle_gaps():
    # starved replicas (idle gaps between batches) still have the capacity of their busy time
    run = simulate(OP, [Phase(A, 2, 200)], [(SHORT, 1000)], anomalies=QUIET, seed=4, starvation_s=0.5)
    model = OperatorModel("parse")
    model.fit(run.samples)
    truth = OP.true_throughput(A, 2, {"pages": 3.0})
    wall_rate = sum(s.items_in for s in run.samples) / (max(s.end for s in run.samples) - min(s.start for s in run.samples))
    assert wall_rate < 0.6 * truth
    assert model.throughput(A, 2, {"pages": 3.0}).mean == pytest.approx(truth, rel=0.05)


def test_overlapping_batches_in_flight_are_not_double_counted():
    # one replica runs two 10-item batches at once, each busy for 1 s: it sustains 20 items/s, not 10
    samples = []
    for k in range(40):
        t = 100.0 + k
        for _ in range(2):
            samples.append(batch_sample(operator="parse", config=A, start=t, busy_s=1.0, items_in=10, features={"pages": 30.0},
                                        peak_host_mem_bytes=10 * MIB, inflight=2))
    model = OperatorModel("parse")
    assert model.fit(samples).fitted
    assert model.throughput(A, 1, {"pages": 3.0}).mean == pytest.approx(20.0, rel=0.02)


def test_capacity_curve_shows_diminishing_returns_of_contending_replicas():
    phases = [Phase(A, r, 150) for r in (1, 2, 4, 8)]
    run = simulate(OP, phases, [(SHORT, 1000)], anomalies=QUIET, seed=5)
    model = OperatorModel("parse")
    model.fit(run.samples)
    curve = model.capacity_curve(A, 8, {"pages": 3.0})
    means = np.array([p.mean for p in curve])
    assert np.all(np.diff(means) > 0)
    per_replica = means / np.arange(1, 9)
    assert per_replica[-1] < 0.7 * per_replica[0]
    for r in (1, 2, 4, 8):
        assert means[r - 1] == pytest.approx(OP.true_throughput(A, r, {"pages": 3.0}), rel=0.06)
        assert model.per_replica(A, r, {"pages": 3.0}).mean == pytest.approx(means[r - 1] / r)


def test_memory_prediction_brackets_the_truth_and_widens_when_extrapolating():
    run = simulate(OP, [Phase(A, 2, 150), Phase(B, 2, 150)], [(SHORT, 1000)], anomalies=QUIET, seed=6)
    model = OperatorModel("parse")
    model.fit(run.samples)
    for cfg in (A, B):
        truth = OP.costs["cpu"].peak_bytes(cfg.batch_size, {"pages": 3.0 * cfg.batch_size})
        pred = model.memory(cfg, {"pages": 3.0})
        assert pred.mean == pytest.approx(truth, rel=0.05)
        assert model.memory_upper(cfg, 3.0) >= truth
    far = model.memory(OpConfig.make(batch_size=128), {"pages": 3.0})
    assert far.std > 2 * model.memory(B, {"pages": 3.0}).std


def test_old_config_epoch_samples_are_dropped_when_superseded_and_downweighted_otherwise():
    fast = SimOperator("parse", OP.costs, contention=0.0)
    slow = SimOperator("parse", {"cpu": DeviceCost(per_batch_s=0.1, per_item_s=0.008, per_unit_s={"pages": 0.012})}, contention=0.0)
    old_a = simulate(fast, [Phase(A, 2, 150)], [(SHORT, 1000)], anomalies=QUIET, seed=7).samples
    old_b = simulate(fast, [Phase(B, 2, 150)], [(SHORT, 1000)], anomalies=QUIET, seed=8, start=2000.0).samples
    new_a = [replace(s, config_epoch=1)
             for s in simulate(slow, [Phase(A, 2, 150)], [(SHORT, 1000)], anomalies=QUIET, seed=9, start=5000.0).samples]
    model = OperatorModel("parse")
    report = model.fit(old_a + old_b + new_a)
    superseded = {f.index for f in report.filtered if f.reason == Reason.SUPERSEDED}
    assert superseded == set(range(len(old_a)))          # same config re-measured: the old epoch stops steering
    assert report.downweighted > 0                       # config B, not re-measured: kept, down-weighted
    assert model.throughput(A, 2, {"pages": 3.0}).mean == pytest.approx(slow.true_throughput(A, 2, {"pages": 3.0}), rel=0.06)
    assert model.throughput(B, 2, {"pages": 3.0}).mean == pytest.approx(fast.true_throughput(B, 2, {"pages": 3.0}), rel=0.15)
    stale = OperatorModel("parse", max_epoch_age=0).fit(old_a + old_b + new_a)
    assert stale.filtered_counts["stale_epoch"] == len(old_b)


def _flat(n: int, **changes) -> list[BatchSample]:
    base = dict(operator="parse", replica_id="r0", config=A, busy_s=0.5, items_in=16, items_out=16, features={"pages": 48.0},
                peak_host_mem_bytes=300 * MIB)
    base.update(changes)
    return [batch_sample(start=10.0 + k, end=10.5 + k, **base) for k in range(n)]


def test_degenerate_windows_give_a_clear_state_not_a_crash():
    model = OperatorModel("parse")
    with pytest.raises(NoModelError, match="never called"):
        model.throughput(A, 1)
    empty = model.fit([])
    assert empty.status == "no_model" and not model.ready
    with pytest.raises(NoModelError, match="no usable ok samples"):
        model.throughput(A, 1)
    one = model.fit(_flat(1))
    assert one.status == "no_model" and "need >= 2" in one.reason
    same = model.fit(_flat(30))
    assert same.fitted
    pred = model.throughput(A, 1)
    assert pred.mean == pytest.approx(32.0, rel=0.01) and math.isfinite(pred.std)
    assert model.memory(A).mean == pytest.approx(300 * MIB, rel=0.01)


def test_bad_values_are_set_aside_with_the_field_named():
    bad = _flat(20)
    bad[3] = _flat(1, busy_s=float("nan"))[0]
    bad[5] = _flat(1, features={"pages": float("inf")})[0]
    bad[7] = _flat(1, outcome=Outcome.OOM, error="CUDA out of memory")[0]
    report = OperatorModel("parse").fit(bad)
    details = {f.index: (f.reason, f.detail) for f in report.filtered}
    assert details[3][0] == Reason.INVALID and "busy_s" in details[3][1]
    assert details[5][0] == Reason.INVALID and "features['pages']" in details[5][1]
    assert details[7][0] == Reason.OUTCOME and report.ooms == (A,)
    assert report.fitted


def test_prediction_inputs_are_checked():
    model = OperatorModel("parse")
    model.fit(_flat(30))
    with pytest.raises(ValueError, match=r"features\['pages'\]=nan"):
        model.throughput(A, 1, {"pages": float("nan")})
    with pytest.raises(ValueError, match="features lack"):
        model.throughput(A, 1, {"scanned": 1.0})
    with pytest.raises(ValueError, match="replicas must be >= 1"):
        model.throughput(A, 0)
    with pytest.raises(NoModelError, match="device 'gpu'"):
        model.throughput(OpConfig.make("gpu", batch_size=16), 1)
    with pytest.raises(NoModelError, match="device 'gpu'"):
        model.memory(OpConfig.make("gpu", batch_size=16))
    with pytest.raises(ValueError, match="belongs to operator 'ocr'"):
        model.fit(_flat(3, operator="ocr"))


def test_an_unseen_categorical_knob_value_has_no_prediction():
    small, large = OpConfig.make(batch_size=16, model="small"), OpConfig.make(batch_size=16, model="large")
    samples = _flat(20, config=small) + [replace(s, start=s.start + 100, end=s.end + 100, busy_s=0.25, config=large) for s in _flat(20)]
    model = OperatorModel("parse")
    assert model.fit(samples).fitted
    assert model.throughput(large, 1).mean == pytest.approx(64.0, rel=0.02)
    assert model.throughput(small, 1).mean == pytest.approx(32.0, rel=0.02)
    with pytest.raises(NoModelError, match="model='tiny'"):
        model.throughput(OpConfig.make(batch_size=16, model="tiny"), 1)


def test_windows_of_millisecond_batches_span_enough_busy_time_to_average_out_scheduling_jitter():
    # batches of a few milliseconds, timed with the scatter of a loaded machine (gamma, CV 0.7)
    cfg = OpConfig.make(batch_size=4)
    rng = np.random.default_rng(0)
    samples, t = [], 1000.0
    for k in range(2000):
        busy = float(rng.gamma(2.0, 0.004))
        samples.append(batch_sample(operator="langid", replica_id=f"r{k % 2}", config=cfg, start=t, busy_s=busy, items_in=4))
        t += busy / 2
    fine = OperatorModel("langid", min_window_busy_s=0.0).fit(samples)
    model = OperatorModel("langid")
    report = model.fit(samples)
    assert all(h.window.busy_s >= model.min_window_busy_s for h in report.held_out[:-1])
    assert report.mape < 0.1 and report.mape < 0.6 * fine.mape


def test_residuals_of_many_samples_match_one_at_a_time():
    run = simulate(OP, [Phase(A, 4, 200), Phase(B, 2, 200)], [(SHORT, 1000)], anomalies=QUIET, seed=5)
    model = OperatorModel("parse")
    model.fit(run.samples)
    samples = list(run.samples[:60])
    samples[3] = replace(samples[3], outcome=Outcome.OOM)                  # no residual: not an OK batch
    samples[7] = replace(samples[7], config=OpConfig.make("gpu", batch_size=8))  # no residual: a device never seen
    replicas = [4 if s.config == A else 2 for s in samples]
    one = []
    for s, r in zip(samples, replicas):
        try:
            one.append(model.log_residual(s, r) if s.outcome == Outcome.OK else None)
        except NoModelError:
            one.append(None)
    many = model.log_residuals(samples, replicas)
    assert many[3] is None and many[7] is None
    assert [m is None for m in many] == [o is None for o in one]
    assert [m for m in many if m is not None] == pytest.approx([o for o in one if o is not None], rel=1e-9, abs=1e-9)


def _replicas_phase(replicas: int, rate: float, start: float, batches: int = 40) -> list[BatchSample]:
    """``replicas`` replicas each finishing 4-item batches back to back at ``rate`` items/s per replica."""
    busy = 4 / rate
    return [batch_sample(operator="parse", replica_id=f"r{replicas}-{j}", config=A, start=start + k * busy, end=start + (k + 1) * busy,
                         busy_s=busy, items_in=4, features={"pages": 12.0}, peak_host_mem_bytes=100 * MIB)
            for j in range(replicas) for k in range(batches)]


def test_replica_counts_beyond_those_seen_keep_the_nearest_per_replica_rate():
    # 7, 8 and 9 replicas whose per-replica rate moved with the machine's load (no contention trend): a
    # log-linear trend fitted over so narrow a range, extrapolated to 1-4 replicas, predicted 1 item/s per
    # replica on a live trace where 4 replicas did 8.5 each; beyond the counts seen the rate stays flat
    samples = _replicas_phase(7, 8.0, 0.0) + _replicas_phase(8, 6.0, 100.0) + _replicas_phase(9, 7.5, 200.0)
    model = OperatorModel("parse")
    assert model.fit(samples).fitted
    seen = [model.per_replica(A, r).mean for r in (7, 8, 9)]
    for r in (1, 2, 4, 16):
        assert min(seen) * 0.9 <= model.per_replica(A, r).mean <= max(seen) * 1.1
    assert model.per_replica(A, 4).mean == pytest.approx(model.per_replica(A, 7).mean, rel=1e-6)
    assert model.per_replica(A, 16).mean == pytest.approx(model.per_replica(A, 9).mean, rel=1e-6)


def test_a_lower_per_replica_rate_at_fewer_replicas_is_load_not_their_number():
    # 5 warming replicas on a loaded machine (4 items/s each), then 7 at 6 items/s each, with four times the
    # evidence: a replica does not run faster because more run beside it, so one per-replica rate stands for both,
    # weighted by the windows at each count (not 4 at 5 and 6 at 7, nor the faster one for both)
    samples = _replicas_phase(5, 4.0, 0.0, batches=20) + _replicas_phase(7, 6.0, 100.0, batches=60)
    model = OperatorModel("parse")
    assert model.fit(samples).fitted
    at7 = model.per_replica(A, 7).mean
    assert 5.0 < at7 < 5.9
    assert [model.per_replica(A, r).mean for r in (1, 5, 6)] == pytest.approx([at7] * 3, rel=1e-4)
    curve = [p.mean for p in model.capacity_curve(A, 7)]
    assert curve == pytest.approx([at7 * r for r in range(1, 8)], rel=1e-4)
    # contention, the other way round, stands: 2 replicas at 10 items/s each, 8 at 5
    model = OperatorModel("parse")
    model.fit(_replicas_phase(2, 10.0, 0.0, batches=60) + _replicas_phase(8, 5.0, 100.0, batches=30))
    assert model.per_replica(A, 2).mean > 1.6 * model.per_replica(A, 8).mean


def test_a_batch_of_heavy_items_is_work_not_a_spike_but_one_slow_for_its_content_is():
    # seconds per item = 0.004 + 0.006 per page; most items have 3 pages, one batch in 20 carries 30-page documents
    rng = np.random.default_rng(9)
    samples, t = [], 0.0
    for k in range(400):
        pages = 16 * (30.0 if k % 20 == 7 else 3.0) * rng.lognormal(0, 0.05)
        busy = (16 * 0.004 + 0.006 * pages) * rng.lognormal(0, 0.05) * (3.0 if k % 50 == 31 else 1.0)   # and a slow one in 50
        samples.append(batch_sample(operator="parse", config=A, start=t, busy_s=busy, items_in=16, features={"pages": pages}))
        t += busy
    spikes = {f.index for f in OperatorModel("parse").fit(samples).filtered if f.reason == Reason.SPIKE}
    assert not spikes & {k for k in range(400) if k % 20 == 7}
    assert {k for k in range(400) if k % 50 == 31} <= spikes


def test_batches_whose_end_timestamp_was_rounded_below_start_plus_busy_are_kept():
    # end = start + busy_s in float64 seconds since the epoch (spacing 2.4e-7 s): a 25 ms batch's
    # end - start comes out up to 1.2e-7 s short of its busy_s; a third of a live video trace's
    # dedup batches were discarded as invalid for it
    rng = np.random.default_rng(4)
    samples, t = [], 1_796_052_177.950555
    for _ in range(200):
        busy = float(rng.uniform(0.02, 0.03))
        samples.append(batch_sample(operator="dedup", config=A, start=t, busy_s=busy, items_in=4))
        t += busy + 0.001
    assert sum(s.end - s.start < s.busy_s for s in samples) > 40    # the rounding is real
    late = replace(samples[50], busy_s=samples[50].busy_s + 1e-3)    # a busy time 1 ms past its interval is not
    report = OperatorModel("dedup").fit(samples[:50] + [late] + samples[51:])
    invalid = [f for f in report.filtered if f.reason == Reason.INVALID]
    assert [f.index for f in invalid] == [50] and "exceeds end - start" in invalid[0].detail


def test_a_window_of_mixed_items_is_predicted_at_the_harmonic_mean_of_their_rates():
    # seconds per item = 0.008 + 1.2 per scanned page: short documents (no scans) run 150x faster than scans;
    # a batch's time is the sum over its items, so a mix runs at the harmonic mean of the two rates
    def batch(t: float, scanned: float, items: int = 4) -> BatchSample:
        busy = items * 0.008 + 1.2 * scanned
        return batch_sample(operator="ocr", config=A, start=t, busy_s=busy, items_in=items, features={"scanned_pages": scanned})

    rng = np.random.default_rng(5)
    samples, t = [], 0.0
    for k in range(240):
        s = batch(t, 0.0 if k < 160 else float(rng.uniform(3.6, 4.4)))   # short documents, then scans (~1 scanned page/item)
        samples.append(s)
        t = s.end
    model = OperatorModel("ocr")
    assert model.fit(samples).fitted
    for scanned in (0.0, 0.14, 0.5, 1.0):
        truth = 1.0 / (0.008 + 1.2 * scanned)
        assert model.throughput(A, 1, {"scanned_pages": scanned}).mean == pytest.approx(truth, rel=0.1), scanned


def test_bursts_that_slow_a_tenth_of_the_windows_cannot_hide_in_the_noise_they_inflate():
    # the live video trace's dedup_frames: noisy 25 ms batches, and the machine's load slowing runs of 5-8 batches
    # 2.2x for a second at a time; the GP fitted on those windows took them for noise and predicted 10-15% slow
    noisy = SimOperator("dedup", {"cpu": DeviceCost(per_item_s=0.001, per_unit_s={"frames": 0.001})}, contention=0.0, noise=0.1)
    clips = Regime("clips", {"frames": 5.0})
    config = OpConfig.make(batch_size=4)
    run = simulate(noisy, [Phase(config, 1, 600)], [(clips, 1000)], anomalies=Anomalies(spike_prob=0.0, burst_prob=0.02, burst_len=(5, 8),
                                                                                          burst_factor=2.2), seed=4)
    model = OperatorModel("dedup")
    report = model.fit(run.samples)
    caught = {f.index for f in report.filtered if f.reason in (Reason.SPIKE, Reason.RESIDUAL)}
    assert len(caught & set(np.flatnonzero(run.anomaly == "burst"))) >= 20     # of 39 burst batches, by either stage
    truth = noisy.true_throughput(config, 1, {"frames": 5.0})
    assert model.throughput(config, 1, {"frames": 5.0}).mean == pytest.approx(truth, rel=0.06)


def test_residual_outliers_are_unmasked_by_a_robust_scale_but_structure_the_gp_explains_is_kept():
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

    from trident_flows.scheduler.anomaly import loo_outliers

    rng = np.random.default_rng(0)
    x = np.linspace(0, 10, 100)[:, None]
    y = rng.normal(0.0, 0.04, 100)
    bursts = np.arange(5, 100, 10)
    y[bursts] -= 0.7                      # a tenth of the points: the GP's fitted noise grows until none is 3.5 of its stds out
    kernel = ConstantKernel(0.5) * Matern(2.0, nu=2.5) + WhiteKernel(0.05)
    gp = GaussianProcessRegressor(kernel, normalize_y=True).fit(x, y)
    flagged = loo_outliers(gp.L_, gp.alpha_, float(np.atleast_1d(gp._y_train_std)[0]))
    assert set(np.flatnonzero(flagged)) == set(bursts)
    # eight windows of another workload (inputs apart from the rest) 30% slower: structure the GP fits, not outliers
    x = np.concatenate([np.linspace(0, 10, 92), np.linspace(13, 14, 8)])[:, None]
    y = np.where(x[:, 0] > 12, -0.3, 0.0) + rng.normal(0.0, 0.04, 100)
    gp = GaussianProcessRegressor(kernel, normalize_y=True).fit(x, y)
    assert not loo_outliers(gp.L_, gp.alpha_, float(np.atleast_1d(gp._y_train_std)[0])).any()


def _ocr_batch(replica: str, t: float, scanned: float, slow: float = 1.0) -> BatchSample:
    """A 4-item OCR batch: 8 ms per item and 1.2 s per scanned page (``scanned`` pages per item), ``slow`` times over."""
    busy = (4 * 0.008 + 4 * 1.2 * scanned) * slow
    return batch_sample(operator="ocr", replica_id=replica, config=A, start=t, busy_s=busy, items_in=4, features={"scanned_pages": scanned})


def test_a_replica_count_that_changed_with_the_workload_is_not_taken_for_contention():
    # one OCR replica on short documents, then two on scanned ones (the scheduler scaled it as the block began): the
    # count and the workload moved together, and a prior mean that split the slope between them predicted one replica
    # on scans 12x faster than each of the two measuring them (a capacity curve flat beyond one replica)
    rng = np.random.default_rng(5)
    samples, t = [], 0.0
    for _ in range(160):
        samples.append(_ocr_batch("r0", t, 0.0))
        t = samples[-1].end
    for replica in ("r0", "r1"):
        u = t
        for _ in range(20):
            samples.append(_ocr_batch(replica, u, float(rng.uniform(0.9, 1.1))))
            u = samples[-1].end
    model = OperatorModel("ocr")
    assert model.fit(samples).fitted
    truth = 1 / (0.008 + 1.2)   # items/s of one replica on a scanned page per item, whatever runs beside it
    assert model.per_replica(A, 2).mean == pytest.approx(truth, rel=0.05)
    assert model.per_replica(A, 1).mean < 1.35 * truth
    curve = [p.mean for p in model.capacity_curve(A, 4)]
    assert all(b > a for a, b in zip(curve, curve[1:]))


def test_the_evidence_gate_doubts_what_more_replicas_add_not_the_level_the_running_ones_measure():
    # rates that swing 50x with nothing in the features to say why: far from the evidence the level of the rate is
    # in doubt by more than its median, the same doubt at every count; the running replicas measure that level,
    # so the gate's bound beyond them must still show what a third replica adds (mean - std was below 0: no gain)
    rng = np.random.default_rng(3)
    samples, t0 = [], 0.0
    for scanned, slow in ((0.0, 1.0), (0.5, 50.0), (1.0, 1.0), (1.5, 50.0)):
        for replicas in (1, 2):
            for j in range(replicas):
                t = t0
                for _ in range(24):
                    samples.append(_ocr_batch(f"r{j}", t, scanned, slow * float(rng.lognormal(0, 0.03))))
                    t = samples[-1].end
            t0 = max(s.end for s in samples) + 1.0
    model = OperatorModel("ocr")
    assert model.fit(samples).fitted
    far = {"scanned_pages": 4.0}
    mean, std = model.predict_many([A] * 4, [1, 2, 3, 4], far)
    assert std[2] > mean[2]
    running = model.capacity_lower(A, 4, 2, 1.0, far)
    assert list(running[:2]) == pytest.approx(list(mean[:2]))
    assert running[2] > 1.4 * running[1] and running[2] > 0.9 * mean[2]
    assert (model.capacity_lower(A, 4, 0, 1.0, far) < 0.5 * mean).all()   # with none running, the level is in doubt
    assert list(model.capacity_lower(A, 4, 2, 0.0, far)) == pytest.approx(list(mean))
