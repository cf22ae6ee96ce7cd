"""Regime detection (feature clustering + CUSUM on residuals) and regime memory, on synthetic streams (no Ray)."""

from dataclasses import replace

import numpy as np
import pytest
from builders import batch_sample

from benchmarks.sample_sim import Anomalies, Phase, Regime, SimOperator, simulate
from trident_flows.core.types import OpConfig
from trident_flows.runtime.costmodel import DeviceCost
from trident_flows.scheduler.operator_model import OperatorModel
from trident_flows.scheduler.regime import RegimeDetector
from trident_flows.scheduler.regime_change import ChangeKind
from trident_flows.scheduler.regime_memory import RegimeMemory

CFG = OpConfig.make(batch_size=16)


def _stream(rng, regimes, items=16, spread=0.1):
    """Samples whose per-item features follow ``regimes``: a list of (pages per item, count)."""
    out, t = [], 0.0
    for pages, n in regimes:
        for _ in range(n):
            p = pages * items * rng.lognormal(0, spread)
            out.append(batch_sample(operator="ocr", config=CFG, start=t, busy_s=1.0, items_in=items, features={"pages": p}))
            t += 1.0
    return out


def _run(detector, samples, residuals=None):
    changes = []
    for n, s in enumerate(samples):
        change = detector.update(s, None if residuals is None else float(residuals[n]))
        if change is not None:
            changes.append(change)
    return changes


def test_feature_regime_switch_is_detected_within_a_few_samples():
    rng = np.random.default_rng(0)
    det = RegimeDetector("ocr", ("pages",))
    changes = _run(det, _stream(rng, [(3.0, 200), (40.0, 200)]))
    assert len(changes) == 1
    c = changes[0]
    assert c.kind == ChangeKind.FEATURES and c.old == 0 and c.new == 1 and not c.recurring
    assert 200 <= c.at_sample <= 200 + 5
    assert "new regime 1" in c.reason and c.evidence["votes"] >= 3


def test_stationary_noise_with_spikes_raises_no_alarm_over_a_long_run():
    rng = np.random.default_rng(1)
    n = 6000
    residuals = rng.normal(0.0, 0.05, n)
    spikes = rng.random(n) < 0.03
    residuals[spikes] -= rng.uniform(0.7, 1.8, spikes.sum())      # GC pauses, stragglers
    det = RegimeDetector("ocr", ("pages",))
    assert _run(det, _stream(rng, [(3.0, n)], spread=0.3), residuals) == []
    assert det.current == 0 and len(det.regimes) == 1


def test_hidden_throughput_shift_is_detected_from_residuals_but_a_short_burst_is_not():
    rng = np.random.default_rng(2)
    residuals = rng.normal(0.0, 0.05, 600)
    residuals[150:156] -= 0.5                                     # a neighbour's burst of 6 batches
    residuals[400:] -= 0.4                                        # a lasting slowdown no feature shows
    det = RegimeDetector("ocr", ("pages",))
    changes = _run(det, _stream(rng, [(3.0, 600)]), residuals)
    assert len(changes) == 1 and det.transients >= 1
    c = changes[0]
    assert c.kind == ChangeKind.RESIDUAL and c.old == c.new == 0
    assert 400 <= c.at_sample <= 400 + 20 and abs(c.change_point - 400) <= 5
    assert c.evidence["shift_log"] == pytest.approx(-0.4, abs=0.1)


def test_recurring_regime_is_recognised_as_the_same_regime():
    rng = np.random.default_rng(3)
    det = RegimeDetector("ocr", ("pages",))
    changes = _run(det, _stream(rng, [(3.0, 100), (40.0, 100), (3.0, 100), (40.0, 100), (12.0, 100)]))
    assert [(c.old, c.new, c.recurring) for c in changes] == [(0, 1, False), (1, 0, True), (0, 1, True), (1, 2, False)]
    assert len(det.regimes) == 3


