"""Idle capacity given to saturated operators (free resources, and replicas of operators that sat mostly idle), a run
started in what the memory learned, and pre-positioning that does not shrink an operator with work waiting nor replace
replicas for a batch size alone (no Ray)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from builders import operator_state, replica_state, runner_state

from trident_flows.core.state import OperatorState, RunnerState
from trident_flows.core.types import ClusterSpec, OpConfig, PlanKind, TransitionVerdict
from trident_flows.scheduler.policies import make_policy
from trident_flows.scheduler.trident import memory
from trident_flows.scheduler.trident.batch_depth import BatchDepth
from trident_flows.scheduler.trident.context import Context
from trident_flows.scheduler.trident.idle_capacity import IdleCapacity
from trident_flows.scheduler.trident.memory import PipelineIdentity, RegimeEntry
from trident_flows.scheduler.trident_policy import _unverified
from trident_flows.scheduler.trident_settings import IdleCapacitySettings, MemorySafetySettings, SourceRegimeSettings

CPU8 = OpConfig("cpu", 8)
CPU2 = OpConfig("cpu", 2)


def _op(name: str, replicas: int, queue: int, busy: bool, config: OpConfig = CPU8) -> OperatorState:
    reps = tuple(replica_state(replica_id=f"{name}{k}", actor_name=f"a{name}{k}", config=config, inflight=2 if busy else 0, busy_fraction=1.0,
                               batches=5) for k in range(replicas))
    return operator_state(name=name, replicas=reps, queue_items=queue, queue_bytes=queue * 100, busy_fraction=1.0 if busy else 0.0)


def _state(t: float, *ops: OperatorState, cpus: float = 16) -> RunnerState:
    return runner_state(operators=ops, wall_s=t, cluster_cpus=cpus)


class _Safe:
    def unsafe(self, name: str, config: OpConfig) -> str | None:
        return None


def _no_depth() -> BatchDepth:
    """A batch depth that has seen no stretch: it raises no batch."""
    return BatchDepth(lambda name: None, lambda name, config: None, lambda: 0.0, lambda state: {})


def _idle(growth_s: float | None = 4.0, keep_cpu: bool = False) -> IdleCapacity:
    return IdleCapacity(IdleCapacitySettings(growth_s=growth_s), Context(None, ClusterSpec.single_node(16, 0)), _Safe(),  # type: ignore[arg-type]
                        memory_safety=MemorySafetySettings(), memory_bound=lambda name, config: None, keep_cpu=lambda state: keep_cpu)


def _feed(idle: IdleCapacity, seconds: int, make: Any) -> RunnerState:
    state = make(0.0)
    for t in range(seconds + 1):
        state = make(float(t))
        idle.observe(state)
    return state


def test_free_cpus_go_to_the_operators_saturated_long_enough_most_queued_per_replica_first() -> None:
    # 4 + 3 + 1 = 8 of 16 CPUs held: 8 free; embed has 400 queued on 3 replicas, ocr 100 on 4, parse is starved
    idle = _idle()
    state = _feed(idle, 5, lambda t: _state(t, _op("parse", 1, 0, False), _op("ocr", 4, 100, True), _op("embed", 3, 400, True)))
    plan = idle.plan(state)
    assert plan is not None and plan.rationale is not None and plan.rationale.kind == PlanKind.IDLE_CAPACITY
    total = {o.operator: sum(g.replicas for g in o.groups) for o in plan.operators}
    assert "parse" not in total  # starved: more replicas would not help it
    assert sum(total.values()) - 4 * ("ocr" in total) - 3 == 8  # every free CPU is used, none beyond
    assert total["embed"] > total.get("ocr", 4)  # the deeper queue per replica gets the most
    assert idle.moves == 8


def test_no_growth_before_idle_growth_s_of_saturation_nor_when_turned_off_nor_for_the_canary_cpu() -> None:
    saturated = lambda t: _state(t, _op("ocr", 14, 50, True))  # noqa: E731 - 2 CPUs free
    assert _idle().plan(_feed(_idle(), 0, saturated)) is None
    early = _idle()
    assert early.plan(_feed(early, 2, saturated)) is None  # saturated for 2 s of the 4 asked
    off = _idle(None)
    assert off.plan(_feed(off, 6, saturated)) is None
    kept = _idle(keep_cpu=True)
    plan = kept.plan(_feed(kept, 6, saturated))
    assert plan is not None and sum(g.replicas for g in plan.operators[0].groups) == 15  # one of the 2 free CPUs stays for a canary
    blipped = _idle()
    _feed(blipped, 6, saturated)
    blipped.observe(_state(7.0, _op("ocr", 14, 0, True)))  # its queue ran dry: the saturated run starts again
    assert blipped.plan(_state(8.0, _op("ocr", 14, 50, True))) is None


def _busy_op(name: str, replicas: int, busy: int, config: OpConfig = CPU8) -> OperatorState:
    """An operator with no queue whose first ``busy`` replicas hold a batch."""
    reps = tuple(replica_state(replica_id=f"{name}{k}", actor_name=f"a{name}{k}", config=config, inflight=1 if k < busy else 0, busy_fraction=0.2, batches=5)
                 for k in range(replicas))
    return operator_state(name=name, replicas=reps, busy_fraction=0.2)


def test_replicas_of_a_mostly_idle_operator_go_to_a_saturated_one_as_a_verified_rebalance() -> None:
    # 16 CPUs all held: ocr runs 6 replicas of which 1 holds a batch, embed 10 with 500 queued
    idle = _idle()
    state = _feed(idle, 10, lambda t: _state(t, _busy_op("ocr", 6, 1), _op("embed", 10, 500, True)))
    assert idle.spare(state) == {"ocr": 4}  # it keeps 2: twice the 1 replica it kept busy
    plan = idle.plan(state)
    assert plan is not None and plan.rationale is not None and plan.rationale.kind == PlanKind.REBALANCE
    total = {o.operator: sum(g.replicas for g in o.groups) for o in plan.operators}
    assert total == {"ocr": 2, "embed": 14}
    assert "ocr: -4 replica(s)" in plan.reason and idle.moves == 4
    assert not _unverified(plan)  # measured like any placement, rolled back when slower


def test_nothing_is_lent_by_an_operator_saturated_in_the_window_nor_before_the_window_is_seen() -> None:
    early = _idle()
    assert early.spare(_feed(early, 6, lambda t: _state(t, _busy_op("ocr", 6, 1), _op("embed", 10, 500, True)))) == {}
    was_busy = _idle()
    _feed(was_busy, 10, lambda t: _state(t, _op("ocr", 6, 30, True) if t == 5 else _busy_op("ocr", 6, 1), _op("embed", 10, 500, True)))
    assert was_busy.spare(_state(10.0, _busy_op("ocr", 6, 1), _op("embed", 10, 500, True))) == {}


def test_a_tick_after_a_long_apply_does_not_count_as_a_saturated_window() -> None:
    # the simulator's loop blocks while an apply runs: the next tick is the only one in the window, after the configs changed
    idle = _idle()
    _feed(idle, 3, lambda t: _state(t, _op("ocr", 10, 50, True)))
    after = _state(30.0, _op("ocr", 14, 50, True))
    idle.observe(after)
    assert idle.saturated(after) == []


def _learned_spec() -> Any:
    from benchmarks import suite_workloads as sw
    from benchmarks.baselines import STATIC_DEFAULT
    from benchmarks.closed_loop_workload import Workload
    from trident_flows.runtime.costmodel import PipelineProfile

    suite = sw.suite_workloads(True, ["cpu-only"])[0]
    profile = PipelineProfile.load(suite.profile)
    stream = Workload("regimes", "short:40,scans:10", seed=sw.SEED, time_scale=1.0)
    start = suite.baselines(profile, stream, stream.rows(profile)).start(STATIC_DEFAULT)
    return stream.spec(profile, start, "start-test")


def test_a_run_starts_in_the_memorys_allocation_for_the_regime_with_the_most_items(tmp_path: Path) -> None:
    spec = _learned_spec()
    cluster = ClusterSpec.single_node(16, 0)
    names = [op.name for op in spec.operators]
    many = RegimeEntry({"pages": 2.0}, {n: ((CPU2, 1),) for n in names} | {"embed": ((CPU2, 10),)}, 30.0, 2, items=5000.0)
    few = RegimeEntry({"pages": 40.0}, {n: ((CPU2, 1),) for n in names} | {"ocr": ((CPU2, 10),)}, 3.0, 3, items=600.0)
    path = tmp_path / "memory.json"
    memory.save(memory.memory_of(PipelineIdentity.of(spec), cluster, {}, {}, [few, many]), str(path))

    policy = make_policy("trident", spec=spec, cluster=cluster, memory=str(path))  # on by default
    started = policy.starting_spec(spec)
    assert started.operator("embed").replicas == 10 and started.operator("embed").config == CPU2
    # embed grows 7 -> 10: the 3 CPUs come from ocr (5, remembered at 1), no more than the growth needs
    assert started.operator("ocr").replicas == 2 and started.operator("ocr").config == CPU2
    assert policy.started_from is not None and "embed 10x" in policy.started_from and "89% of the input items" in policy.started_from
    assert [op.name for op in started.operators] == names and started.source is spec.source  # what is curated is unchanged

    off = make_policy("trident", spec=spec, cluster=cluster, memory=str(path), start_from_memory=False)
    assert off.starting_spec(spec) is spec
    small = make_policy("trident", spec=spec, cluster=ClusterSpec.single_node(8, 0), memory=str(path), start_from_memory=True)
    assert small.starting_spec(spec) is spec  # 15 replicas of 1 CPU do not fit 8 CPUs (nor does a rescaled one start over them)
    cold = make_policy("trident", spec=spec, cluster=cluster, memory=str(tmp_path / "none.json"), start_from_memory=True)
    assert cold.starting_spec(spec) is spec
    # a regime that held 20 s of the earlier runs at its plan's rate gives too thin a plan to start a run in
    thin = RegimeEntry({"pages": 2.0}, {n: ((CPU2, 1),) for n in names} | {"embed": ((CPU2, 10),)}, 30.0, 2, items=600.0)
    memory.save(memory.memory_of(PipelineIdentity.of(spec), cluster, {}, {}, [thin]), str(tmp_path / "thin.json"))
    assert make_policy("trident", spec=spec, cluster=cluster, memory=str(tmp_path / "thin.json")).starting_spec(spec) is spec


def test_memory_items_round_trip_and_add_up_across_runs(tmp_path: Path) -> None:
    spec = _learned_spec()
    cluster = ClusterSpec.single_node(16, 0)
    identity = PipelineIdentity.of(spec)
    entry = RegimeEntry({"pages": 2.0}, {"ocr": ((CPU8, 2),)}, 30.0, 1, items=120.0)
    first = memory.memory_of(identity, cluster, {}, {}, [entry])
    path = tmp_path / "m.json"
    memory.save(memory.merged(first, memory.memory_of(identity, cluster, {}, {}, [replace(entry, items=80.0)])), str(path))
    loaded = memory.load(str(path), identity, cluster).memory
    assert loaded is not None and loaded.regimes[0].items == 200.0 and loaded.regimes[0].seen == 2


def test_the_items_of_a_regime_the_source_already_read_are_known_to_come(monkeypatch: Any) -> None:
    from trident_flows.scheduler.trident import source_regimes
    from trident_flows.scheduler.trident.source_regimes import Regime, Segment, SourceRegimes

    sources = SourceRegimes(SourceRegimeSettings())
    state = _state(0.0, _op("parse", 1, 0, True), _op("embed", 4, 0, True))
    assert sources.known_ahead(state) == 0.0  # no segment yet: nothing is known
    short, scans = Regime(0, {"pages": 2.0}), Regime(1, {"pages": 40.0})
    sources.segments = [Segment(0.0, short), Segment(5000.0, scans)]
    sources.position = 5600.0
    positions = {"parse": 5600.0, "embed": 4200.0}
    monkeypatch.setattr(source_regimes, "stream_positions", lambda s: positions)
    assert sources.known_ahead(state) == 800.0  # the short items up to the scans at 5000
    positions["embed"] = 5100.0
    assert sources.known_ahead(state) == 500.0  # in the scans now: up to what the source has read


def test_a_segments_span_is_exact_once_the_next_started_and_the_regimes_mean_before() -> None:
    from trident_flows.scheduler.trident.source_regimes import Regime, Segment, SourceRegimes

    sources = SourceRegimes(SourceRegimeSettings())
    web, scans = Regime(0, {"pages": 2.0}), Regime(1, {"pages": 40.0})
    sources.segments = [Segment(0.0, web), Segment(1000.0, scans), Segment(3000.0, web), Segment(3500.0, scans)]
    sources.position = 3600.0
    assert [sources.span(s) for s in sources.segments[:3]] == [1000.0, 2000.0, 500.0]  # to the next segment's start
    assert sources.span(sources.segments[3]) == 2000.0  # 100 read so far: the scans' earlier segment held 2000
    sources.position = 6000.0
    assert sources.span(sources.segments[3]) == 2500.0  # read beyond that mean: what is read


def test_pre_positioning_does_not_shrink_an_operator_with_work_waiting(monkeypatch: Any) -> None:
    from trident_flows.scheduler.trident import preposition
    from trident_flows.scheduler.trident.operators import ColdStarts
    from trident_flows.scheduler.trident.pace import Pace
    from trident_flows.scheduler.trident.preposition import PrePositioning
    from trident_flows.scheduler.trident.regime_plans import RegimePlan
    from trident_flows.scheduler.trident.source_regimes import Regime, Segment, SourceRegimes

    sources = SourceRegimes(SourceRegimeSettings())
    short = Regime(0, {"pages": 2.0}, remembered=True)
    sources.segments = [Segment(0.0, short)]

    class Plans:
        def plan(self, state: Any, regime: Any, live: bool) -> RegimePlan:
            return RegimePlan(0, {"ocr": {CPU8: 1}, "embed": {CPU8: 10}}, 30.0, "memory")

    monkeypatch.setattr(preposition, "stream_positions", lambda s: {"ocr": 100.0, "embed": 50.0})
    ahead = PrePositioning(Context(None, ClusterSpec.single_node(16, 0)), sources, Plans(), pace=Pace(None),  # type: ignore[arg-type]
                           cold_starts=ColdStarts(5.0), safety=_Safe(), depth=_no_depth(), benefit_ratio=2.0)  # type: ignore[arg-type]
    busy = _state(10.0, _op("ocr", 10, 200, True), _op("embed", 4, 0, False))
    plan = ahead.plan(busy)
    assert plan is None or "ocr" not in [o.operator for o in plan.operators]  # 200 items wait at its 10 busy replicas
    drained = _state(11.0, _op("ocr", 10, 0, False), _op("embed", 4, 0, False))
    plan = ahead.plan(drained)
    assert plan is not None and "ocr" in [o.operator for o in plan.operators]  # its queue drained: it moves to the regime's 1 replica


def test_idle_capacity_keeps_a_cpu_for_a_canary_only_where_the_placement_keeps_one() -> None:
    from trident_flows.core.types import NodeClass
    from trident_flows.scheduler.trident.placement_step import PlacementStep

    class _Exploring:
        def exploring(self, state: RunnerState) -> bool:
            return True

    step = object.__new__(PlacementStep)  # the cluster arithmetic alone
    step.canaries = _Exploring()
    state = _state(0.0, *(_op(f"op{i}", 1, 10, busy=True) for i in range(6)))
    step.ctx = Context(None, ClusterSpec.single_node(16, 0))  # a node with CPUs to spare beside one replica per operator
    assert step.keeps_canary_cpu(state) and step.cluster_for_placement(state).node_classes[0].cpus == 15
    # a 6-CPU head for 6 operators and two 1-CPU workers (nodes asked of the autoscaler for throughput): the placement keeps
    # no CPU, so neither does idle capacity: a worker's CPU does not sit idle waiting for a canary
    step.ctx = Context(None, ClusterSpec((NodeClass("head", 1, 6, 0, 0, 64 * 2**30), NodeClass("c1", 2, 1, 0, 0, 4 * 2**30))))
    assert not step.keeps_canary_cpu(state) and step.cluster_for_placement(state) == step.ctx.planned_for(state)
    # a GPU canary on a 1-GPU worker beside a 16-CPU head without GPUs: the placement cannot take its GPU from the head, so
    # it keeps nothing, and neither does idle capacity
    canary = operator_state(name="embed", replicas=(replica_state(replica_id="c0", config=OpConfig.make("gpu", gpus=1.0, batch_size=8),
                                                                  canary=True),))
    with_canary = _state(0.0, *(_op(f"op{i}", 1, 10, busy=True) for i in range(5)), canary)
    step.ctx = Context(None, ClusterSpec((NodeClass("head", 1, 16, 0, 0, 64 * 2**30), NodeClass("g1", 1, 4, 1, 8 * 2**30, 16 * 2**30))))
    assert step.cluster_for_placement(with_canary) == step.ctx.planned_for(with_canary)
    assert not step.keeps_canary_cpu(with_canary)


def test_a_regime_plan_that_predicts_less_than_an_allocation_measured_on_the_regime_gives_way_to_it() -> None:
    from tests.builders import operator_state, replica_state, runner_state
    from trident_flows.scheduler.trident import regime_plans
    from trident_flows.scheduler.trident.regime_plans import RegimePlan, RegimePlans
    from trident_flows.scheduler.trident.source_regimes import Regime

    plans = object.__new__(RegimePlans)  # the measured side alone: no models, no solver
    plans._measured, plans._solved, plans._failed = {}, {}, {}
    short = Regime(0, {"pages": 2.0}, remembered=True)
    plans._remembered = {0: RegimePlan(0, {"ocr": {CPU8: 11}, "embed": {CPU8: 1}}, 9.5, "memory")}

    def state(ocr: int, embed: int, *, warm: bool = True) -> RunnerState:
        return runner_state(operators=(
            operator_state(name="ocr", replicas=tuple(replica_state(replica_id=f"o{i}", config=CPU8, warm=warm) for i in range(ocr))),
            operator_state(name="embed", replicas=tuple(replica_state(replica_id=f"e{i}", config=CPU8) for i in range(embed)))))

    running = state(10, 2)
    for _ in range(regime_plans.MEASURED_TICKS - 1):
        plans.refresh(running, [short], {0}, 30.0)
    plans.refresh(state(10, 2, warm=False), [short], {0}, 50.0)  # a replica starting: not a steady tick
    plans.refresh(running, [short], {0, 1}, 50.0)  # the pipeline on two regimes: no one regime's rate
    assert plans.plan(running, short, False).origin == "memory"  # 7 steady ticks: too few to stand against a plan
    plans.refresh(running, [short], {0}, 30.0)
    measured = plans.plan(running, short, False)
    assert measured.origin == "measured" and measured.predicted == 30.0 and measured.groups == {"ocr": {CPU8: 10}, "embed": {CPU8: 2}}
    plans._remembered[0] = RegimePlan(0, {"ocr": {CPU8: 8}, "embed": {CPU8: 4}}, 40.0, "memory")
    assert plans.plan(running, short, False).origin == "memory"  # a plan predicting a third more than measured is still tried


@pytest.mark.parametrize("origin, gain, pays, moves", [("models", 1.01, True, False), ("models", None, None, True), ("models", 1.5, True, True),
                                                       ("models", 1.5, False, False), ("measured", 1.01, True, False),
                                                       ("memory", 1.01, False, True)])
def test_a_regime_plan_of_this_run_is_pre_positioned_only_where_the_models_predict_it_faster_and_it_pays(
        monkeypatch: Any, origin: str, gain: float | None, pays: bool | None, moves: bool) -> None:
    from trident_flows.scheduler.trident import preposition
    from trident_flows.scheduler.trident.operators import ColdStarts
    from trident_flows.scheduler.trident.pace import Pace
    from trident_flows.scheduler.trident.preposition import PrePositioning
    from trident_flows.scheduler.trident.regime_plans import RegimePlan
    from trident_flows.scheduler.trident.source_regimes import Regime, Segment, SourceRegimes

    sources = SourceRegimes(SourceRegimeSettings())
    sources.segments = [Segment(0.0, Regime(0, {"pages": 2.0}, remembered=True))]
    sources.position = 600.0
    asked: list[str] = []
    priced: list[tuple[float, float]] = []

    class Plans:
        def plan(self, state: Any, regime: Any, live: bool) -> RegimePlan:
            return RegimePlan(0, {"ocr": {CPU8: 2}, "embed": {CPU8: 12}}, 30.0, origin)

        def gain(self, state: Any, regime: Any, plan: RegimePlan) -> float | None:
            asked.append(plan.origin)
            return gain

        def transition(self, state: Any, regime: Any, plan: RegimePlan, duration_s: float, benefit_ratio: float) -> Any:
            priced.append((duration_s, benefit_ratio))
            return None if pays is None else SimpleNamespace(verdict=TransitionVerdict.ROLL_OUT if pays else TransitionVerdict.WAIT)

    monkeypatch.setattr(preposition, "stream_positions", lambda s: {"ocr": 100.0, "embed": 50.0})
    ahead = PrePositioning(Context(None, ClusterSpec.single_node(16, 0)), sources, Plans(), pace=Pace(None),  # type: ignore[arg-type]
                           cold_starts=ColdStarts(5.0), safety=_Safe(), depth=_no_depth(), benefit_ratio=2.0)  # type: ignore[arg-type]
    state = _state(10.0, _op("ocr", 4, 0, False), _op("embed", 8, 0, False))
    plan = ahead.plan(state)
    assert (plan is not None) == moves and ahead.skipped == (not moves)
    assert asked == ([] if origin == "memory" else [origin])  # decided once per segment, for every operator; memory is trusted
    # priced only where the models predict the margin: over the segment's 600 items at the plan's 30 items/s
    assert priced == ([(20.0, 2.0)] if origin != "memory" and (gain is None or gain >= 1.05) else [])
    assert ahead.plan(_state(11.0, _op("ocr", 4, 0, False), _op("embed", 8, 0, False))) is None  # the segment is settled


def test_an_allocations_rate_on_a_regime_is_its_slowest_operators_capacity_over_its_work() -> None:
    from trident_flows.scheduler.placement.types import OperatorDemand, PlacementOption
    from trident_flows.scheduler.trident.regime_plans import _rate

    demands = [OperatorDemand("ocr", 1.0, (PlacementOption(CPU8, ((1, 2.0),)), PlacementOption(CPU2, ((1, 1.0),)))),
               OperatorDemand("embed", 4.0, (PlacementOption(CPU8, ((1, 10.0), (4, 28.0))),))]
    assert _rate(demands, {"ocr": {CPU8: 10}, "embed": {CPU8: 4}}) == 7.0  # embed: 28 items/s over 4 per input item
    assert _rate(demands, {"ocr": {CPU8: 2, CPU2: 1}, "embed": {CPU8: 4}}) == 5.0  # ocr: 2 x 2 + 1 items/s
    assert _rate(demands, {"ocr": {OpConfig("cpu", 4): 10}, "embed": {CPU8: 4}}) is None  # a config without a curve


def test_a_regime_plan_counts_replicas_beyond_those_running_at_the_evidence_gates_bound() -> None:
    from collections import deque

    import numpy as np

    from trident_flows.scheduler.trident.operators import ColdStarts
    from trident_flows.scheduler.trident.pace import Pace
    from trident_flows.scheduler.trident.regime_plans import RegimePlans
    from trident_flows.scheduler.trident.source_regimes import Regime

    class Model:  # 2 items/s per replica, known up to the replicas running; beyond them 1 item/s less per z
        ready, feature_names, current_features = True, (), {}

        def capacity_lower(self, config: OpConfig, cap: int, serving: int, z: float, features: Any = None) -> np.ndarray:
            return np.array([2.0 * r if r <= serving else 2.0 * serving + (2.0 - z) * (r - serving) for r in range(1, cap + 1)])

    class Op:
        model, accepted, window = Model(), set(), deque()

    class Search:
        def memory_bound(self, name: str, config: OpConfig) -> None:
            return None

    def curve(z: float) -> list[float]:
        plans = RegimePlans(None, Context(None, ClusterSpec.single_node(16, 0)), {"ocr": Op()}, search=Search(), safety=_Safe(),  # type: ignore[arg-type]
                            pace=Pace(None), cold_starts=ColdStarts(5.0), depth=_no_depth(), solve=lambda *a, **k: None,
                            confidence_z=z)
        (demand,) = plans._demands(_state(10.0, _op("ocr", 4, 0, False)), Regime(0, {}))  # type: ignore[arg-type]
        (option,) = demand.options
        return [option.rate_at(r) for r in (4, 8)]

    assert curve(0.0) == [8.0, 16.0]  # the median: 4 more replicas add 8 items/s
    assert curve(1.0) == [8.0, 12.0]  # at the bound: what runs is measured, what would be added counts 1 item/s each


def test_a_plan_that_overfills_the_cluster_beside_its_canary_gives_up_replicas_of_its_largest_group() -> None:
    # on a multi-node cluster the placement keeps no room for a running canary: its plan fills the 16 CPUs, and carrying
    # the canary into it would ask the runner for 17 (refused); the trim takes one replica of the largest group
    from trident_flows.core.types import OperatorPlan, Plan, ReplicaGroup
    from trident_flows.scheduler.replicas import within_cluster

    cpu1 = OpConfig.make("cpu", batch_size=1)
    state = _state(0.0, _op("a", 4, 0, True), _op("b", 2, 0, True), _op("c", 2, 0, True))
    plan = Plan((OperatorPlan("a", (ReplicaGroup(CPU8, 10),), "a"), OperatorPlan("b", (ReplicaGroup(CPU8, 4),), "b", canary=cpu1)), 1.0, "grow")
    trimmed, notes = within_cluster(plan, state)  # 10 + 4 + the canary + c's 2 as they run: 17 CPUs
    assert [(o.operator, o.replicas, o.canary) for o in trimmed.operators] == [("a", 9, None), ("b", 4, cpu1)]
    assert notes == ["a: 1 replica(s) of cpu/b8 fewer"] and trimmed.reason == "grow"
    fits = Plan((OperatorPlan("a", (ReplicaGroup(CPU8, 9),), "a"),), 1.0, "grow")
    assert within_cluster(fits, state) == (fits, [])
    # an operator's last replica is never taken: a plan only single replicas overfill goes to the runner, which refuses it
    single = Plan((OperatorPlan("a", (ReplicaGroup(CPU8, 1),), "a", canary=cpu1),), 1.0, "x")
    assert within_cluster(single, _state(0.0, _op("a", 1, 0, True), _op("b", 15, 0, True))) == (single, [])
