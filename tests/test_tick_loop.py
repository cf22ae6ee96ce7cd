"""The one tick loop (loop/tick_loop.py) on a scripted runner: no Ray, no simulator."""

from __future__ import annotations

import json
import threading
from dataclasses import replace

import pytest
from builders import operator_state, replica_state, runner_state

from trident_flows.core.decision import Decision
from trident_flows.core.output_errors import OutputWriteError
from trident_flows.core.state import ApplyReport, ApplyStatus, RunnerState, SamplePage
from trident_flows.core.types import OpConfig, OperatorPlan, Plan, ReplicaGroup
from trident_flows.loop.apply import Applied
from trident_flows.loop.clock import WallClock
from trident_flows.loop.tick_loop import Recorder, TickLoop

B8 = OpConfig.make("cpu", batch_size=8)
PLAN = Plan((OperatorPlan("parse", (ReplicaGroup(B8, 3),), "grow parse"),), reason="grow parse")
GROW = Decision.roll_out(PLAN, "grow parse: busy")


def _state(finished: bool = False) -> RunnerState:
    replicas = tuple(replica_state(replica_id=f"r{k}", config=B8, inflight=1, busy_fraction=0.9, batches=10) for k in range(2))
    return runner_state(operators=(operator_state(name="parse", replicas=replicas, items_in=10, items_out=10, busy_fraction=0.9),), items_in=10,
                        items_written=10, rows_written=10, finished=finished, wall_s=5.0, throughput=2.0)


class Runner:
    """Three new samples (plain numbers) per call; ``apply`` lands, or raises when told to refuse."""

    def __init__(self, refuse: str = "") -> None:
        self.now = _state()
        self.refuse = refuse
        self.applied: list[Plan] = []
        self.calls = 0

    def state(self) -> RunnerState:
        self.calls += 1
        return self.now

    def samples(self, since: int) -> SamplePage:
        return SamplePage(tuple(range(since, since + 3)), since + 3)

    def apply(self, plan: Plan) -> ApplyReport:
        if self.refuse:
            raise ValueError(self.refuse)
        self.applied.append(plan)
        return ApplyReport(({"kind": "start"},), 1.5, 10.0, 9.0, 0.1)


class Policy:
    """Returns ``decision`` every tick (``GROW``: roll ``PLAN`` out); raises at the ticks in ``fail_at``; records what it sees and is told."""

    name = "scripted"

    def __init__(self, decision: Decision = GROW, fail_at: tuple[int, ...] = ()) -> None:
        self.decision = decision
        self.fail_at = fail_at
        self.seen: list[tuple] = []
        self.told: list = []

    def decide(self, state, samples):
        self.seen.append(tuple(samples))
        if len(self.seen) in self.fail_at:
            raise RuntimeError("the policy failed")
        return self.decision

    def observe_apply(self, plan, outcome):
        self.told.append(outcome.status)


class Kept(Recorder):
    def __init__(self) -> None:
        self.observed_n, self.decided_lines, self.decisions, self.failed_lines = 0, [], [], []

    def observed(self, state):
        self.observed_n += 1

    def decided(self, state, decision, applied, line):
        self.decided_lines.append(line)
        self.decisions.append(decision)

    def failed(self, line):
        self.failed_lines.append(line)


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_landed_plan_is_logged_counted_told_and_moves_the_cursor(tmp_path):
    runner, policy, kept = Runner(), Policy(), Kept()
    loop = TickLoop(runner, policy, WallClock(), recorders=(kept,), decision_log=tmp_path / "d.jsonl")
    tick = loop.tick()
    assert tick.decision is GROW and kept.decisions == [GROW]  # the policy's decision, unchanged
    assert tick.applied.outcome.status == ApplyStatus.LANDED and tick.samples == 3 and not tick.error
    assert runner.applied == [PLAN] and policy.told == [ApplyStatus.LANDED]
    s = loop.loop_state
    assert (s.cursor, s.ticks, s.decisions, s.applied, s.applies_refused, s.refused_repeated) == (3, 1, 1, 1, 0, 0)
    (line,) = _lines(tmp_path / "d.jsonl")
    assert {"tick", "t", "at", "policy", "reason", "plan", "apply", "outcome", "refused_repeated"} <= set(line)
    assert (line["tick"], line["policy"], line["reason"], line["apply"]["steps_done"], line["outcome"]["status"], line["refused_repeated"]) == (
        1, "scripted", "grow parse", [{"kind": "start"}], "landed", False)
    assert kept.observed_n == 1 and kept.decided_lines == [line]


