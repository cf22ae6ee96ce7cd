"""The closed-loop benchmark's pieces: the static-config search, item accounting, the oracle,
memory spikes in the emulated workload, and one tiny end-to-end round of the harness."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest

from benchmarks.closed_loop_runs import RunRecord, run_matrix
from benchmarks.closed_loop_workload import Tuning, Workload, tune
from benchmarks.lineage import items_lost
from benchmarks.oracle_policy import OraclePolicy
from trident_flows.core.decision import Decision
from trident_flows.core.types import OpConfig, ReplicaGroup
from trident_flows.pipelines.emulated import MEMORY_SCALE, EmulatedOperator, synthetic_rows
from trident_flows.runtime.costmodel import DeviceCost, OperatorCost, PipelineProfile
from trident_flows.sim.static_search import StaticConfig, predict_throughput, search_static

MIB = 2**20


def _tiny_profile() -> PipelineProfile:
    """a (cheap, CPU) -> b (heavy; 5x faster on the GPU, batch-size overhead, memory per item) -> c (filter input)."""
    return PipelineProfile("tiny", (
        OperatorCost("a", {"cpu": DeviceCost(per_batch_s=0.01, per_unit_s={"x": 0.02})}, selectivity=0.5, features=("x",)),
        OperatorCost("b", {"cpu": DeviceCost(per_item_s=0.5), "gpu": DeviceCost(per_batch_s=0.2, per_item_s=0.1, resident_bytes=100 * MIB,
                                                                               per_item_bytes=10 * MIB)}),
        OperatorCost("c", {"cpu": DeviceCost(per_item_s=0.03)}),
    ), workloads={"w": {"x": 2.0}})


def _brute_force(profile, features, cpus, gpus, memory, batches, cpu_batch):
    best = 0.0
    b_options = [("cpu", cpu_batch, g) for g in (0,)] + [("gpu", b, g) for b in batches for g in range(1, gpus + 1)
                                                          if 100 * MIB + b * 10 * MIB <= memory]
    for device, batch, g in b_options:
        for ra, rb, rc in itertools.product(range(1, cpus + 1), repeat=3):
            cpu_b = 0 if device == "gpu" else rb
            used = ra + rc + cpu_b + (g if device == "gpu" else 0)
            if used > cpus:
                continue
            b_conf = (OpConfig.make("gpu", batch_size=batch), g) if device == "gpu" else (OpConfig.make("cpu", batch_size=cpu_batch), rb)
            assignment = {"a": (OpConfig.make("cpu", batch_size=cpu_batch), ra), "b": b_conf, "c": (OpConfig.make("cpu", batch_size=cpu_batch), rc)}
            best = max(best, predict_throughput(profile, assignment, features))
    return best


@pytest.mark.parametrize("cpus,gpus,memory", [(6, 1, 1024 * MIB), (8, 2, 300 * MIB), (5, 0, 1024 * MIB)])
def test_search_returns_the_configuration_with_the_best_predicted_throughput(cpus, gpus, memory):
    profile = _tiny_profile()
    features = {"x": 2.0}
    batches = (4, 16, 64)
    found = search_static(profile, features, cpus=cpus, gpus=gpus, device_memory_bytes=memory, gpu_batches=batches, cpu_batch=4)
    assert found.predicted_items_per_s == pytest.approx(_brute_force(profile, features, cpus, gpus, memory, batches, 4))
    assert found.predicted_items_per_s == pytest.approx(predict_throughput(profile, found.as_dict(), features))
    used_cpus = sum(c.cpus * r for _, c, r in found.assignment)
    used_gpus = sum(c.gpus * r for _, c, r in found.assignment)
    assert used_cpus <= cpus and used_gpus <= gpus
    for _name, config, _ in found.assignment:
        if config.device == "gpu":  # never a batch whose predicted peak exceeds the device
            assert 100 * MIB + config.batch_size * 10 * MIB <= memory


def test_search_prefers_the_gpu_and_the_largest_batch_that_fits():
    found = search_static(_tiny_profile(), {"x": 2.0}, cpus=6, gpus=1, device_memory_bytes=300 * MIB, gpu_batches=(4, 16, 64))
    b = found.as_dict()["b"]
    assert b[0].device == "gpu" and b[0].batch_size == 16 and b[1] == 1  # 64 would need 740 MiB


def test_search_refuses_a_cluster_too_small_for_one_replica_each():
    with pytest.raises(ValueError, match="no static configuration"):
        search_static(_tiny_profile(), {"x": 2.0}, cpus=2, gpus=0, device_memory_bytes=MIB)


def test_items_lost_names_an_id_that_is_neither_written_nor_dead_lettered():
    inputs = [f"item-{k}" for k in range(6)]
    written = ["item-0", "item-1", "item-3", "item-5"]
    dead = ["item-4"]
    assert items_lost(inputs, written, dead) == ["item-2"]
    assert items_lost(inputs, written + ["item-2"], dead) == []
    assert items_lost(inputs, inputs, []) == []


def test_memory_spikes_scale_bytes_of_the_marked_items_only():
    rows = list(synthetic_rows({"w": {"x": 3.0}}, 10, "w:10", seed=2, memory_spikes=((4, 3, 5.0),)))
    assert [r[MEMORY_SCALE] for r in rows] == [1.0] * 4 + [5.0] * 3 + [1.0] * 3
    plain = list(synthetic_rows({"w": {"x": 3.0}}, 10, "w:10", seed=2))
    assert [r["x"] for r in rows] == [r["x"] for r in plain] and MEMORY_SCALE not in plain[0]
    op = EmulatedOperator(OpConfig.make("cpu", batch_size=4), name="b", time_scale=0.0,
                          cost={"devices": {"cpu": {"per_item_bytes": 1000, "per_unit_bytes": {"x": 10.0}}}, "features": ["x"]})
    batch = {k: np.array([r[k] for r in rows[3:6]]) for k in ("id", "x", MEMORY_SCALE)}
    expected = sum(r[MEMORY_SCALE] * (1000 + 10.0 * r["x"]) for r in rows[3:6])
    assert op._work_bytes(batch, np.ones(3, dtype=bool), 3, {"x": float(batch["x"].sum())}) == int(expected)


def _state(counts, configs, wall_s=0.0, cold_start_s=0.0):
    """A runner state at ``wall_s``: ``counts`` maps an operator to (items taken, rows forwarded); each replica took
    ``cold_start_s`` to start."""
    ops = [SimpleNamespace(name=n, items_in=counts[n][0], items_forwarded=counts[n][1], configs=lambda c=c: dict(c),
                           replicas=tuple(SimpleNamespace(cold_start_s=cold_start_s) for _ in range(sum(c.values()))))
           for n, c in configs.items()]
    return SimpleNamespace(operators=ops, operator=lambda name: next(o for o in ops if o.name == name), wall_s=wall_s)


def test_oracle_switches_each_operator_when_the_new_block_reaches_it():
    cpu4, gpu8 = OpConfig.make("cpu", batch_size=4), OpConfig.make("gpu", batch_size=8)
    first = StaticConfig((("a", cpu4, 3), ("b", gpu8, 1)), 10.0)
    second = StaticConfig((("a", cpu4, 1), ("b", gpu8, 2)), 5.0)
    oracle = OraclePolicy([("short", 0, 100), ("scans", 100, 150)], {"short": first, "scans": second}, cpus=8, gpus=2)
    running = {"a": {cpu4: 3}, "b": {gpu8: 1}}
    assert oracle.decide(_state({"a": (50, 50), "b": (40, 0)}, running), []) == Decision.no_change()
    # the head is in the scans block, b has taken 60 of the 120 rows a passed on: b is still at item ~60
    plan = oracle.decide(_state({"a": (120, 120), "b": (60, 0)}, running), []).plan
    assert plan is not None and [o.operator for o in plan.operators] == ["a"] and plan.for_operator("a").replicas == 1
    assert "scans" in plan.reason
    # once b's input is in the scans block too, b gets its second replica
    plan = oracle.decide(_state({"a": (130, 130), "b": (110, 0)}, {"a": {cpu4: 1}, "b": {gpu8: 1}}), []).plan
    assert plan is not None and [o.operator for o in plan.operators] == ["b"] and plan.for_operator("b").replicas == 2
    assert oracle.decide(_state({"a": (130, 130), "b": (110, 0)}, {"a": {cpu4: 1}, "b": {gpu8: 2}}), []) == Decision.no_change()


def test_oracle_switches_an_operator_ahead_of_its_block_by_its_cold_start():
    cpu4, gpu8 = OpConfig.make("cpu", batch_size=4), OpConfig.make("gpu", batch_size=8)
    first = StaticConfig((("a", cpu4, 1), ("b", gpu8, 1)), 10.0)
    second = StaticConfig((("a", cpu4, 1), ("b", gpu8, 2)), 5.0)
    oracle = OraclePolicy([("short", 0, 100), ("scans", 100, 150)], {"short": first, "scans": second}, cpus=8, gpus=2, tick_s=1.0)
    running = {"a": {cpu4: 1}, "b": {gpu8: 1}}
    # b is 40 items short of the block and its rate is not known yet: it stays
    assert oracle.decide(_state({"a": (120, 120), "b": (60, 0)}, running, wall_s=0.0, cold_start_s=4.0), []) == Decision.no_change()
    # 10 items/s: the block is 3 s away, within its 4 s cold start + 1 tick: b grows now, before the block reaches it
    plan = oracle.decide(_state({"a": (130, 130), "b": (70, 0)}, running, wall_s=1.0, cold_start_s=4.0), []).plan
    assert plan is not None and plan.for_operator("b").replicas == 2
    # with a cold start of 1 s, 3 s away is too early
    oracle = OraclePolicy([("short", 0, 100), ("scans", 100, 150)], {"short": first, "scans": second}, cpus=8, gpus=2, tick_s=1.0)
    oracle.decide(_state({"a": (120, 120), "b": (60, 0)}, running, wall_s=0.0, cold_start_s=1.0), [])
    assert oracle.decide(_state({"a": (130, 130), "b": (70, 0)}, running, wall_s=1.0, cold_start_s=1.0), []) == Decision.no_change()


def test_oracle_grows_an_operator_as_far_as_it_fits_beside_the_others_and_the_rest_later():
    cpu4, cpu2 = OpConfig.make("cpu", batch_size=4), OpConfig.make("cpu", batch_size=2)
    first = StaticConfig((("a", cpu4, 2), ("b", cpu4, 6)), 10.0)
    second = StaticConfig((("a", cpu4, 6), ("b", cpu4, 2)), 5.0)
    oracle = OraclePolicy([("x", 0, 10), ("y", 10, 20)], {"x": first, "y": second}, cpus=8, gpus=0)
    running = {"a": {cpu4: 2}, "b": {cpu4: 6}}
    # a is in block y and wants 6 replicas, but b (still in x) holds 6 of the 8 CPUs: nothing free, nothing changes yet
    assert oracle.decide(_state({"a": (12, 12), "b": (8, 0)}, running), []).plan is None
    # b reaches y too: both switch, together they fit
    plan = oracle.decide(_state({"a": (14, 14), "b": (12, 0)}, running), []).plan
    assert plan is not None and {o.operator: o.replicas for o in plan.operators} == {"a": 6, "b": 2}
    # on 10 CPUs a takes the 2 free ones now, in its new configuration, and never waits on b for all of it
    third = StaticConfig((("a", cpu2, 6), ("b", cpu4, 2)), 5.0)
    oracle = OraclePolicy([("x", 0, 10), ("y", 10, 20)], {"x": first, "y": third}, cpus=10, gpus=0)
    plan = oracle.decide(_state({"a": (12, 12), "b": (8, 0)}, running), []).plan
    assert plan is not None and [(o.operator, o.groups) for o in plan.operators] == [("a", (ReplicaGroup(cpu2, 4),))]
    plan = oracle.decide(_state({"a": (14, 14), "b": (12, 0)}, {"a": {cpu2: 4}, "b": {cpu4: 6}}), []).plan
    assert plan is not None and {o.operator: o.replicas for o in plan.operators} == {"a": 6, "b": 2}


def test_tuning_on_the_documents_profile_gives_static_large_a_bigger_embed_batch():
    profile = PipelineProfile.load("documents")
    tuning = tune(profile, Workload("regimes", "short:200,long:20,scans:15,short:200", seed=3, time_scale=0.1))
    avg, large = tuning.static_avg.as_dict(), tuning.static_large.as_dict()
    assert large["embed"][0].batch_size > avg["embed"][0].batch_size
    assert {n: r for n, (_, r) in avg.items()} == {n: r for n, (_, r) in large.items()}
    assert set(tuning.per_regime) == {"short", "long", "scans"}
    assert sum(c.cpus * r for _, c, r in tuning.static_avg.assignment) <= 16


def test_one_tiny_round_of_two_policies_loses_no_item(ray_cluster, tmp_path):
    profile = PipelineProfile.load("documents")
    workload = Workload("regimes", "short:60,scans:6,short:60", seed=5, time_scale=0.05)
    tuning: Tuning = tune(profile, workload, cpus=8, gpus=2)
    records: list[RunRecord] = run_matrix(profile, workload, tuning, ("static-avg", "ds2"), 1, tmp_path)
    assert [r.system for r in records] == ["static-avg", "ds2"]
    for r in records:
        assert r.error == "", r.error
        assert r.items_lost == 0 and r.items_per_s and r.items_per_s > 0 and r.ooms == 0
        assert r.timeline[-1][1] == workload.items


def test_a_run_record_thins_its_poll_series_for_the_results_file_without_changing_what_they_show():
    from benchmarks.closed_loop_runs import RunRecord

    polls = [(round(0.2 * k, 3), k // 3) for k in range(50)]  # 10 s of 0.2 s polls
    record = RunRecord("trident", "regimes", 0, 50, timeline=list(polls), tail=list(polls),
                       replicas={"ocr": [(t, 1 if t < 4 else 3) for t, _ in polls]})
    data = record.to_dict()
    assert len(data["timeline"]) == 10 and data["timeline"][-1] == polls[-1]
    assert all(dict(polls)[t] == n for t, n in data["timeline"])  # every kept point is a real poll
    assert data["replicas"]["ocr"] == [(0.0, 1), (4.0, 3), (9.8, 3)]  # the step plot's change points and end
    assert record.timeline == polls  # the record itself keeps every poll
