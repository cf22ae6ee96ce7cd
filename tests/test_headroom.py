"""The headroom calculation against cases solved by hand."""

from __future__ import annotations

import pytest

from benchmarks.headroom import GiB, Workload, headroom, regime_optimum, with_derived_gpu
from trident_flows.core.types import CPU, GPU
from trident_flows.runtime.costmodel import DeviceCost, OperatorCost, PipelineProfile


def _two_stage(b_on_gpu: bool = False) -> PipelineProfile:
    """Stage a costs 1 CPU-second per unit of feature ``a``, stage b 1 CPU-second per unit of ``b``."""
    a = OperatorCost("a", {CPU: DeviceCost(per_unit_s={"a": 1.0})}, features=("a",))
    b_devices = {CPU: DeviceCost(per_unit_s={"b": 1.0})}
    if b_on_gpu:
        b_devices[GPU] = DeviceCost(per_unit_s={"b": 0.25}, resident_bytes=GiB)
    b = OperatorCost("b", b_devices, features=("b",))
    return PipelineProfile("two", (a, b), workloads={"x": {"a": 1.0, "b": 0.0}, "y": {"a": 0.0, "b": 1.0}})


def test_two_regimes_on_one_pool_double_the_static_duration() -> None:
    # 2 CPUs. Regime x needs only stage a (2 items/s with both CPUs), y only stage b (2 items/s).
    # One static split c / 2-c runs x at c and y at 2-c items/s: N/c + N/(2-c) is least at c=1,
    # i.e. 2N seconds against N for the per-regime optimum: headroom 2.
    w = Workload("pool", _two_stage(), cpus=2, gpus=0, device_memory_bytes=8 * GiB, schedule=(("x", 100), ("y", 100)))
    h = headroom(w, integer=False)
    assert h.per_regime_items_per_s["x"] == pytest.approx(2.0, rel=1e-6)
    assert h.oracle_s == pytest.approx(100.0, rel=1e-6)
    assert h.static_s == pytest.approx(200.0, rel=1e-3)
    assert h.ratio == pytest.approx(2.0, rel=1e-3)


def test_unequal_regimes_follow_the_square_root_rule() -> None:
    # N_x = 400, N_y = 100 on 2 CPUs: minimise 400/c + 100/(2-c) -> c = 2*sqrt(400)/(sqrt(400)+sqrt(100)) = 4/3.
    w = Workload("pool", _two_stage(), cpus=2, gpus=0, device_memory_bytes=8 * GiB, schedule=(("x", 400), ("y", 100)))
    h = headroom(w, integer=False)
    expected_static = 400 / (4 / 3) + 100 / (2 / 3)
    assert h.static_s == pytest.approx(expected_static, rel=1e-3)
    assert h.ratio == pytest.approx(expected_static / 250.0, rel=1e-3)


def test_whole_replicas_leave_less_headroom_than_the_relaxation() -> None:
    # 4 CPUs, every stage keeps a replica: each regime's optimum is 3 items/s (3 CPUs on its stage);
    # the best static split is 2/2 (2 items/s in both): N/2 + N/2 against N/3 + N/3 -> headroom 1.5.
    w = Workload("pool", _two_stage(), cpus=4, gpus=0, device_memory_bytes=8 * GiB, schedule=(("x", 90), ("y", 90)))
    h = headroom(w)
    assert h.per_regime_items_per_s == pytest.approx({"x": 3.0, "y": 3.0})
    assert h.static_items_per_s == pytest.approx({"x": 2.0, "y": 2.0})
    assert h.ratio == pytest.approx(1.5, rel=1e-6)


def test_co_located_gpu_replicas_share_device_time_by_regime() -> None:
    # Both stages can run on one GPU (4 items per device-second each). Two half-GPU replicas hold
    # 2 CPUs; time-slicing gives the device to whichever stage has work, so one static set of
    # replicas reaches each regime's optimum: no headroom left.
    a = OperatorCost("a", {CPU: DeviceCost(per_unit_s={"a": 1.0}), GPU: DeviceCost(per_unit_s={"a": 0.25})}, features=("a",))
    b = OperatorCost("b", {CPU: DeviceCost(per_unit_s={"b": 1.0}), GPU: DeviceCost(per_unit_s={"b": 0.25})}, features=("b",))
    profile = PipelineProfile("two-gpu", (a, b), workloads={"x": {"a": 1.0, "b": 0.0}, "y": {"a": 0.0, "b": 1.0}})
    w = Workload("share", profile, cpus=2, gpus=1, device_memory_bytes=8 * GiB, schedule=(("x", 40), ("y", 40)))
    h = headroom(w)
    assert h.per_regime_items_per_s == pytest.approx({"x": 4.0, "y": 4.0})
    assert h.ratio == pytest.approx(1.0, rel=1e-6)


def test_gpu_work_is_counted_in_device_time_and_holds_a_cpu() -> None:
    # Regime y on 2 CPUs + 1 GPU: stage b on the GPU does 4 items per device-second and its replica
    # holds a CPU, leaving 1 CPU for stage b on CPU (1 item/s): 5 items/s.
    w = Workload("gpu", _two_stage(b_on_gpu=True), cpus=2, gpus=1, device_memory_bytes=8 * GiB, schedule=(("y", 10),))
    assert regime_optimum(w, "y", integer=False)[0] == pytest.approx(5.0, rel=1e-6)
    # With whole replicas stage a keeps one CPU, the GPU replica holds the other: 4 items/s.
    assert regime_optimum(w, "y")[0] == pytest.approx(4.0, rel=1e-6)


def test_a_batch_that_does_not_fit_the_device_is_no_choice() -> None:
    w = Workload("small-gpu", _two_stage(b_on_gpu=True), cpus=2, gpus=1, device_memory_bytes=GiB // 2, schedule=(("y", 10),))
    # resident 1 GiB > 0.5 GiB: only CPUs serve stage b (both when relaxed, one beside stage a's replica when whole)
    assert regime_optimum(w, "y", integer=False)[0] == pytest.approx(2.0, rel=1e-6)
    assert regime_optimum(w, "y")[0] == pytest.approx(1.0, rel=1e-6)


def test_derived_gpu_cost_is_labelled_and_scaled() -> None:
    derived = with_derived_gpu(_two_stage(), "a", 10.0)
    gpu = derived.operator("a").device(GPU)
    assert gpu.per_unit_s["a"] == pytest.approx(0.1)
    assert "DERIVED" in derived.operator("a").notes


def test_unknown_regime_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown regime.*\['x', 'y'\]"):
        Workload("bad", _two_stage(), cpus=2, gpus=0, device_memory_bytes=GiB, schedule=(("z", 1),))
