"""The Trident controller: pure ticks on a simulated runner (no Ray), and closed loops on the real runtime.

The simulated runner (``SimRunner``) is a test fixture: operators whose per-item cost follows a
regime schedule of workload features, batches reported as ``BatchSample``s, and plans applied at
once. It lets the decision logic be checked tick by tick, deterministically, in milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np
import pytest
from builders import batch_sample, operator_state, replica_state, runner_state

from trident_flows.core.decision import Action, Decision, Hold, HoldKind
from trident_flows.core.state import RunnerState
from trident_flows.core.types import BatchSample, ClusterSpec, OpConfig, OperatorPlan, Plan, PlanKind, ReplicaGroup
from trident_flows.scheduler.decision_log import DecisionLog, EventKind
from trident_flows.scheduler.operator_model import OperatorModel
from trident_flows.scheduler.placement.milp import PlacementError, solve_placement
from trident_flows.scheduler.policies import make_policy
from trident_flows.scheduler.trident_policy import TridentPolicy
from trident_flows.scheduler.trident_settings import TridentSettings

MIB = 2**20
B8 = OpConfig.make("cpu", batch_size=8)


@dataclass
class SimOp:
    """One simulated operator: seconds per item = ``per_item * feature`` (+ ``per_batch`` per batch)."""

    name: str
    feature: str
    per_item: float
    per_batch: float = 0.005
    contention: Callable[[int], float] = lambda n: 1.0  # noqa: E731 - rate factor with n replicas
    replicas: list = field(default_factory=list)       # [replica_id, config, canary]
    epoch: int = 0
    items_in: float = 0.0


class SimRunner:
    """A deterministic stand-in for the runner (see the module docstring)."""

    def __init__(self, ops: list[SimOp], schedule: list[tuple[float, dict[str, float]]], cpus: float = 8, replicas: int = 2,
                 seed: int = 0) -> None:
        self.ops = ops
        self.schedule = schedule
        self.cpus = cpus
        self.t = 0.0
        self.rng = np.random.default_rng(seed)
        self.ids = 0
        for op in ops:
            for _ in range(replicas):
                op.replicas.append([self._id(op), B8, False])
        self.samples: list[BatchSample] = []
        self.applied: list[Plan] = []

    def _id(self, op: SimOp) -> str:
        self.ids += 1
        return f"{op.name}-{self.ids}"

    def features(self) -> dict[str, float]:
        for until, feats in self.schedule:
            if self.t < until:
                return feats
        return self.schedule[-1][1]

    def busy(self, op: SimOp, config: OpConfig) -> float:
        n = sum(1 for r in op.replicas if not r[2])
        return (op.per_batch + config.batch_size * op.per_item * self.features()[op.feature]) / op.contention(n)

    def advance(self, dt: float) -> list[BatchSample]:
        caps = {op.name: sum(r[1].batch_size / self.busy(op, r[1]) for r in op.replicas) for op in self.ops}
        rate = min(caps.values())
        new = []
        for op in self.ops:
            op.items_in += rate * dt
            for rid, config, _canary in op.replicas:
                share = (config.batch_size / self.busy(op, config)) / caps[op.name]
                batches = max(1, int(round(rate * dt * share / config.batch_size)))
                for k in range(batches):
                    busy = self.busy(op, config) * float(self.rng.uniform(0.97, 1.03))
                    end = self.t + dt * (k + 1) / batches
                    feats = {op.feature: self.features()[op.feature] * config.batch_size}
                    new.append(batch_sample(operator=op.name, replica_id=rid, config=config, start=end - busy, end=end, busy_s=busy,
                                            items_in=config.batch_size, features=feats,
                                            peak_host_mem_bytes=int(200 * MIB + config.batch_size * MIB), config_epoch=op.epoch))
        self.t += dt
        self.samples += new
        return new

    def state(self) -> RunnerState:
        ops = tuple(operator_state(name=op.name, replicas=tuple(replica_state(replica_id=rid, config=c, canary=canary, inflight=1, busy_fraction=0.9,
                                                                              batches=10, config_epoch=op.epoch)
                                                                for rid, c, canary in op.replicas),
                                   items_in=int(op.items_in), items_out=int(op.items_in), config_epoch=op.epoch, busy_fraction=0.9,
                                   items_forwarded=int(op.items_in) if k < len(self.ops) - 1 else 0)
                    for k, op in enumerate(self.ops))
        done = int(self.ops[-1].items_in)
        return runner_state(pipeline="sim", operators=ops, items_in=int(self.ops[0].items_in), items_written=done, rows_written=done, wall_s=self.t,
                            throughput=done / max(self.t, 1e-9), cluster_cpus=self.cpus, reconfigurations=len(self.applied))

    def apply(self, plan: Plan) -> None:
        self.applied.append(plan)
        for o in plan.operators:
            op = next(x for x in self.ops if x.name == o.operator)
            before = sorted((c.label(), canary) for _, c, canary in op.replicas)
            keep = [r for r in op.replicas if r[2] and r[1] == o.canary]
            serving = [r for r in op.replicas if not r[2]]
            new = []
            for g in o.groups:
                have = [r for r in serving if r[1] == g.config and r not in new]
                new += have[: g.replicas] + [[self._id(op), g.config, False] for _ in range(max(0, g.replicas - len(have)))]
            if o.canary is not None and not keep:
                keep = [[self._id(op), o.canary, True]]
            op.replicas = new + keep
            if sorted((c.label(), canary) for _, c, canary in op.replicas) != before:
                op.epoch += 1

    def replicas(self, name: str) -> int:
        return sum(1 for r in next(x for x in self.ops if x.name == name).replicas if not r[2])


def run_ticks(runner: SimRunner, policy: TridentPolicy, ticks: int, dt: float = 2.0) -> list:
    records = []
    for _ in range(ticks):
        new = runner.advance(dt)
        record = policy.tick(runner.state(), new)
        records.append(record)
        if record.decision.plan is not None:
            runner.apply(record.decision.plan)
    return records


def two_ops(**kw) -> list[SimOp]:
    return [SimOp("a", "x", 0.01, **kw.get("a", {})), SimOp("b", "y", 0.01, **kw.get("b", {}))]


CLUSTER8 = ClusterSpec.single_node(8, 0)
# A steady workload (one regime for the whole run): these tests give trident the prior that its first
# regime lasts a minute, so a move seconds into the run can pay; without it (the default) it waits.
STEADY = 60.0


# ------------------------------------------------------------------ pure ticks
def test_trident_moves_replicas_to_the_new_bottleneck_within_a_few_ticks():
    runner = SimRunner(two_ops(), [(24.0, {"x": 4.0, "y": 1.0}), (1e9, {"x": 1.0, "y": 4.0})])
    policy = TridentPolicy(None, CLUSTER8, TridentSettings.from_options(canaries=False))
    first = run_ticks(runner, policy, 12)
    assert runner.replicas("a") > runner.replicas("b"), [r.decision.reason for r in first if r.decision.plan]
    rollouts = [r for r in first if r.decision.action == Action.ROLL_OUT]
    assert rollouts and rollouts[0].decision.rationale.bottlenecks == ("a",), rollouts[0].decision
    assert all(set(r.timings_ms) >= {"observe", "regime", "optimize", "total"} for r in first)
    second = run_ticks(runner, policy, 12)
    assert runner.replicas("b") > runner.replicas("a"), [(r.decision.action, r.decision.reason) for r in second]
    moved = next(k for k, r in enumerate(second) if r.decision.action == Action.ROLL_OUT and any(o.operator == "b" for o in r.decision.plan.operators))
    assert moved <= 6
    assert any(e.kind in (EventKind.REGIME_CHANGE, EventKind.RESIDUAL_CHANGE) for r in second for e in r.events)
    assert runner.state().throughput > 0


def test_trident_rolls_back_a_plan_that_measures_worse_than_before():
    # b is the bottleneck, but more than two replicas of b contend: the model cannot know that before trying.
    contention = lambda n: 1.0 if n <= 2 else (2.0 / n) ** 2  # noqa: E731
    runner = SimRunner(two_ops(b={"contention": contention}), [(1e9, {"x": 1.0, "y": 4.0})])
    policy = TridentPolicy(None, CLUSTER8, TridentSettings.from_options(canaries=False, verify_ticks=2))
    records = run_ticks(runner, policy, 14)
    actions = [r.decision.action for r in records]
    assert Action.ROLL_OUT in actions and Action.ROLLBACK in actions, [(r.decision.action, r.decision.reason, r.verification) for r in records]
    rollback = records[actions.index(Action.ROLLBACK)]
    measured = rollback.decision.rationale
    assert measured.kind == PlanKind.ROLLBACK and measured.measured_after < measured.measured_before, rollback.decision
    assert rollback.decision.plan.for_operator("b").replicas == 2
    assert runner.replicas("b") <= 3  # it did not keep a placement that measured worse


def test_a_failed_tick_keeps_the_plan_logs_and_the_next_tick_recovers(tmp_path):
    calls = []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise PlacementError("injected solver failure")
        return solve_placement(*args, **kwargs)

    runner = SimRunner(two_ops(), [(1e9, {"x": 4.0, "y": 1.0})])
    # regime plans off: they share the solver, and the failure is injected into the placement's solve
    policy = TridentPolicy(None, CLUSTER8, TridentSettings.from_options(canaries=False, regime_duration_s=STEADY, regime_plans=False), solve=flaky)
    waiting = policy.tick(runner.state(), [])
    assert waiting.decision == Decision.no_change(waiting.decision.reason, Hold(HoldKind.WAITING_FOR_SAMPLES))
    records = run_ticks(runner, policy, 4)
    failed = next(r for r in records if r.error)
    assert failed.decision.action == Action.ERROR and failed.decision.hold == Hold(HoldKind.STEP_FAILED) and failed.decision.plan is None
    assert "injected solver failure" in failed.error
    assert any(r.decision.action == Action.ROLL_OUT for r in records[records.index(failed) + 1:])
    log = DecisionLog(tmp_path / "d.jsonl")
    for r in records:
        log.write(r)
    lines = log.read()
    assert [line["action"] for line in lines] == [r.decision.action for r in records] and lines[0]["timings_ms"]["total"] > 0


def test_trident_is_a_registered_policy_whose_decision_is_its_tick_records():
    policy = make_policy("trident", spec=None, cluster=CLUSTER8, canaries=False, regime_duration_s=STEADY)
    runner = SimRunner(two_ops(), [(1e9, {"x": 4.0, "y": 1.0})])
    decision = None
    for _ in range(6):
        decision = policy.decide(runner.state(), runner.advance(2.0))
        if decision.plan is not None:
            runner.apply(decision.plan)
            break
    assert decision is not None and decision.action == Action.ROLL_OUT and decision.rationale.kind == PlanKind.THROUGHPUT
    assert policy.last_record.decision is decision and policy.last_record.to_dict()["action"] == "roll_out"


# ------------------------------------------------------------------ closed loops on the real runtime
def _two_stage_profile():
    from trident_flows.runtime.costmodel import DeviceCost, OperatorCost, PipelineProfile

    return PipelineProfile(
        name="ctl-test",
        operators=(OperatorCost("a", {"cpu": DeviceCost(per_batch_s=0.002, per_unit_s={"x": 0.012})}, features=("x",)),
                   OperatorCost("b", {"cpu": DeviceCost(per_batch_s=0.002, per_unit_s={"y": 0.012})}, features=("y",))),
        workloads={"a_heavy": {"x": 4.0, "y": 0.5}, "b_heavy": {"x": 0.5, "y": 4.0}},
    )


# `make test-slow`: a closed loop of ~45 s on the Ray cluster, judged by how early replicas move (benchmark-like: bench
# closed-loop measures it). `make test` keeps the same decisions on the simulated runner (the pure-tick tests above and
# test_closed_loop_mechanics.py), the trident policy ticking a real runner to its end (test_prefect_sidecar.py's long
# run) and the loop's calls to a real runner (test_control_launch.py, test_control_loop.py).
@pytest.mark.slow
def test_closed_loop_follows_the_moving_bottleneck_and_loses_no_item(ray_cluster, tmp_path):
    import time

    import ray
    from test_runtime_support import assert_exactly_once

    from trident_flows.control.launch import start_runner
    from trident_flows.control.loop import RayRunner
    from trident_flows.loop.clock import WallClock
    from trident_flows.loop.tick_loop import TickLoop
    from trident_flows.pipelines.emulated import Stage, emulated_pipeline

    stages = [Stage("a", B8, 2), Stage("b", B8, 2)]
    # b_heavy is long enough that moving replicas to b pays for their cold starts on a loaded machine
    # too (a replica took 5-25 s to start beside other work; with 900 items the policy rightly waited)
    spec = emulated_pipeline(_two_stage_profile(), stages, name="ctl-move", items=3600, regimes="a_heavy:600,b_heavy:3000")
    handle = start_runner(spec, tmp_path / "out", name="ctl-move-runner")
    policy = make_policy("trident", spec=spec, cluster=ClusterSpec.single_node(8, 0), verify_ticks=2, min_samples=12,
                         min_config_samples=6)  # a short run: b finishes few batches per regime
    loop = TickLoop(RayRunner(handle, timeout_s=120.0), policy, WallClock(0.7), decision_log=tmp_path / "d.jsonl")
    written: list[int] = []  # items past b after each tick the policy decided: how much of the b_heavy regime was left
    try:
        deadline = time.time() + 300
        while time.time() < deadline:
            tick = loop.tick()
            if tick.finished:
                break
            if tick.decision is not None:
                written.append(ray.get(handle.state.remote()).items_written)
            time.sleep(0.7)
        final = ray.get(handle.state.remote())
    finally:
        ray.get(handle.stop.remote())
        ray.kill(handle)
    records = list(policy.records)
    assert len(records) == len(written) and loop.loop_state.errors == 0
    assert final.finished and final.error == ""
    assert_exactly_once(spec, tmp_path / "out")
    changed = [k for k, r in enumerate(records) if any(e.operator == "b" and e.kind in (EventKind.REGIME_CHANGE, EventKind.RESIDUAL_CHANGE) for e in r.events)]
    assert changed, "the regime change of b was not detected"
    timeline = "\n".join(f"{r.tick} written={n} {r.decision.action.value} {[e.kind.value + ':' + e.operator for e in r.events]} {r.decision.reason[:140]}"
                         for r, n in zip(records, written))
    to_b = [k for k, r in enumerate(records) if k >= changed[0] and r.decision.action == Action.ROLL_OUT
            and any(o.operator == "b" and o.replicas > 2 for o in r.decision.plan.operators)]
    # replicas move to b while at least 40% of the b_heavy regime (3000 items) is still ahead of it: counted in
    # items, not ticks, since on a loaded machine each tick sees fewer of b's batches and the evidence takes more ticks
    assert to_b and written[to_b[0]] <= 3600 - 1200, timeline
    assert sum(final.operator("b").configs().values()) > sum(final.operator("a").configs().values()), timeline
    lines = DecisionLog(tmp_path / "d.jsonl").read()  # one line per plan handed to the runner, with its apply report
    assert len(lines) == sum(1 for r in records if r.decision.plan is not None) == loop.loop_state.decisions
    assert lines and all("apply" in line and "outcome" in line and line["detail"]["plan"] is not None for line in lines)


def _spike_profile():
    from trident_flows.runtime.costmodel import DeviceCost, OperatorCost, PipelineProfile

    return PipelineProfile(
        name="ctl-spike",
        operators=(OperatorCost("prep", {"cpu": DeviceCost(per_batch_s=0.002, per_item_s=0.004)}),
                   OperatorCost("embed", {"gpu": DeviceCost(per_batch_s=0.01, per_item_s=0.02, resident_bytes=100 * MIB,
                                                            per_unit_bytes={"pixels": MIB})}, features=("pixels",))),
        workloads={"normal": {"pixels": 4.0}, "spike": {"pixels": 20.0}},
    )


# `make test-slow`: two runs of ~20 s on the Ray cluster comparing two policies (benchmark-like: bench closed-loop's
# memory-spike workload measures it). `make test` keeps an OOM retried smaller and dead-lettered
# (test_runtime_stream.py) and trident's memory decisions (test_closed_loop_mechanics.py's out-of-memory tests).
@pytest.mark.slow
def test_memory_spike_trident_stays_within_memory_while_a_static_large_batch_ooms(ray_cluster, tmp_path):
    from test_runtime_support import assert_exactly_once

    from trident_flows.control.launch import run_pipeline
    from trident_flows.core.state import RunnerSettings
    from trident_flows.pipelines.emulated import Stage, emulated_pipeline
    from trident_flows.scheduler.policies import StaticPolicy

    settings = RunnerSettings(device_memory_bytes=2**30)
    regimes = "normal:100,spike:400,normal:200"

    def spec(batch: int):
        stages = [Stage("prep", OpConfig.make("cpu", batch_size=8), 2), Stage("embed", OpConfig.make("gpu", batch_size=batch), 1, max_replicas=1)]
        return emulated_pipeline(_spike_profile(), stages, name="ctl-spike", items=700, regimes=regimes)

    static_spec = spec(64)
    static = run_pipeline(static_spec, tmp_path / "static", settings=settings, policy=StaticPolicy(), tick_s=0.5)
    assert static.ooms > 0 and static.items_missing == 0
    assert_exactly_once(static_spec, tmp_path / "static")

    trident_spec = spec(16)
    policy = TridentPolicy(trident_spec, ClusterSpec.single_node(8, 2, gpu_memory_bytes=2**30))
    summary = run_pipeline(trident_spec, tmp_path / "trident", settings=settings, policy=policy, tick_s=0.5)
    # embed may not scale out (max_replicas=1), so the second GPU is free for canaries of other embed configs
    assert summary.ooms == 0 and summary.items_missing == 0 and summary.duplicate_ids == 0
    assert_exactly_once(trident_spec, tmp_path / "trident")
    assert any(r.decision.plan is not None for r in policy.records)


def test_max_changes_caps_the_operators_one_plan_changes():
    # 10 CPUs, 6 in use: the bottleneck can grow without another operator shrinking first (a limited plan
    # that only shrinks would gain nothing and is not issued)
    runner = SimRunner(two_ops() + [SimOp("c", "x", 0.002)], [(1e9, {"x": 4.0, "y": 1.0})], cpus=10)
    policy = TridentPolicy(None, ClusterSpec.single_node(10, 0), TridentSettings.from_options(canaries=False, max_changes=1, min_samples=8,  # 3 ticks: a low gate
                                                                           regime_duration_s=STEADY))
    records = run_ticks(runner, policy, 3)
    plans = [r.decision.plan for r in records if r.decision.plan is not None]
    assert plans and all(len(p.operators) == 1 for p in plans)
    with pytest.raises(ValueError, match="max_changes"):
        TridentSettings.from_options(max_changes=-1)


def test_trident_tries_larger_batches_on_canaries_and_adopts_an_accepted_one():
    from trident_flows.core.types import ConfigSpace
    from trident_flows.runtime.spec import OperatorSpec, PipelineSpec

    # a pays 80 ms per batch: larger batches are much better per replica; only a canary can show it
    ops = [SimOp("a", "x", 0.002, per_batch=0.08), SimOp("b", "y", 0.01)]
    runner = SimRunner(ops, [(1e9, {"x": 1.0, "y": 1.0})])
    spec = PipelineSpec("sim", tuple(OperatorSpec(n, object, B8, 2, space=ConfigSpace(devices=("cpu",), batch_size_max=64))
                                     for n in "ab"), lambda: iter(()))
    start = runner.state()
    policy = TridentPolicy(spec, CLUSTER8)
    records = run_ticks(runner, policy, 22)
    accepted = [e for r in records for e in r.events if e.kind == EventKind.CANARY and e.text.startswith("canary cpu/b") and " of a accepted" in e.text]
    assert accepted, [(r.decision.action, r.decision.reason[:120]) for r in records]
    serving = [c for _, c, canary in runner.ops[0].replicas if not canary]
    assert serving and max(c.batch_size for c in serving) > 8
    caps = {op.name: sum(c.batch_size / runner.busy(op, c) for _, c, canary in op.replicas if not canary) for op in runner.ops}
    assert min(caps.values()) > 1.5 * (2 * 8 / runner.busy(ops[0], B8)), caps
    assert start.reconfigurations == 0 and len(runner.applied) >= 3


def test_the_cpu_kept_for_a_canary_goes_back_to_the_placement_once_no_operator_may_get_one():
    from trident_flows.core.types import ConfigSpace
    from trident_flows.runtime.spec import OperatorSpec, PipelineSpec

    runner = SimRunner(two_ops(), [(1e9, {"x": 4.0, "y": 1.0})])
    spec = PipelineSpec("sim", tuple(OperatorSpec(n, object, B8, 2, space=ConfigSpace(devices=("cpu",), batch_size_max=64))
                                     for n in "ab"), lambda: iter(()))
    policy = TridentPolicy(spec, CLUSTER8, TridentSettings.from_options(canary_min_busy=0.0))
    run_ticks(runner, policy, 10)
    state = runner.state()
    held = sum(r.config.cpus for op in state.operators for r in op.active if r.canary)
    kept = lambda: CLUSTER8.node_classes[0].cpus - held - policy.placement.cluster_for_placement(state).node_classes[0].cpus  # noqa: E731
    for name in ("a", "b"):
        policy.ops[name].canary = None
        policy.search.optimizer(name).status = "proposed cpu/b16"
    assert kept() == 1.0  # an optimiser has something to try: one CPU stays free for its canary
    for name in ("a", "b"):
        policy.search.optimizer(name).status = "converged: largest expected gain 1e-09 (log objective) < min_expected_gain 0.002"
    assert kept() == 0.0
    policy.search.optimizer("b").status = "proposed cpu/b16"
    assert kept() == 1.0


OCR_B4 = OpConfig.make("cpu", batch_size=4)


def _queued_state(wall_s: float, items_in: int, queue: int, replicas: int = 2, inflight: int = 1) -> RunnerState:
    done = items_in // (OCR_B4.batch_size * replicas)   # batches each replica finished
    reps = tuple(replica_state(replica_id=f"r{k}", config=OCR_B4, inflight=inflight, busy_fraction=1.0, batches=done, config_epoch=1) for k in range(replicas))
    op = operator_state(name="ocr", replicas=reps, queue_items=queue, items_in=items_in, items_out=items_in, config_epoch=1, busy_fraction=1.0)
    return runner_state(pipeline="sim", operators=(op,), items_in=items_in, wall_s=wall_s)


def _cheap_regime_policy() -> TridentPolicy:
    """A policy whose ocr model learned a cheap regime: batches of 4 in 0.8 s, 10 items/s on 2 replicas."""
    policy = TridentPolicy(None, None, TridentSettings.from_options(saturation_s=8.0, stale_ratio=1.5))
    samples = [batch_sample(operator="ocr", replica_id=f"r{k % 2}", config=OCR_B4, start=t - 0.8, end=t, busy_s=0.8, items_in=4,
                            config_epoch=1)
               for k, t in enumerate(np.linspace(-40.0, 0.0, 100))]
    policy.ops.ensure("ocr").model.fit(samples)
    return policy


def _calibrated(policy: TridentPolicy, states: list[RunnerState]) -> float:
    """Feed the snapshots (one sample each, ending at the snapshot) and return 2 replicas' capacity as the model reports it."""
    for state in states:
        policy.models.calibrate(state, [batch_sample(operator="ocr", config=OCR_B4, start=state.wall_s - 0.8, end=state.wall_s, busy_s=0.8,
                                                     items_in=4, config_epoch=1)])
    return policy.ops["ocr"].model.throughput(OCR_B4, 2).mean


