"""The closed loop's mechanisms: a move of a single-replica operator lands on a full cluster, a
refused plan is not re-issued unchanged, no rollout before the evidence gate (nor after a
workload change before every operator has measured the new workload), a rollout that lowers
the measured throughput is rolled back after the input closed, a move whose cold start the
remaining items cannot repay is not made, and an operator that ran out of memory is moved off
its config whatever else is going on (evidence gate, verification, a placement that fails)."""

from __future__ import annotations

import time
from dataclasses import replace

import ray
from builders import operator_state, replica_state, runner_state
from test_controller import CLUSTER8, STEADY, SimRunner, run_ticks, two_ops
from test_runtime_support import assert_exactly_once, small_pipeline

from trident_flows.control.launch import start_runner
from trident_flows.core.decision import Action, Hold, HoldKind
from trident_flows.core.signatures import placement_signature, plan_signature
from trident_flows.core.state import ApplyOutcome, ApplyStatus, OperatorState, RunnerState
from trident_flows.core.types import OpConfig, OperatorPlan, Plan, PlanKind, ReplicaGroup, StepKind, Transition, TransitionStep
from trident_flows.runtime.transition import rolling_steps
from trident_flows.scheduler.occupancy import SaturatedSpan, serving_configs
from trident_flows.scheduler.trident_policy import TridentPolicy
from trident_flows.scheduler.trident_settings import TridentSettings

A = OpConfig.make("cpu", batch_size=8)
B = OpConfig.make("cpu", batch_size=4, model="lite")  # another model too: a rolling replacement, not a resize in place


def _op(name: str, *configs: OpConfig) -> OperatorState:
    reps = tuple(replica_state(replica_id=f"{name}-{k}", actor_name=f"r:{name}:{k}", config=c, busy_fraction=0.5, batches=10, config_epoch=1)
                 for k, c in enumerate(configs))
    return operator_state(name=name, replicas=reps, config_epoch=1, busy_fraction=0.5)


def test_full_cluster_takes_room_from_another_operator_before_the_last_replica():
    # 3 CPUs, all in use: embed's only replica moves to b4 while parse shrinks 2 -> 1.
    state = runner_state(operators=(_op("parse", A, A), _op("embed", A)), cluster_cpus=3)
    plan = Plan((OperatorPlan("embed", (ReplicaGroup(B, 1),)), OperatorPlan("parse", (ReplicaGroup(A, 1),))), reason="t")
    steps = [(s.kind, s.operator, s.config.batch_size) for s in rolling_steps(state, plan).steps]
    assert steps == [(StepKind.RETIRE, "parse", 8), (StepKind.START, "embed", 4), (StepKind.RETIRE, "embed", 8)]
    # nothing else to take from: swapped in place, the retire of its last replica first and marked so
    state = runner_state(operators=(_op("parse", A), _op("embed", A)), cluster_cpus=2)
    t = rolling_steps(state, Plan((OperatorPlan("embed", (ReplicaGroup(B, 1),)),), reason="t"))
    assert [(s.kind, s.operator) for s in t.steps] == [(StepKind.RETIRE, "embed"), (StepKind.START, "embed")]
    assert "swapping it in place" in t.steps[0].reason


def test_runner_swaps_a_single_replica_operator_in_place(ray_cluster, tmp_path):
    spec = small_pipeline(300, time_scale=5.0, regimes="short:300")
    handle = start_runner(spec, tmp_path, name="rt-swap", namespace="rt", external_input=True)
    ray.get(handle.add_shard.remote("s0", list(spec.source())))
    while ray.get(handle.state.remote()).items_written < 20:
        time.sleep(0.05)
    old = ray.get(handle.state.remote()).operator("filter").replicas[0].config
    new = old.with_changes(batch_size=4)
    swap = Transition((TransitionStep(StepKind.RETIRE, "filter", old, 1, reason="swap"), TransitionStep(StepKind.START, "filter", new, 1)))
    report = ray.get(handle.apply.remote(swap))
    assert report.outcome.status == ApplyStatus.LANDED, report.error
    assert [r.config for r in ray.get(handle.state.remote()).operator("filter").replicas] == [new]
    ray.get(handle.close_input.remote())
    summary = ray.get(handle.wait.remote(120))
    ray.get(handle.stop.remote())
    ray.kill(handle)
    assert summary["finished"] and summary["reconfigurations"] == 1
    assert_exactly_once(spec, tmp_path)