def test_regimes_that_keep_ending_at_once_merge_into_one_mixed_workload_and_a_new_one_still_switches():
    # after a settled start, light and heavy items arrive in runs of 10 batches (10 s): each "regime" ends before the 16
    # samples any decision needs, so after two such the detector merges them; a lasting new workload is still a change
    rng = np.random.default_rng(4)
    samples = _stream(rng, [(3.0, 150)] + [(40.0, 10), (3.0, 10)] * 20 + [(300.0, 150)])
    det = RegimeDetector("ocr", ("pages",))
    changes = _run(det, samples)
    assert det.merges == [(1, 0)] and det.regime_of(1) == 0
    assert [(c.old, c.new) for c in changes] == [(0, 1), (1, 0), (0, 2)]  # without the merge: 40 switches before the last
    assert 150 <= changes[0].at_sample <= 160 and 550 <= changes[-1].at_sample <= 560
    assert det.classify(det.vector(samples[0]))[0] == det.classify(det.vector(samples[155]))[0] == 0
    # ticks of samples decide as one by one through the merge
    many = RegimeDetector("ocr", ("pages",))
    ticked = [c for at in range(0, len(samples), 37) for c in many.update_many(samples[at:at + 37]) if c is not None]
    assert [(c.old, c.new, c.at_sample) for c in ticked] == [(c.old, c.new, c.at_sample) for c in changes]
    assert many.merges == det.merges


def test_long_regimes_that_alternate_never_merge():
    rng = np.random.default_rng(5)
    det = RegimeDetector("ocr", ("pages",))
    changes = _run(det, _stream(rng, [(3.0, 60), (40.0, 60)] * 4))
    assert det.merges == [] and len(changes) == 7 and all(c.recurring for c in changes[1:])


def test_detector_names_a_bad_feature():
    det = RegimeDetector("ocr", ("pages",))
    bad = batch_sample(operator="ocr", replica_id="r7", config=CFG, items_in=16, features={"pages": float("nan")})
    with pytest.raises(ValueError, match=r"r7.*features\['pages'\]=nan"):
        det.update(bad)
    with pytest.raises(ValueError, match="confirm"):
        RegimeDetector("ocr", confirm=9, vote_window=5)


def test_regime_memory_serves_a_snapshot_that_later_fits_do_not_change():
    op = SimOperator("ocr", {"cpu": DeviceCost(per_batch_s=0.02, per_item_s=0.004, per_unit_s={"pages": 0.01})}, contention=0.0)
    quiet = Anomalies(spike_prob=0.0, burst_prob=0.0)
    short = simulate(op, [Phase(CFG, 2, 120)], [(Regime("short", {"pages": 3.0}), 1000)], anomalies=quiet, seed=1).samples
    long = simulate(op, [Phase(CFG, 2, 120)], [(Regime("long", {"pages": 40.0}), 1000)], anomalies=quiet, seed=2).samples
    memory = RegimeMemory()
    model = OperatorModel("ocr")
    model.fit(short)
    before = model.throughput(CFG, 2, {"pages": 3.0})
    memory.remember(0, "ocr", model=model, best_config=CFG, best_throughput=before.mean)
    model.fit(long)                                   # the live model moves on to another regime
    assert model.current_features["pages"] > 30
    record = memory.visit(0, "ocr")
    assert record.visits == 2 and record.best_config == CFG
    assert record.model.throughput(CFG, 2, {"pages": 3.0}) == before
    assert record.model.current_features["pages"] == pytest.approx(3.0, rel=0.15)
    assert memory.recall(1, "ocr") is None and memory.regimes("ocr") == [0]
    with pytest.raises(ValueError, match="no fit to remember"):
        memory.remember(1, "ocr", model=OperatorModel("ocr"))