def test_a_saturated_operator_whose_model_over_predicts_reports_the_capacity_it_measurably_has():
    # a queue all along, but only 1 item/s taken: the workload got expensive, the model (10 items/s) is stale
    policy = _cheap_regime_policy()
    assert policy.ops["ocr"].model.throughput(OCR_B4, 2).mean == pytest.approx(10.0, rel=0.05)
    assert _calibrated(policy, [_queued_state(float(t), t, queue=40) for t in range(0, 12, 2)]) == pytest.approx(1.0, rel=1e-6)
    assert policy.models.is_stale("ocr") and "scaled by 0.10" in policy.ops["ocr"].model.calibration.describe()
    # the queue ran dry inside the window: the operator was not saturated, its model stands
    states = [_queued_state(float(t), t, queue=0 if t == 4 else 40) for t in range(0, 12, 2)]
    assert _calibrated(_cheap_regime_policy(), states) == pytest.approx(10.0, rel=0.05)
    # work waiting but idle replicas (blocked by a full downstream queue): not saturated
    states = [_queued_state(float(t), t, queue=40, inflight=0 if t == 4 else 1) for t in range(0, 12, 2)]
    assert _calibrated(_cheap_regime_policy(), states) == pytest.approx(10.0, rel=0.05)
    # measured close to the prediction: no correction
    policy = _cheap_regime_policy()
    _calibrated(policy, [_queued_state(float(t), 10 * t, queue=40) for t in range(0, 12, 2)])
    assert policy.ops["ocr"].model.calibration is None and not policy.models.is_stale("ocr")


