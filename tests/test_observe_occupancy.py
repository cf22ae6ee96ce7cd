"""Queue and in-flight awareness: occupancy of runner snapshots and the model's calibration to saturated spans (no Ray)."""

import pytest
from builders import operator_state, replica_state, runner_state

from benchmarks.sample_sim import Anomalies, Phase, Regime, SimOperator, simulate
from trident_flows.core.state import OperatorState, RunnerState
from trident_flows.core.types import OpConfig
from trident_flows.runtime.costmodel import DeviceCost
from trident_flows.scheduler.occupancy import Occupancy, OccupancyTracker, SaturatedSpan, classify
from trident_flows.scheduler.operator_model import OperatorModel

MIB = 2**20
OP = SimOperator("parse", {"cpu": DeviceCost(per_batch_s=0.05, per_item_s=0.004, per_unit_s={"pages": 0.006}, resident_bytes=200 * MIB,
                                             per_item_bytes=2 * MIB, per_unit_bytes={"pages": MIB // 2})})
A = OpConfig.make(batch_size=16)


def _op(queue: int, inflight: tuple[int, ...], items_in: int = 0, config: OpConfig = A, name: str = "parse",
        batches: tuple[int, ...] | None = None) -> OperatorState:
    done = batches or (10,) * len(inflight)   # batches each replica finished
    reps = tuple(replica_state(replica_id=f"r{k}", actor_name=f"a{k}", config=config, inflight=n, busy_fraction=0.5, batches=b)
                 for k, (n, b) in enumerate(zip(inflight, done)))
    return operator_state(name=name, replicas=reps, queue_items=queue, queue_bytes=queue * 100, items_in=items_in, items_out=items_in, busy_fraction=0.5)


def _state(*ops: OperatorState) -> RunnerState:
    return runner_state(operators=ops)


def test_classify_tells_saturated_blocked_starved_and_busy_apart():
    assert classify(_op(5, (1, 2))) is Occupancy.SATURATED
    assert classify(_op(5, (1, 0))) is Occupancy.BLOCKED        # work waiting, a replica idle: held back by a full downstream queue
    assert classify(_op(0, (1, 0))) is Occupancy.STARVED
    assert classify(_op(0, (1, 1))) is Occupancy.BUSY


def test_tracker_reports_a_span_only_after_saturation_s_of_saturated_snapshots():
    tracker = OccupancyTracker(saturation_s=8.0)
    spans = {}
    for k in range(10):    # 10 items/s taken, saturated throughout, each replica finishing a batch every 1.6 s
        spans = tracker.update(_state(_op(50, (2, 2), items_in=10 * k, batches=(10 * k // 32,) * 2)), at=100.0 + k)
        if k < 8:
            assert spans == {}
    span = spans["parse"]
    assert span.measured == pytest.approx(10.0) and not span.bound and span.replicas == 2
    # a blocked snapshot ends the run: no span until saturation_s has passed again
    assert tracker.update(_state(_op(50, (2, 0), items_in=100)), at=110.0) == {}
    assert tracker.update(_state(_op(50, (2, 2), items_in=100)), at=111.0) == {}


def test_a_span_whose_replicas_finished_less_than_a_batch_each_is_an_upper_bound():
    tracker = OccupancyTracker(saturation_s=4.0)
    for k in range(6):    # one replica of batch 16 holding a batch, nothing finished: the span reaches back to the first snapshot
        spans = tracker.update(_state(_op(9, (1,), items_in=0)), at=float(k))
    assert spans["parse"].bound and spans["parse"].seconds == 5.0 and spans["parse"].measured == pytest.approx(16 / 5.0)
    tracker = OccupancyTracker(saturation_s=4.0)
    for k in range(6):    # two replicas (32 items a round) finished 6 items: at most 6 + the 2 x 16 they hold
        spans = tracker.update(_state(_op(9, (1, 1), items_in=k + (k == 5))), at=float(k))
    assert spans["parse"].bound and spans["parse"].measured == pytest.approx((6 + 32) / 5.0)


def test_a_straggler_holding_a_replica_throughout_gives_no_span_until_it_finishes():
    # three replicas; two finish a batch of 16 every 2 s, the third holds one batch of a heavier workload
    tracker = OccupancyTracker(saturation_s=8.0)
    for k in range(12):
        spans = tracker.update(_state(_op(50, (1, 1, 1), items_in=16 * k, batches=(k // 2, k // 2, 3))), at=float(k))
    assert spans == {}      # what the other two took is not what the operator can do
    spans = tracker.update(_state(_op(50, (1, 1, 1), items_in=16 * 12, batches=(6, 6, 4))), at=12.0)
    # it finished: a span again, of saturation_s, each replica having finished a batch in it
    assert spans["parse"].start == 4.0 and spans["parse"].measured == pytest.approx(16.0) and not spans["parse"].bound


def _fitted() -> tuple[OperatorModel, float]:
    model, end, _ = _fitted_run()
    return model, end


def _fitted_run(seed: int = 5):
    run = simulate(OP, [Phase(A, 2, 300)], [(Regime("short", {"pages": 3.0}), 600)],
                   anomalies=Anomalies(spike_prob=0.0, burst_prob=0.0), seed=seed)
    model = OperatorModel("parse")
    model.fit(run.samples)
    return model, max(s.end for s in run.samples), run


def _span_prediction(model: OperatorModel, run, start: float, end: float) -> float:
    """The busy-time model's prediction for 2 replicas on the work that finished from ``start`` to ``end``."""
    inside = [s for s in run.samples if start < s.end <= end]
    pages = sum(s.features["pages"] for s in inside) / sum(s.items_in for s in inside)
    return model.throughput(A, 2, {"pages": pages}).mean


def test_calibration_scales_every_throughput_prediction_to_the_saturated_measurement():
    model, end, run = _fitted_run()
    raw = model.throughput(A, 2).mean
    # it took half what busy time says for the work it finished in the span
    span = SaturatedSpan("parse", end - 8, end, ((A, 2),), 100, _span_prediction(model, run, end - 8, end) / 2, False)
    cal = model.calibrate(span)
    assert cal is not None and cal.factor == pytest.approx(0.5, rel=1e-6)
    assert model.throughput(A, 2).mean == pytest.approx(raw / 2, rel=1e-6)
    assert model.capacity_curve(A, 3)[1].mean == pytest.approx(raw / 2, rel=1e-6)
    assert model.per_replica(A, 2).mean == pytest.approx(raw / 4, rel=1e-6)
    assert "scaled by 0.50" in cal.describe()
    model.forget_calibration()
    assert model.throughput(A, 2).mean == pytest.approx(raw, rel=1e-6)


def test_no_calibration_within_tolerance_or_from_an_upper_bound_above_the_model():
    model, end, run = _fitted_run()
    raw = _span_prediction(model, run, end - 8, end)
    assert model.calibrate(SaturatedSpan("parse", end - 8, end, ((A, 2),), 100, raw * 0.95, False)) is None
    assert model.calibrate(SaturatedSpan("parse", end - 8, end, ((A, 2),), 0, raw * 3, True)) is None
    # a measured span well above the model raises the capacity it reports
    assert model.calibrate(SaturatedSpan("parse", end - 8, end, ((A, 2),), 100, raw * 1.5, False)).factor == pytest.approx(1.5, rel=1e-6)


def test_a_span_is_set_against_the_work_it_finished_not_the_current_workload():
    # long documents (12 pages each) between two runs of short ones; the span saw the long ones finish
    run = simulate(OP, [Phase(A, 2, 300)], [(Regime("short", {"pages": 3.0}), 100), (Regime("long", {"pages": 12.0}), 100),
                                            (Regime("short", {"pages": 3.0}), 100)],
                   anomalies=Anomalies(spike_prob=0.0, burst_prob=0.0), seed=5)
    model = OperatorModel("parse")
    model.fit(run.samples)
    long_ends = [s.end for s in run.samples if s.features["pages"] / s.items_in > 8]
    start, end = long_ends[len(long_ends) // 4], long_ends[3 * len(long_ends) // 4]
    took = _span_prediction(model, run, start, end)
    assert took < 0.6 * model.throughput(A, 2).mean       # the current (short) workload runs far faster
    # it took what the model predicts for the work it finished: nothing to correct in the current workload's figure
    assert model.calibrate(SaturatedSpan("parse", start, end, ((A, 2),), 100, took, False)) is None


def test_a_refit_re_derives_the_factor_and_an_old_span_expires():
    model, end = _fitted()
    raw = model.throughput(A, 2).mean
    model.calibrate(SaturatedSpan("parse", end - 8, end, ((A, 2),), 100, raw / 2, False))
    run = simulate(OP, [Phase(A, 2, 300)], [(Regime("short", {"pages": 3.0}), 600)],
                   anomalies=Anomalies(spike_prob=0.0, burst_prob=0.0), seed=6)
    model.fit(run.samples)    # same workload: the systematic shortfall is kept
    assert model.calibration is not None and model.calibration.factor == pytest.approx(0.5, rel=0.1)
    shifted = [s.__class__(**{**s.__dict__, "start": s.start + 1000, "end": s.end + 1000}) for s in run.samples]
    model.fit(shifted)        # samples far newer than the span: it no longer speaks for the operator
    assert model.calibration is None


def test_a_span_of_another_operator_is_refused():
    model, end = _fitted()
    with pytest.raises(ValueError, match="span of operator 'ocr'"):
        model.calibrate(SaturatedSpan("ocr", end - 8, end, ((A, 2),), 100, 1.0, False))