def test_a_refused_plan_is_not_reissued_unchanged():
    runner = SimRunner(two_ops(), [(1e9, {"x": 4.0, "y": 1.0})])
    policy = TridentPolicy(None, CLUSTER8, TridentSettings.from_options(canaries=False))
    issued = []
    for _ in range(16):
        state = runner.state()
        record = policy.tick(state, runner.advance(2.0))
        if record.decision.plan is not None:  # the runner refuses every plan: nothing changes
            issued.append((placement_signature(runner.state()), plan_signature(record.decision.plan)))
            policy.observe_apply(record.decision.plan, ApplyOutcome.refused("injected: no room"))
    assert issued, "the policy never planned"
    assert len(issued) == len(set(issued)), "a refused plan was issued again unchanged"
    assert any(r.events and "apply refused" in str(r.events[-1]) for r in policy.records)


def test_no_rollout_before_the_evidence_gate():
    runner = SimRunner(two_ops(), [(1e9, {"x": 4.0, "y": 1.0})])
    policy = TridentPolicy(None, CLUSTER8, TridentSettings.from_options(canaries=False, min_samples=60, regime_duration_s=STEADY))
    seen = {"a": 0, "b": 0}
    for _ in range(10):
        new = runner.advance(2.0)
        for s in new:
            seen[s.operator] += 1
        record = policy.tick(runner.state(), new)
        if record.decision.action == Action.ROLL_OUT:
            assert min(seen.values()) >= 60, f"rolled out on {seen} samples"
            return
        assert record.decision.hold == Hold(HoldKind.WAITING_FOR_SAMPLES), record.decision
    raise AssertionError("never rolled out")


class _ClosedInput(SimRunner):
    def state(self) -> RunnerState:
        return replace(super().state(), input_closed=True)


def test_a_rollout_that_lowers_throughput_is_rolled_back_after_the_input_closed():
    # b is the bottleneck, but more than two replicas of b contend: the model cannot know before trying.
    contention = lambda n: 1.0 if n <= 2 else (2.0 / n) ** 2  # noqa: E731
    runner = _ClosedInput(two_ops(b={"contention": contention}), [(1e9, {"x": 1.0, "y": 4.0})])
    policy = TridentPolicy(None, CLUSTER8, TridentSettings.from_options(canaries=False, verify_ticks=2))
    records = run_ticks(runner, policy, 14)
    actions = [r.decision.action for r in records]
    assert Action.ROLL_OUT in actions and Action.ROLLBACK in actions, [(r.decision.action, r.decision.reason[:100], r.verification) for r in records]
    assert runner.replicas("b") == 2


def test_a_slower_verification_across_a_regime_change_keeps_the_plan():
    # the same contended rollout, but the items turn 3x heavier for b just after it: the throughput after
    # is not comparable with the throughput before, so the plan is kept rather than rolled back
    contention = lambda n: 1.0 if n <= 2 else (2.0 / n) ** 2  # noqa: E731
    runner = _ClosedInput(two_ops(b={"contention": contention}), [(16.0, {"x": 1.0, "y": 4.0}), (1e9, {"x": 1.0, "y": 12.0})])
    policy = TridentPolicy(None, CLUSTER8, TridentSettings.from_options(canaries=False, verify_ticks=2))
    records = run_ticks(runner, policy, 16)
    first = next(k for k, r in enumerate(records) if r.decision.action == Action.ROLL_OUT)
    placed = {o.operator: sum(g.replicas for g in o.groups) for o in records[first].decision.plan.operators}
    verdicts = [r.verification for r in records[first + 1:] if "kept" in r.verification or "rollback" in r.verification]
    assert verdicts and "not comparable" in verdicts[0], [(r.decision.action, r.verification) for r in records]
    # a later move may be judged on its own (with contention and a heavier workload arriving together, the model takes
    # the slowdown for the workload, tries one more replica of b and rolls that back): the first plan stays in place
    assert runner.replicas("b") == placed["b"], [(r.decision.action, r.verification) for r in records]