class StarvedCanaryRunner(SimRunner):
    """A runner whose canary replicas never get a batch (the incumbents take all the work): they hold none."""

    def advance(self, dt: float) -> list[BatchSample]:
        canaries = {rid for op in self.ops for rid, _c, canary in op.replicas if canary}
        new = [s for s in super().advance(dt) if s.replica_id not in canaries]
        self.samples = [s for s in self.samples if s.replica_id not in canaries]
        return new

    def state(self) -> RunnerState:
        state = super().state()
        return replace(state, operators=tuple(replace(o, replicas=tuple(replace(r, inflight=0) if r.canary else r for r in o.replicas))
                                              for o in state.operators))


class SlowCanaryRunner(SimRunner):
    """A runner whose canary replicas are handed a batch as they start that takes ``hold_s`` seconds: no
    sample of theirs comes back before (they hold it, ``inflight`` 1), their batches come back after."""

    def __init__(self, *args, hold_s: float, **kw) -> None:
        super().__init__(*args, **kw)
        self.hold_s = hold_s
        self.born: dict[str, float] = {}

    def advance(self, dt: float) -> list[BatchSample]:
        for op in self.ops:
            for rid, _c, canary in op.replicas:
                if canary:
                    self.born.setdefault(rid, self.t)
        held = {rid for rid, t in self.born.items() if self.t + dt < t + self.hold_s}
        new = [s for s in super().advance(dt) if s.replica_id not in held]
        self.samples = [s for s in self.samples if s.replica_id not in held]
        return new