def test_observe_with_a_refitting_model_and_a_config_change_flags_only_the_hidden_slowdown():
    op = SimOperator("ocr", {"cpu": DeviceCost(per_batch_s=0.02, per_item_s=0.004, per_unit_s={"pages": 0.01})}, contention=0.05)
    normal, slow = Regime("normal", {"pages": 5.0}), Regime("noisy-neighbour", {"pages": 5.0}, slowdown=1.5)
    phases = [Phase(CFG, 2, 350), Phase(OpConfig.make(batch_size=32), 3, 350)]          # config epoch 0 -> 1 at batch 350
    run = simulate(op, phases, [(normal, 500), (slow, 200)], anomalies=Anomalies(spike_prob=0.03, burst_prob=0.0), seed=4)
    model = OperatorModel("ocr")
    det = RegimeDetector("ocr", ("pages",))
    changes = []
    for i, s in enumerate(run.samples):
        change = det.observe(s, model, int(run.replicas[i]))
        if change is not None:
            changes.append(change)
        if (i + 1) % 50 == 0:
            model.fit(run.samples[max(0, i - 399):i + 1])   # the live model moves on every 50 samples
    switch = run.switches[0][0]
    assert [c.kind for c in changes] == [ChangeKind.RESIDUAL]
    assert switch <= changes[0].at_sample <= switch + 20


def test_a_residual_shift_that_the_operators_own_concurrency_explains_is_load_not_a_regime():
    # 300 batches one at a time, then the operator gets more work and runs 4 at once, each 40% slower
    # (replicas sharing a device): the residual shifts with unchanged features, but that is load
    rng = np.random.default_rng(3)
    samples, t = [], 0.0
    for n in range(600):
        busy = 1.0 if n < 300 else 1.5
        at_once = 1 if n < 300 else 4
        samples.append(batch_sample(operator="ocr", replica_id=f"r{n % at_once}", config=CFG, start=t, busy_s=busy, items_in=16,
                                    features={"pages": 48 * rng.lognormal(0, 0.1)}))
        t += busy / at_once
    residuals = rng.normal(0.0, 0.05, 600)
    residuals[300:] -= np.log(1.5)
    det = RegimeDetector("ocr", ("pages",))
    assert _run(det, samples, residuals) == [] and det.load_shifts >= 1
    # the same shift with the concurrency unchanged is a hidden change
    det = RegimeDetector("ocr", ("pages",))
    changes = _run(det, _stream(rng, [(3.0, 600)]), residuals)
    assert [c.kind for c in changes] == [ChangeKind.RESIDUAL] and det.load_shifts == 0


def _outcome(det, changes):
    """What a caller acts on (each change) and the state the next samples meet."""
    return ([(c.kind, c.old, c.new, c.recurring, c.at_sample, c.change_point) for c in changes if c is not None],
            det.n, det.current, det.transients, det.load_shifts, sorted(det.regimes))