def test_a_regime_change_while_the_plan_is_being_placed_keeps_it_from_a_rollback():
    # the contended rollout again; a detector announces a new regime on the tick after the rollout, before
    # the plan is in place: the baseline is the old regime's, so the slower measurement is not the plan's
    from trident_flows.scheduler.decision_log import EventKind, TickEvent

    contention = lambda n: 1.0 if n <= 2 else (2.0 / n) ** 2  # noqa: E731
    runner = _ClosedInput(two_ops(b={"contention": contention}), [(1e9, {"x": 1.0, "y": 4.0})])
    policy = TridentPolicy(None, CLUSTER8, TridentSettings.from_options(canaries=False, verify_ticks=2))
    records = []
    while not records or records[-1].decision.action != Action.ROLL_OUT:
        records += run_ticks(runner, policy, 1)
        assert len(records) < 14, [(r.decision.action, r.decision.reason[:80]) for r in records]
    placed, regime = policy.verifier.in_place, policy.regimes.observe
    policy.verifier.in_place = lambda _state, _plan: False
    policy.regimes.observe = lambda _state, _new, events: events.append(TickEvent(EventKind.REGIME_CHANGE, "a", "a: regime 0 -> 1 (injected)"))
    records += run_ticks(runner, policy, 1)
    policy.verifier.in_place, policy.regimes.observe = placed, regime
    records += run_ticks(runner, policy, 10)
    assert Action.ROLLBACK not in [r.decision.action for r in records], [(r.decision.action, r.verification) for r in records]
    assert any("not comparable" in r.verification for r in records), [r.verification for r in records]


class _Spec:
    """Just what the policy reads of a pipeline spec here: the total item count."""

    def __init__(self, items: int) -> None:
        self.items = items

    def operator(self, name: str):
        raise KeyError(name)


class _ItemsLeft(_ClosedInput):
    """Input closed, and the runner has read nothing more: the spec's total is what is left."""

    def state(self) -> RunnerState:
        return replace(super().state(), items_in=0)


def test_a_move_the_remaining_items_cannot_repay_is_not_made():
    policy = TridentPolicy(_Spec(10**6), CLUSTER8, TridentSettings.from_options(canaries=False, regime_duration_s=STEADY))
    assert any(r.decision.action == Action.ROLL_OUT for r in run_ticks(_ItemsLeft(two_ops(), [(1e9, {"x": 4.0, "y": 1.0})]), policy, 6)), \
        "the move pays with many items left"
    # about a second of work left, against a 5 s cold start
    policy = TridentPolicy(_Spec(60), CLUSTER8, TridentSettings.from_options(canaries=False, regime_duration_s=STEADY))
    records = run_ticks(_ItemsLeft(two_ops(), [(1e9, {"x": 4.0, "y": 1.0})]), policy, 6)
    assert not any(r.decision.plan is not None for r in records), [(r.decision.action, r.decision.reason[:160]) for r in records]
    assert any(r.decision.hold == Hold(HoldKind.DOES_NOT_PAY) for r in records), [r.decision.reason[:160] for r in records]


def _tick_with_an_oom(runner: SimRunner, policy: TridentPolicy):
    """One tick whose first sample ran out of memory; the memory-safety move it must issue, for that operator."""
    from trident_flows.core.types import Outcome

    new = runner.advance(2.0)
    new[0] = replace(new[0], outcome=Outcome.OOM)
    record = policy.tick(runner.state(), new)
    assert record.decision.action == Action.ROLL_OUT and record.decision.rationale.kind == PlanKind.MEMORY_SAFETY, record.decision
    return record.decision.plan.for_operator(new[0].operator)


def test_an_operator_that_ran_out_of_memory_is_moved_before_the_evidence_gate():
    runner = SimRunner(two_ops(), [(1e9, {"x": 4.0, "y": 1.0})])
    policy = TridentPolicy(None, CLUSTER8, TridentSettings.from_options(canaries=False, min_samples=10**6))  # the gate never opens
    moved = _tick_with_an_oom(runner, policy)
    assert [(g.config.batch_size, g.replicas) for g in moved.groups] == [(4, 2)]


def _failing_solve(*_args, **_kwargs):
    raise RuntimeError("injected: the solver found no plan")


def test_an_operator_that_ran_out_of_memory_is_moved_when_the_placement_cannot_move_it():
    runner = SimRunner(two_ops(), [(1e9, {"x": 4.0, "y": 1.0})])
    policy = TridentPolicy(None, CLUSTER8, TridentSettings.from_options(canaries=False, min_samples=8), solve=_failing_solve)
    records = run_ticks(runner, policy, 4)
    assert policy.gate.passed(runner.state()) and all(r.decision.plan is None for r in records), [(r.decision.action, r.decision.reason[:100]) for r in records]
    moved = _tick_with_an_oom(runner, policy)
    assert [(g.config.batch_size, g.replicas) for g in moved.groups] == [(4, 2)]