def test_an_operator_whose_canary_was_abandoned_gets_no_other_until_its_workload_changes():
    from trident_flows.core.types import ConfigSpace
    from trident_flows.runtime.spec import OperatorSpec, PipelineSpec

    ops = [SimOp("a", "x", 0.002, per_batch=0.08), SimOp("b", "y", 0.01)]
    runner = StarvedCanaryRunner(ops, [(1e9, {"x": 1.0, "y": 1.0})])
    spec = PipelineSpec("sim", tuple(OperatorSpec(n, object, B8, 2, space=ConfigSpace(devices=("cpu",), batch_size_max=64))
                                     for n in "ab"), lambda: iter(()))
    policy = TridentPolicy(spec, CLUSTER8)
    records = run_ticks(runner, policy, 80)
    texts = [e.text for r in records for e in r.events if e.kind == EventKind.CANARY]
    started = [t for t in texts if t.startswith("canary cpu/b") and " for " in t]
    abandoned = [t for t in texts if " abandoned: it " in t]
    assert abandoned, texts
    # one canary per operator, abandoned once: no loop of replica starts that cannot be measured
    assert len(started) == len({t.split(" for ")[1].split(":")[0] for t in started}) == len(abandoned), texts
    name = abandoned[0].split(" of ")[1].split(" abandoned")[0]
    assert policy.canaries.abandoned_here(name)
    policy.gate.rearm_from(runner.state(), name)  # its workload changed: a canary may measure it again
    assert not policy.canaries.abandoned_here(name)