def test_many_samples_at_once_decide_exactly_as_one_by_one():
    # quiet runs are consumed as arrays (``update_many``): the same changes, at the same samples, as
    # ``update`` one by one, through feature switches, a recurring regime, outliers, a config change,
    # a CUSUM burst and a lasting hidden slowdown
    rng = np.random.default_rng(7)
    samples = _stream(rng, [(3.0, 700), (40.0, 500), (3.0, 900), (12.0, 400)], spread=0.25)
    samples = [s if n < 1500 else batch_sample(operator=s.operator, replica_id=s.replica_id, config=s.config, start=s.start, end=s.end,
                                               busy_s=s.busy_s, items_in=s.items_in, items_out=s.items_out, features=s.features,
                                               config_epoch=1) for n, s in enumerate(samples)]
    for n in rng.choice(len(samples), 25, replace=False):   # outliers far from every regime
        s = samples[n]
        samples[n] = batch_sample(operator=s.operator, replica_id=s.replica_id, config=s.config, start=s.start, end=s.end, busy_s=s.busy_s,
                                  items_in=s.items_in, items_out=s.items_out, features={"pages": 1e4})
    residuals = rng.normal(0.0, 0.05, len(samples))
    residuals[900:906] -= 0.6                  # a burst: a transient
    residuals[1800:] -= 0.4                    # a lasting slowdown no feature shows
    residuals[rng.random(len(samples)) < 0.1] = np.nan   # samples without a residual
    one = RegimeDetector("ocr", ("pages",))
    reference = _outcome(one, [one.update(s, None if np.isnan(r) else float(r)) for s, r in zip(samples, residuals)])
    assert [k for k, *_ in reference[0]].count(ChangeKind.RESIDUAL) == 1 and one.transients >= 1
    for chunk in (1, 37, 500, len(samples)):
        det = RegimeDetector("ocr", ("pages",))
        changes = []
        for at in range(0, len(samples), chunk):
            part = residuals[at:at + chunk]
            changes += det.update_many(samples[at:at + chunk], [None if np.isnan(r) else float(r) for r in part])
        assert _outcome(det, changes) == reference
        for rid, regime in det.regimes.items():
            assert regime.centroid == pytest.approx(one.regimes[rid].centroid, rel=1e-9)
            assert regime.count == one.regimes[rid].count
        assert det.effective_radius == pytest.approx(one.effective_radius, rel=1e-9)
        # the CUSUM (stepped inline along quiet runs) ends where the sample-by-sample one does, exactly
        assert (det._cusum.up, det._cusum.down, list(det._cusum.history)) == (one._cusum.up, one._cusum.down, list(one._cusum.history))


def test_observe_many_decides_as_the_detector_sample_by_sample(monkeypatch):
    # a refitting model (newer fits taken only while calm) and a config change: whole ticks of samples
    # give the changes that samples fed one at a time without quiet runs give
    op = SimOperator("ocr", {"cpu": DeviceCost(per_batch_s=0.02, per_item_s=0.004, per_unit_s={"pages": 0.01})}, contention=0.05)
    normal, slow = Regime("normal", {"pages": 5.0}), Regime("noisy-neighbour", {"pages": 5.0}, slowdown=1.5)
    phases = [Phase(CFG, 2, 700), Phase(OpConfig.make(batch_size=32), 3, 700)]
    run = simulate(op, phases, [(normal, 1000), (slow, 400)], anomalies=Anomalies(spike_prob=0.03, burst_prob=0.002), seed=5)

    def feed(tick: int) -> tuple:
        model, det, changes = OperatorModel("ocr"), RegimeDetector("ocr", ("pages",)), []
        for at in range(0, len(run.samples), tick):
            changes += det.observe_many(run.samples[at:at + tick], model, int(run.replicas[at]))
            model.fit(run.samples[max(0, at + tick - 400):at + tick])   # the live model refits every tick
        return _outcome(det, changes)

    ticks = feed(100)
    assert [k for k, *_ in ticks[0]] == [ChangeKind.RESIDUAL]
    with monkeypatch.context() as m:
        m.setattr(RegimeDetector, "_quiet_run", lambda *args: [])   # every sample through ``update``'s steps
        assert feed(100) == ticks


def test_a_residual_shift_of_millisecond_batches_must_last_a_second_to_be_a_regime():
    # 15 ms batches: a load burst slows 40 of them (0.8 s) by half, later a shift lasts; both exceed ``persist``
    # batches, only the second lasts ``persist_s`` seconds
    rng = np.random.default_rng(6)
    n = 900
    residuals = rng.normal(0.0, 0.05, n)
    residuals[200:240] -= 0.7
    residuals[600:] -= 0.7
    samples, t = [], 0.0
    for k in range(n):
        busy = 0.015 if k < 200 or k >= 240 else 0.02
        samples.append(batch_sample(operator="dedup", config=CFG, start=t, busy_s=busy, items_in=16,
                                    features={"pages": 48.0 * rng.lognormal(0, 0.1)}))
        t += busy
    # (the whole stream is 14 s: no fill phase here)
    changes = _run(RegimeDetector("dedup", ("pages",), warmup_s=0.0), samples, residuals)
    assert len(changes) == 1 and changes[0].kind == ChangeKind.RESIDUAL, [(c.at_sample, c.reason) for c in changes]
    assert samples[changes[0].at_sample].end - samples[600].end == pytest.approx(1.0, abs=0.1)
    # the same burst in batches of a second is a regime: it lasted 40 s
    slow = [replace(s, start=k * 1.0, end=k * 1.0 + 1.0, busy_s=1.0) for k, s in enumerate(samples)]
    assert [c.at_sample < 260 for c in _run(RegimeDetector("dedup", ("pages",), warmup_s=0.0), slow, residuals)][:1] == [True]