def test_an_operator_that_ran_out_of_memory_is_moved_while_a_rollout_is_verified():
    from trident_flows.core.types import Outcome

    runner = SimRunner(two_ops(), [(1e9, {"x": 4.0, "y": 1.0})])
    policy = TridentPolicy(None, CLUSTER8, TridentSettings.from_options(canaries=False, verify_ticks=5))
    for _ in range(12):
        record = policy.tick(runner.state(), runner.advance(2.0))
        if record.decision.plan is not None:
            runner.apply(record.decision.plan)
        if record.decision.action == Action.ROLL_OUT:
            break
    assert record.decision.action == Action.ROLL_OUT and policy.verifier.pending is not None, record.decision.reason
    new = runner.advance(2.0)
    k = next(i for i, s in enumerate(new) if s.operator == "b")
    new[k] = replace(new[k], outcome=Outcome.OOM)
    record = policy.tick(runner.state(), new)
    assert record.decision.action == Action.ROLL_OUT and record.decision.rationale.kind == PlanKind.MEMORY_SAFETY, (record.decision, record.verification)
    assert all(g.config.batch_size < new[k].config.batch_size for g in record.decision.plan.for_operator("b").groups)
    assert policy.verifier.pending is None and "verification dropped" in record.verification


def test_no_rollout_after_a_workload_change_before_every_operator_has_measured_it():
    from trident_flows.scheduler.decision_log import EventKind

    runner = SimRunner(two_ops(), [(24.0, {"x": 4.0, "y": 1.0}), (1e9, {"x": 1.0, "y": 4.0})])
    policy = TridentPolicy(None, CLUSTER8, TridentSettings.from_options(canaries=False, min_config_samples=40))
    since = None  # samples per operator since the first workload change the policy saw
    for _ in range(40):
        new = runner.advance(2.0)
        if since is not None:
            for s in new:
                since[s.operator] += 1
        record = policy.tick(runner.state(), new)
        if record.decision.plan is not None:
            runner.apply(record.decision.plan)
        if since is None and any(e.kind == EventKind.REGIME_CHANGE for e in record.events):
            since = {"a": 0, "b": 0}
        if since is not None and record.decision.action == Action.ROLL_OUT:
            # without the re-armed gate: a move at the change itself on the old models (a 4/4 split), then a second one
            assert min(since.values()) >= 40, f"rolled out on {since} samples of the new workload"
            assert runner.replicas("b") > runner.replicas("a")
            return
    raise AssertionError(f"no rollout after the workload change ({since})")


def test_a_model_turning_stale_re_arms_the_evidence_gate():
    # a's model turns stale (saturated, measured at half its prediction: a calibrated model) with no
    # feature change seen: the workload moved, so no plan until every operator has measured it
    runner = SimRunner(two_ops(), [(1e9, {"x": 4.0, "y": 1.0})])
    policy = TridentPolicy(None, CLUSTER8, TridentSettings.from_options(canaries=False, min_config_samples=40))
    for _ in range(20):  # settle: the first move made, verified, then nothing left to gain
        record = policy.tick(runner.state(), runner.advance(2.0))
        if record.decision.plan is not None:
            runner.apply(record.decision.plan)
    assert policy.gate.passed(runner.state()) and policy.verifier.pending is None, record.decision.reason
    a, configs = policy.ops["a"], serving_configs(runner.state().operator("a"))
    predicted = sum(a.model.throughput(c, n).mean for c, n in configs)
    end = max(s.end for _, s in a.window)
    a.model.calibrate(SaturatedSpan("a", end - 8.0, end, configs, int(4 * predicted), predicted / 2, False))
    since = {"a": 0, "b": 0}
    for _ in range(12):
        new = runner.advance(2.0)
        record = policy.tick(runner.state(), new)
        for s in new:
            since[s.operator] += 1
        if record.decision.action == Action.ROLL_OUT:
            assert min(since.values()) >= 40, f"rolled out on {since} samples since the model turned stale"
            return
    raise AssertionError(f"no rollout once the new workload was measured ({since})")