def test_a_config_whose_canary_was_rejected_is_neither_placed_nor_tried_again_until_the_workload_changes():
    from trident_flows.core.types import ConfigSpace
    from trident_flows.runtime.spec import OperatorSpec, PipelineSpec

    ops = [SimOp("a", "x", 0.002, per_batch=0.08), SimOp("b", "y", 0.01)]
    runner = SimRunner(ops, [(1e9, {"x": 1.0, "y": 1.0})])
    spec = PipelineSpec("sim", tuple(OperatorSpec(n, object, B8, 2, space=ConfigSpace(devices=("cpu",), batch_size_max=64))
                                     for n in "ab"), lambda: iter(()))
    policy = TridentPolicy(spec, CLUSTER8)
    run_ticks(runner, policy, 22)
    state, op = runner.state(), policy.ops["a"]
    tried = OpConfig.make("cpu", batch_size=24)  # accepted earlier, not serving now
    assert tried not in state.operator("a").configs()
    op.accepted.add(tried)
    assert tried in policy.placement.candidates(state, "a")[0]
    op.rejected[tried] = state.wall_s  # a later canary of it was rejected: no option, and no canary tries it again
    assert tried not in policy.placement.candidates(state, "a")[0] and policy.canaries.rejected_here("a", tried)
    runner.advance(2.0)
    later = runner.state()
    policy.gate.rearm_from(later, "a")  # its workload changed since: the rejection no longer speaks for it
    assert tried in policy.placement.candidates(later, "a")[0] and not policy.canaries.rejected_here("a", tried)


