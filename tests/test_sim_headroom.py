"""The headroom replayed in the simulator, against a case solved by hand."""

from __future__ import annotations

import pytest

from benchmarks.closed_loop_workload import Workload as Stream
from benchmarks.headroom import GiB, Workload
from benchmarks.sim_headroom import simulated_headroom
from trident_flows.core.types import CPU, ClusterSpec
from trident_flows.runtime.costmodel import DeviceCost, OperatorCost, PipelineProfile


def test_whole_replicas_on_two_regimes_give_the_hand_computed_headroom_when_measured() -> None:
    # 4 CPUs, each stage keeps a replica. Regime x costs 0.1 s per item at stage a only, y at stage b only:
    # each regime's optimum puts 3 replicas on its stage (30 items/s), the best static splits 2/2
    # (20 items/s on both): headroom 1.5, measured here in the simulator rather than taken from the model.
    a = OperatorCost("a", {CPU: DeviceCost(per_unit_s={"a": 0.1})}, features=("a",))
    b = OperatorCost("b", {CPU: DeviceCost(per_unit_s={"b": 0.1})}, features=("b",))
    profile = PipelineProfile("two", (a, b), workloads={"x": {"a": 1.0, "b": 0.0}, "y": {"a": 0.0, "b": 1.0}})
    workload = Workload("pool", profile, cpus=4, gpus=0, device_memory_bytes=8 * GiB, schedule=(("x", 300), ("y", 300)))
    h = simulated_headroom(workload, Stream("t", "x:300,y:300", seed=1, time_scale=1.0), ClusterSpec.single_node(4, 0), max_evals=20)
    assert h.ratio == pytest.approx(1.5, rel=0.05)
    assert h.per_regime_allocation["x"].startswith("a 3x") and "b 3x" in h.per_regime_allocation["y"]
    assert "a 2x" in h.static_allocation and "b 2x" in h.static_allocation
    assert h.per_regime_items_per_s["x"] == pytest.approx(1.5 * h.static_items_per_s["x"], rel=0.05)
    assert h.evals > 4  # the model's answers were measured, and the climb measured their neighbours