def test_a_move_seconds_into_the_first_regime_waits_without_a_prior_for_its_length():
    # the same profitable move: with a 60 s prior for the first regime it is made; without one the
    # regime is expected to last as long again as it has (a few seconds), which cannot repay a cold start
    def first_plan(**options):
        runner = SimRunner(two_ops(), [(1e9, {"x": 4.0, "y": 1.0})])
        records = run_ticks(runner, TridentPolicy(None, CLUSTER8, TridentSettings.from_options(canaries=False, **options)), 5)
        return next((r for r in records if r.decision.plan is not None), None), records

    with_prior, _ = first_plan(regime_duration_s=STEADY)
    assert with_prior is not None and with_prior.decision.action == Action.ROLL_OUT
    without, records = first_plan()
    assert without is None, without.decision
    assert any(r.decision.action == Action.WAIT and r.decision.hold == Hold(HoldKind.DOES_NOT_PAY) for r in records), [r.decision.reason[:100] for r in records]


def test_the_evidence_gate_re_arms_downstream_of_a_change_and_skips_operators_with_no_work_left():
    from trident_flows.scheduler.trident.gate import done_operators

    runner = SimRunner(two_ops(), [(1e9, {"x": 4.0, "y": 1.0})])
    policy = TridentPolicy(None, CLUSTER8, TridentSettings.from_options(canaries=False, min_config_samples=40))
    run_ticks(runner, policy, 10)
    state = runner.state()
    policy.gate.rearm_from(state, "b")  # a change first seen at the last operator: a has already measured those items
    assert [s.split(" ")[0] for s in policy.gate.short_of_evidence(state)] == ["b"]
    policy.gate.rearm_from(state, "a")
    assert [s.split(" ")[0] for s in policy.gate.short_of_evidence(state)] == ["a", "b"]
    # input closed, nothing queued or in flight at a: a takes no more samples and stops holding the gate
    idle = replace(state, input_closed=True, operators=(replace(state.operators[0], queue_items=0,
                   replicas=tuple(replace(r, inflight=0) for r in state.operators[0].replicas)), state.operators[1]))
    assert done_operators(idle) == frozenset({"a"})
    assert done_operators(replace(idle, input_closed=False)) == frozenset()
    assert [s.split(" ")[0] for s in policy.gate.short_of_evidence(idle)] == ["b"]


def test_a_slow_operator_passes_the_evidence_gate_after_evidence_max_s_with_two_samples():
    # b finishes a batch a minute on the new workload: 40 samples would take 40 minutes
    runner = SimRunner(two_ops(), [(1e9, {"x": 4.0, "y": 1.0})])
    policy = TridentPolicy(None, CLUSTER8, TridentSettings.from_options(canaries=False, min_config_samples=40, evidence_max_s=30.0))
    run_ticks(runner, policy, 10)
    state = runner.state()
    short = lambda wall_s: [s.split(" ")[0] for s in policy.gate.short_of_evidence(replace(state, wall_s=wall_s))]  # noqa: E731
    policy.gate.rearm_from(state, "b")
    policy.ops["b"].fed += 2  # two samples of the new workload
    assert short(state.wall_s + 10.0) == ["b"]
    assert short(state.wall_s + 31.0) == []
    policy.gate.rearm_from(state, "b")
    policy.ops["b"].fed += 1  # one sample is no evidence, however long it took
    assert short(state.wall_s + 31.0) == ["b"]


def test_an_operators_own_detection_counts_its_detecting_samples_and_keeps_the_upstream_announcement_clock():
    # a change found at a announces the new workload to b; b's own detector confirms it later with 6 samples:
    # those 6 are evidence, and the slow-evidence clock runs from the announcement
    runner = SimRunner(two_ops(), [(1e9, {"x": 4.0, "y": 1.0})])
    policy = TridentPolicy(None, CLUSTER8, TridentSettings.from_options(canaries=False, min_config_samples=40, evidence_max_s=30.0))
    run_ticks(runner, policy, 10)
    state = runner.state()
    later = replace(state, wall_s=state.wall_s + 31.0)
    short = lambda s: [x.split(" ")[0] for x in policy.gate.short_of_evidence(s)]  # noqa: E731
    policy.gate.rearm_from(state, "a")
    policy.ops["a"].fed += 40  # a measured the new items
    policy.ops["b"].fed += 6
    policy.gate.rearm_from(later, "b", first_new_sample=policy.ops["b"].fed - 6)
    assert short(later) == []
    # without an announcement upstream, b's clock starts at its own detection: 6 samples are not yet enough
    fresh = TridentPolicy(None, CLUSTER8, TridentSettings.from_options(canaries=False, min_config_samples=40, evidence_max_s=30.0))
    run_ticks(SimRunner(two_ops(), [(1e9, {"x": 4.0, "y": 1.0})]), fresh, 10)
    fresh.ops["b"].fed += 6
    fresh.gate.rearm_from(later, "b", first_new_sample=fresh.ops["b"].fed - 6)
    assert [x.split(" ")[0] for x in fresh.gate.short_of_evidence(later)] == ["b"]
    assert [x.split(" ")[0] for x in fresh.gate.short_of_evidence(replace(later, wall_s=later.wall_s + 31.0))] == []