def test_a_canary_holding_a_slow_batch_is_judged_when_it_is_back_not_abandoned_as_starved():
    from trident_flows.core.types import ConfigSpace
    from trident_flows.runtime.spec import OperatorSpec, PipelineSpec

    ops = [SimOp("a", "x", 0.002, per_batch=0.08), SimOp("b", "y", 0.01)]
    settings = TridentSettings.from_options(canary_timeout_s=10.0)
    runner = SlowCanaryRunner(ops, [(1e9, {"x": 1.0, "y": 1.0})], hold_s=40.0)  # 4x the timeout
    spec = PipelineSpec("sim", tuple(OperatorSpec(n, object, B8, 2, space=ConfigSpace(devices=("cpu",), batch_size_max=64))
                                     for n in "ab"), lambda: iter(()))
    policy = TridentPolicy(spec, CLUSTER8, settings)
    records = run_ticks(runner, policy, 80)
    texts = [e.text for r in records for e in r.events if e.kind == EventKind.CANARY]
    started = [t for t in texts if t.startswith("canary cpu/b") and " for " in t]
    ended = [t for t in texts if " of " in t and (" abandoned: " in t or "ed: " in t)]
    assert started and ended, texts
    # ending it while its batch is out would only wait for that batch (a retiring replica drains)
    assert not any(" abandoned: " in t for t in ended), texts
    assert all(" accepted: " in t or " rejected: " in t for t in ended), texts