def test_a_burst_cut_short_by_a_gap_is_no_regime_even_when_a_late_batch_agrees():
    # a starved operator flushes its queue: 60 millisecond batches in 0.8 s run 40% faster than the model
    # (the machine was idle for a moment), then a batch every 10 s at the old pace, the first of them still fast
    rng = np.random.default_rng(8)
    residuals, samples, t = [], [], 0.0
    for _ in range(300):
        residuals.append(float(rng.normal(0.0, 0.05)))
        samples.append(batch_sample(operator="quality", config=CFG, start=t, busy_s=0.01, items_in=8,
                                    features={"pages": 24.0 * rng.lognormal(0, 0.1)}))
        t += 0.0133
    for _ in range(60):
        residuals.append(0.35 + float(rng.normal(0.0, 0.05)))
        samples.append(batch_sample(operator="quality", config=CFG, start=t, busy_s=0.01, items_in=8,
                                    features={"pages": 24.0 * rng.lognormal(0, 0.1)}))
        t += 0.0133
    for k in range(12):
        t += 10.0
        residuals.append(0.5 if k == 0 else float(rng.normal(0.0, 0.05)))
        samples.append(batch_sample(operator="quality", config=CFG, start=t, busy_s=0.01, items_in=8,
                                    features={"pages": 24.0 * rng.lognormal(0, 0.1)}))
    det = RegimeDetector("quality", ("pages",), warmup_s=0.0)
    assert _run(det, samples, np.array(residuals)) == [] and det.transients >= 1
    # the same shift going on at the same pace after the gap is one
    lasting = residuals[:360] + [0.35 + float(rng.normal(0.0, 0.05)) for _ in range(12)]
    changes = _run(RegimeDetector("quality", ("pages",), warmup_s=0.0), samples, np.array(lasting))
    assert len(changes) == 1 and changes[0].kind == ChangeKind.RESIDUAL


def test_the_pipeline_s_fill_is_not_a_regime_but_a_later_shift_is():
    """While a pipeline starts, every operator runs flat out until backpressure sets in, and per-batch
    rates move 25-30% (the live documents trace): residuals of the first ``warmup_s`` seconds are
    no evidence; the same shift later is a regime."""
    rng = np.random.default_rng(7)
    n = 1200                                                     # batches of 0.1 s: 120 s
    residuals = rng.normal(0.0, 0.05, n)
    residuals[:80] -= 0.3                                        # the first 8 s run 26% slower
    residuals[800:] -= 0.4                                       # at 80 s, a lasting slowdown no feature shows
    samples = [batch_sample(operator="parse", config=CFG, start=k * 0.1, end=(k + 1) * 0.1, busy_s=0.1, items_in=16,
                            features={"pages": 48.0 * rng.lognormal(0, 0.1)})
               for k in range(n)]
    changes = _run(RegimeDetector("parse", ("pages",)), samples, residuals)
    assert [(c.kind, 800 <= c.at_sample <= 830) for c in changes] == [(ChangeKind.RESIDUAL, True)], [(c.at_sample, c.reason) for c in changes]
    # without the warm-up, the end of the fill is reported as a regime
    early = _run(RegimeDetector("parse", ("pages",), warmup_s=0.0), samples, residuals)
    assert early and early[0].at_sample < 150 and early[0].kind == ChangeKind.RESIDUAL