def test_a_verification_keeps_a_plan_that_does_what_the_old_placement_was_predicted_to_do_now():
    # the end-to-end rate fell from 20 to 6 items/s after the rollout, but the previous placement was predicted
    # to do 5 items/s on the current (heavier) workload: the drop is the workload's, not the change's
    from trident_flows.core.types import PlanKind, Rationale
    from trident_flows.scheduler.trident.verifier import Pending

    policy = TridentPolicy(None, CLUSTER8, TridentSettings.from_options(canaries=False, verify_ticks=2))
    policy.verifier.in_place = lambda state, plan: True
    policy.ops.ensure("a")
    plan = Plan((OperatorPlan("a", (ReplicaGroup(A, 2),)),), reason="t")
    for old, kept in ((5.0, True), (19.0, False)):
        policy.verifier.pending = Pending(replace(plan, rationale=Rationale(PlanKind.THROUGHPUT, throughput_before=old, throughput_after=8.0)),
                                   8.0, [20.0, 21.0, 19.0, 20.0], {"a": (ReplicaGroup(A, 1),)}, ())
        policy.verifier.pending.ticks_in_place = 1
        state = runner_state(operators=(_op("a", A, A),))
        verdicts = [policy.verifier.verify(state, m) for m in (6.0, 6.2)]  # verify_ticks=2
        why, rollback = verdicts[-1]
        assert (rollback is None) == kept, why
        assert ("previous placement was predicted" in why) == kept, why


def test_a_residual_shift_does_not_restart_the_regime_clock_that_prices_moves():
    # live, load moved a cheap operator's residuals every few seconds: each shift restarted the regime's
    # clock, and every move was then priced over a regime of a second or two
    from trident_flows.scheduler.regime_change import ChangeKind, RegimeChange

    runner = SimRunner(two_ops(), [(1e9, {"x": 4.0, "y": 1.0})])
    policy = TridentPolicy(None, CLUSTER8, TridentSettings.from_options(canaries=False))
    run_ticks(runner, policy, 10)
    state = runner.state()
    before = policy.regimes.expected_s(state, 1e-9)
    shift = RegimeChange("a", 0, 0, ChangeKind.RESIDUAL, False, 0, 0, {}, "injected load shift")
    policy.ops["a"].detector.observe_many = lambda batch, model, replicas: [shift]
    policy.regimes.observe(state, {"a": [object()]}, [])
    assert policy.regimes.expected_s(state, 1e-9) == before > 5.0


def test_a_regime_that_outlives_the_past_ones_is_expected_to_go_on():
    # live, the b_heavy regime of the moving-bottleneck run was priced over the a_heavy regime's length
    # less its own age: 8, 7, ... 0 s, so the move to b waited until b_heavy had outlasted a_heavy
    policy = TridentPolicy(None, CLUSTER8, TridentSettings.from_options(canaries=False))
    state = runner_state(operators=(_op("a", A),))
    policy.regimes.lengths, policy.regimes.ends = [20.0], 1
    policy.regimes.started = {"a": 100.0}

    def expected(age: float) -> float:
        return policy.regimes.expected_s(replace(state, wall_s=100.0 + age), 1e-9)

    assert expected(2.0) == 18.0  # early on, the past regime's remaining time
    assert expected(15.0) == (5.0 + 15.0) / 2  # later, never less than with this regime counted as lasting as long again
    ages = [0.0, 5.0, 10.0, 15.0, 19.0, 19.9, 20.1, 30.0, 60.0]
    assert all(expected(age) >= 10.0 for age in ages)  # never about to end
    assert expected(30.0) == 30.0 and expected(60.0) == 60.0  # past all the others: as long again as it has lasted
    # with more past regimes the ones that lasted longer weigh more
    policy.regimes.lengths, policy.regimes.ends = [20.0, 40.0, 40.0, 40.0], 4
    assert expected(35.0) == (3 * 5.0 + 35.0) / 4
    # a change that two operators saw is one past regime, not two
    policy.regimes.lengths, policy.regimes.ends = [20.0, 20.0], 1
    assert expected(15.0) == (2 * 5.0 + 2 * 15.0) / 4