def test_an_unchanged_workloads_model_is_refitted_every_refit_ticks_and_a_new_config_at_once(monkeypatch):
    # every tick brings enough samples for a refit (refit_fraction 0): an unchanged workload's model is
    # refitted every third tick, a changed configuration's at the next samples (no rollout: min_gain 100x)
    runner = SimRunner(two_ops(), [(1e9, {"x": 1.0, "y": 1.0})])
    policy = TridentPolicy(None, CLUSTER8, TridentSettings.from_options(canaries=False, refit_fraction=0.0, refit_ticks=3, min_gain=100.0))
    fits: list[tuple[str, int]] = []
    tick = [0]
    fit = OperatorModel.fit
    monkeypatch.setattr(OperatorModel, "fit", lambda self, *a, **k: (fits.append((self.operator, tick[0])), fit(self, *a, **k))[1])
    for tick[0] in range(1, 10):
        run_ticks(runner, policy, 1)
    assert [t for op, t in fits if op == "a"] == [1, 4, 7]
    runner.ops[0].epoch += 1   # a new configuration of "a" (as after a rollout)
    for tick[0] in range(10, 12):
        run_ticks(runner, policy, 1)
    assert [t for op, t in fits if op == "a"] == [1, 4, 7, 10]
    with pytest.raises(ValueError, match="refit_ticks"):
        TridentSettings.from_options(refit_ticks=0)


def test_a_rollout_keeps_the_canary_still_being_measured():
    # the placement's plans carry no canary: a rollout on a tick without a canary event must not end the one running
    from trident_flows.core.types import ConfigSpace
    from trident_flows.runtime.spec import OperatorSpec, PipelineSpec
    from trident_flows.scheduler.replicas import canary_config

    ops = [SimOp("a", "x", 0.002, per_batch=0.08), SimOp("b", "y", 0.01, per_batch=0.08)]
    runner = SimRunner(ops, [(1e9, {"x": 4.0, "y": 1.0})])
    spec = PipelineSpec("sim", tuple(OperatorSpec(n, object, B8, 2, space=ConfigSpace(devices=("cpu",), batch_size_max=64))
                                     for n in "ab"), lambda: iter(()))
    policy = TridentPolicy(spec, CLUSTER8, TridentSettings.from_options(canary_min_busy=0.0))
    for _ in range(40):
        run_ticks(runner, policy, 1)
        measuring = [n for n in "ab" if policy.ops[n].canary is not None and canary_config(runner.state().operator(n)) is not None]
        if measuring and policy.verifier.pending is None:
            break
    assert measuring, "no canary was measured in 40 ticks"
    name = measuring[0]
    running = canary_config(runner.state().operator(name))
    grown = Plan(tuple(OperatorPlan(n, (ReplicaGroup(B8, 3),), "grow") for n in "ab"), reason="grow")
    for n in "ab":
        policy.ops[n].next_ask = 10**9  # no optimiser asked: a tick without a canary event
    policy.transition.decide = lambda *_args: Decision.roll_out(grown, "grow", 1.0)
    policy.placement.place = lambda _state, _tick: ((), None, None, (), "")
    record = run_ticks(runner, policy, 1)[0]
    assert record.decision.action == Action.ROLL_OUT, record.decision.reason
    assert record.decision.plan.for_operator(name).canary == running, (record.decision.reason, [e.text for e in record.events])
    assert canary_config(runner.state().operator(name)) == running