def test_a_tick_without_a_plan_writes_nothing_but_moves_the_cursor(tmp_path):
    loop = TickLoop(Runner(), Policy(Decision.no_change()), WallClock(), decision_log=tmp_path / "d.jsonl")
    tick = loop.tick()
    assert tick.decision == Decision.no_change() and tick.applied is None and tick.line is None
    assert loop.loop_state.cursor == 3 and (tmp_path / "d.jsonl").read_text() == ""


def test_a_decision_log_that_cannot_be_written_fails_naming_its_path():
    loop = TickLoop(Runner(), Policy(), WallClock(), decision_log="/dev/full")  # a full device: ENOSPC names no file
    with pytest.raises(OutputWriteError, match="cannot write /dev/full: No space left on device"):
        loop.tick()


def test_a_refused_plan_issued_again_unchanged_is_counted_once_as_repeated(tmp_path):
    runner, policy = Runner(refuse="needs 3 CPUs, 2 free"), Policy()
    loop = TickLoop(runner, policy, WallClock(), decision_log=tmp_path / "d.jsonl")
    first, second = loop.tick(), loop.tick()
    assert second.applied.outcome.status == ApplyStatus.REFUSED
    assert first.applied.report is None and first.applied.error == "ValueError: needs 3 CPUs, 2 free"
    assert policy.told == [ApplyStatus.REFUSED, ApplyStatus.REFUSED]  # a refusal goes back to the policy
    s = loop.loop_state
    assert (s.decisions, s.applied, s.applies_refused, s.refused_repeated) == (2, 0, 2, 1)
    assert [line["refused_repeated"] for line in _lines(tmp_path / "d.jsonl")] == [False, True]
    assert [line["apply"] for line in _lines(tmp_path / "d.jsonl")] == [None, None]
    runner.now = replace(runner.now, items_in=11)  # a placement unchanged, other counts: still the same plan against it
    loop.tick()
    assert loop.loop_state.refused_repeated == 2


def test_a_failing_policy_logs_an_error_keeps_the_cursor_and_the_next_tick_gets_the_same_samples(tmp_path):
    policy, kept = Policy(fail_at=(1,)), Kept()
    loop = TickLoop(Runner(), policy, WallClock(), recorders=(kept,), decision_log=tmp_path / "d.jsonl")
    failed = loop.tick()
    assert failed.error == "policy failed: RuntimeError: the policy failed" and failed.decision is None and not failed.finished
    assert loop.loop_state.cursor == 0 and loop.loop_state.errors == 1
    ok = loop.tick()
    assert ok.applied is not None and policy.seen[0] == policy.seen[1] == (0, 1, 2)  # not lost with the failed tick
    lines = _lines(tmp_path / "d.jsonl")
    assert lines[0] == kept.failed_lines[0] and lines[0]["error"] == failed.error and lines[0]["policy"] == "scripted"
    assert "outcome" in lines[1]


class _Method:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        return self.fn(*args)


class _DeadRunner:
    """A Ray handle whose every call fails, like a runner that is gone or unreachable."""

    def __getattr__(self, name):
        def fail(*_args):
            raise ConnectionError(f"runner unreachable ({name})")
        return _Method(fail)


def test_the_loop_survives_a_failing_runner_call_and_logs_it(tmp_path):
    from trident_flows.control.loop import RayRunner  # through a Ray handle, as the CLI's loop reads it

    policy = Policy()
    loop = TickLoop(RayRunner(_DeadRunner()), policy, WallClock(), decision_log=tmp_path / "d.jsonl")
    first, second = loop.tick(), loop.tick()
    assert "runner unreachable (state)" in first.error and first.error.startswith("runner call failed: ConnectionError")
    assert first.state is None and first.decision is None and second.error == first.error
    assert loop.loop_state.cursor == 0 and loop.loop_state.ticks == 2 and not first.finished and policy.seen == []
    assert [line["error"] for line in _lines(tmp_path / "d.jsonl")] == [first.error, second.error]


