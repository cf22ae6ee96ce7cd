"""A capacity curve (every replica count up to the cluster's thousands) is predicted once per distinct
input: each count's prediction is exactly what asking for that count alone gives."""

from __future__ import annotations

from benchmarks.sample_sim import Phase, Regime, SimOperator, simulate
from trident_flows.core.types import OpConfig
from trident_flows.runtime.costmodel import DeviceCost
from trident_flows.scheduler.operator_model import OperatorModel
from trident_flows.scheduler.placement.inputs import concave_curve


def _fitted_ocr_model() -> OperatorModel:
    """An OCR model fitted on 2 and then 5 replicas of batches of 16 and 32 (simulated samples)."""
    op = SimOperator("ocr", {"cpu": DeviceCost(per_batch_s=0.02, per_item_s=0.004, per_unit_s={"pages": 0.01})}, contention=0.05)
    run = simulate(op, [Phase(OpConfig.make(batch_size=16), 2, 400), Phase(OpConfig.make(batch_size=32), 5, 400)],
                   [(Regime("normal", {"pages": 5.0}), 800)], seed=3)
    model = OperatorModel("ocr")
    model.fit(run.samples)
    return model


def test_a_capacity_curve_of_thousands_of_counts_predicts_each_count_as_asking_for_it_alone() -> None:
    model = _fitted_ocr_model()
    config, counts = OpConfig.make(batch_size=32), list(range(1, 4097))
    mean, std = model.predict_many([config] * len(counts), counts)
    for r in (1, 2, 3, 5, 6, 64, 4096):
        alone = model.predict_many([config], [r])
        assert (mean[r - 1], std[r - 1]) == (alone[0][0], alone[1][0])
    # beyond the counts seen the per-replica rate is flat: throughput grows in proportion
    assert abs(mean[4095] / 4096 - mean[4] / 5) < 1e-9 * mean[4]


def test_configs_mixed_in_one_call_are_each_predicted_as_asked_alone() -> None:
    """Equal configs built apart, and different configs interleaved, each get their own prediction."""
    model = _fitted_ocr_model()
    asked = [(OpConfig.make(batch_size=32), 3), (OpConfig.make(batch_size=16), 3), (OpConfig.make(batch_size=32), 3), (OpConfig.make(batch_size=16), 9)]
    mean, std = model.predict_many([c for c, _ in asked], [r for _, r in asked])
    for k, (config, r) in enumerate(asked):
        alone = model.predict_many([config], [r])
        assert (mean[k], std[k]) == (alone[0][0], alone[1][0])
    assert mean[0] != mean[1]


def test_a_replica_that_adds_nothing_ends_the_curves_gains() -> None:
    """The placement's curve never promises more from more replicas once one added nothing: a higher
    prediction further out is not trusted (gains never grow), and the breakpoints say so."""
    assert concave_curve([10.0, 15.0, 14.0, 30.0, 40.0]) == ((1, 10.0), (2, 15.0), (4, 15.0), (5, 15.0))
    assert concave_curve([10.0, 18.0, 24.0, 28.0, 30.0]) == ((1, 10.0), (2, 18.0), (4, 28.0), (5, 30.0))