def test_a_canary_refused_for_its_batch_time_gives_the_kept_cpu_back_until_the_workload_changes():
    # every proposal's batch takes longer than canary_max_batch_s: no canary starts, and the CPU kept for
    # one goes back to the placement instead of waiting for a proposal the optimiser keeps making
    from trident_flows.core.types import ConfigSpace
    from trident_flows.runtime.spec import OperatorSpec, PipelineSpec

    ops = [SimOp("a", "x", 0.002, per_batch=0.08), SimOp("b", "y", 0.01, per_batch=0.08)]
    runner = SimRunner(ops, [(1e9, {"x": 1.0, "y": 1.0})])
    spec = PipelineSpec("sim", tuple(OperatorSpec(n, object, B8, 2, space=ConfigSpace(devices=("cpu",), batch_size_max=64))
                                     for n in "ab"), lambda: iter(()))
    policy = TridentPolicy(spec, CLUSTER8, TridentSettings.from_options(canary_min_busy=0.0, canary_max_batch_s=1e-3, reask_ticks=1))
    records = run_ticks(runner, policy, 30)
    texts = [e.text for r in records for e in r.events if e.kind == EventKind.CANARY]
    assert not [t for t in texts if t.startswith("canary cpu/b")], texts
    assert {t.split(":")[0] for t in texts if t.startswith("no canary of")}, texts
    assert all(policy.canaries.abandoned_here(n) for n in "ab"), texts
    assert not policy.canaries.exploring(runner.state())
    policy.gate.rearm_from(runner.state(), "a")  # a's workload changed: its optimiser may be asked again
    assert not policy.canaries.abandoned_here("a") and policy.canaries.exploring(runner.state())


def test_a_residual_change_in_a_tick_larger_than_the_detector_reads_keeps_only_the_samples_since_it():
    # every tick brings ~230 samples per operator and the detector reads 20 of them: the change point it
    # reports counts its own samples, and the window must be cut where those samples came from
    runner = SimRunner(two_ops(), [(1e9, {"x": 1.0, "y": 1.0})])
    policy = TridentPolicy(None, CLUSTER8, TridentSettings.from_options(canaries=False, min_gain=100.0, detector_samples=20))
    run_ticks(runner, policy, 5, dt=10.0)
    before = sum(1 for s in runner.samples if s.operator == "b")
    runner.ops[1].per_item = 0.03   # b runs 3x slower on the same items: a residual change
    records = run_ticks(runner, policy, 4, dt=10.0)
    cuts = [e.text for r in records for e in r.events if e.operator == "b" and e.text.startswith("dropped samples")]
    assert cuts, [(e.operator, e.text) for r in records for e in r.events]
    kept = int(cuts[0].rsplit(" ", 1)[1])
    slow = sum(1 for s in runner.samples if s.operator == "b") - before
    assert 0 < kept <= slow, (kept, slow, before)


def test_routine_refits_are_spread_over_refit_ticks_and_a_new_config_is_refitted_at_once(monkeypatch):
    # six operators fitted together at the first tick would all refit together every refit_ticks
    # ticks (on 256 simulated nodes ten such fits took half a second of one tick): at most a third
    # of them per tick, each still within a tick or two of its turn
    ops = [SimOp(f"op{k}", "x", 0.01) for k in range(6)]
    runner = SimRunner(ops, [(1e9, {"x": 1.0})], cpus=16)
    policy = TridentPolicy(None, ClusterSpec.single_node(16, 0), TridentSettings.from_options(canaries=False, refit_fraction=0.0, refit_ticks=3, min_gain=100.0))
    fits: list[tuple[str, int]] = []
    tick = [0]
    fit = OperatorModel.fit
    monkeypatch.setattr(OperatorModel, "fit", lambda self, *a, **k: (fits.append((self.operator, tick[0])), fit(self, *a, **k))[1])
    for tick[0] in range(1, 14):
        run_ticks(runner, policy, 1)
    assert sorted(op for op, t in fits if t == 1) == [f"op{k}" for k in range(6)]   # no model yet: all at once
    per_tick = [sum(1 for _, t in fits if t == k) for k in range(2, 14)]
    assert max(per_tick) <= 2 and sum(per_tick) >= 18, per_tick
    for k in range(6):
        times = [t for op, t in fits if op == f"op{k}"]
        assert all(3 <= b - a <= 5 for a, b in zip(times, times[1:])), (k, times)
    runner.ops[3].epoch += 1   # a new configuration of op3: refitted at its next samples, whatever the others
    tick[0] = 14
    run_ticks(runner, policy, 1)
    assert ("op3", 14) in fits