def test_fewer_new_samples_than_min_samples_do_not_ask_the_policy_nor_move_the_cursor():
    policy = Policy()
    loop = TickLoop(Runner(), policy, WallClock(), min_samples=4)
    tick = loop.tick()
    assert tick.decision is None and tick.samples == 3 and not tick.error
    assert policy.seen == [] and loop.loop_state.cursor == 0


def test_a_finished_run_is_observed_but_not_decided_on():
    runner, policy, kept = Runner(), Policy(), Kept()
    runner.now = _state(finished=True)
    loop = TickLoop(runner, policy, WallClock(), recorders=(kept,))
    tick = loop.tick()
    assert tick.finished and tick.decision is None and policy.seen == [] and kept.observed_n == 1


def test_a_plan_the_applier_does_not_hand_over_is_neither_counted_nor_told():
    policy = Policy()
    loop = TickLoop(Runner(), policy, WallClock(), apply=lambda decision: None)  # the run ended while the policy decided
    tick = loop.tick()
    assert tick.decision == GROW and tick.applied is None and tick.line is None
    assert policy.told == [] and loop.loop_state.decisions == 0 and loop.loop_state.cursor == 3


def test_an_applier_that_raises_refuses_the_plan():
    def broken(decision: Decision) -> Applied:
        raise ConnectionError("task failed")

    policy = Policy()
    tick = TickLoop(Runner(), policy, WallClock(), apply=broken).tick()
    assert tick.applied.outcome.status == ApplyStatus.REFUSED and tick.applied.error == "ConnectionError: task failed"
    assert policy.told == [ApplyStatus.REFUSED]


def test_the_policy_is_built_at_the_first_tick_that_asks_and_options_it_refuses_fail_the_tick_not_a_log_line(tmp_path):
    import re

    from trident_flows.core.types import ClusterSpec
    from trident_flows.scheduler.policies import make_policy

    built = []
    loop = TickLoop(Runner(), None, WallClock(), min_samples=4, make_policy=lambda state: built.append(state) or Policy())
    loop.tick()
    assert built == [] and loop.policy is None  # not asked: fewer samples than min_samples
    loop.min_samples = 0
    loop.tick()
    assert len(built) == 1 and loop.policy.seen == [(0, 1, 2)]
    # a misspelt option is the caller's mistake: it stops the loop at once instead of failing each tick quietly
    cluster = ClusterSpec.single_node(8, 0)
    bad = TickLoop(Runner(), None, WallClock(), decision_log=tmp_path / "d.jsonl",
                   make_policy=lambda state: make_policy("trident", spec=None, cluster=cluster, verify_tick=2))
    with pytest.raises(ValueError, match=re.escape("trident: unknown option 'verify_tick' (did you mean 'verify_ticks'?)")):
        bad.tick()
    assert (tmp_path / "d.jsonl").read_text() == ""
    with pytest.raises(ValueError, match="needs a policy or make_policy"):
        TickLoop(Runner(), None, WallClock())


class _Ticks:
    """A clock that ticks ``n`` times and charges nothing."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.charged: list[float] = []

    def now(self) -> float:
        return 100.0

    def wait(self) -> bool:
        self.n -= 1
        return self.n >= 0

    def charge(self, cpu_s: float, wall_s: float) -> None:
        self.charged.append(cpu_s)


def test_run_ticks_at_each_clock_tick_until_the_run_finishes():
    runner, clock = Runner(), _Ticks(10)
    loop = TickLoop(runner, Policy(Decision.no_change()), clock)
    loop.run()
    assert loop.loop_state.ticks == 10 and len(clock.charged) == 10
    runner.now, clock.n = _state(finished=True), 10
    loop.run()  # the clock would tick 10 more times; the first tick sees the run finished and ends it
    assert loop.loop_state.ticks == 11 and clock.n == 9


def test_the_wall_clock_stops_at_once_when_told():
    clock = WallClock(tick_s=30.0)
    threading.Timer(0.05, clock.stop).start()
    assert clock.wait() is False
    with pytest.raises(ValueError, match="tick_s must be > 0"):
        WallClock(0)
