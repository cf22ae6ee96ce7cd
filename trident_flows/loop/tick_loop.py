"""``TickLoop``: one policy ticking against one runner; the CLI's loop, the Prefect sidecar and the simulator pass in what differs.

Contract:
- ``TickLoop(runner, policy, clock, apply=, recorders=, decision_log=, min_samples=0, make_policy=,
  loop_state=)``: ``runner`` has ``state()`` and ``samples(since)``; ``apply(decision)`` hands a
  plan to the runner and returns an ``Applied`` (None when the run ended first); ``make_policy``
  builds the policy when first asked (its exception propagates).
- ``tick()``: state, samples after the cursor, the policy's ``decide`` (timed on ``clock.charge``)
  once ``min_samples`` arrived, cursor moved, the plan applied and its outcome told to the policy;
  the ``Decision`` goes unchanged into the returned ``Tick`` and to the recorders. ``run()`` ticks
  at each ``clock.wait()``.
- One failure rule: a runner call or policy that raises writes an error line, keeps the cursor, goes on.
- One decision log (JSON lines, the fields ``_decided`` lists; a failed write raises ``OutputWriteError`` naming
  its path), and one ``LoopState``: the cursor and
  the counts of decisions, ``applied``, ``applies_refused`` and ``refused_repeated``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from trident_flows.core.decision import Decision
from trident_flows.core.output_errors import naming_the_path
from trident_flows.core.signatures import placement_signature, plan_signature
from trident_flows.core.state import ApplyOutcome, ApplyStatus, RunnerState, SamplePage
from trident_flows.loop.apply import Applied, apply_plan, tell_policy
from trident_flows.loop.clock import Clock
from trident_flows.scheduler.policies import Policy


class Runner(Protocol):
    def state(self) -> RunnerState: ...

    def samples(self, since: int) -> SamplePage: ...


class Recorder:
    """What a loop keeps beside its decision log; every hook does nothing unless overridden."""

    def observed(self, state: RunnerState) -> None:
        """Each state read."""

    def decided(self, state: RunnerState, decision: Decision, applied: Applied, line: dict[str, Any]) -> None:
        """Each decision whose plan was handed to the runner, with what became of it and its decision-log line."""

    def failed(self, line: dict[str, Any]) -> None:
        """Each failed tick, with its decision-log line."""


@dataclass
class LoopState:
    """What a loop carries from tick to tick (see the module docstring)."""

    cursor: int = 0
    ticks: int = 0
    decisions: int = 0
    applied: int = 0
    applies_refused: int = 0
    refused_repeated: int = 0
    errors: int = 0
    refused: set[tuple[Any, Any]] = field(default_factory=set)
    outcomes: list[ApplyOutcome] = field(default_factory=list)


@dataclass(frozen=True)
class Tick:
    """One tick: the state read (None when that failed), the decision (None when the policy was not
    asked or failed), what became of its plan, the decision-log line written, the new samples and
    the error ("" unless the tick failed)."""

    state: RunnerState | None
    decision: Decision | None = None
    applied: Applied | None = None
    line: dict[str, Any] | None = None
    samples: int = 0
    error: str = ""

    @property
    def finished(self) -> bool:
        return self.state is not None and self.state.finished


def _text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class TickLoop:
    """Ticks ``policy`` against ``runner`` (see the module docstring)."""

    def __init__(self, runner: Runner, policy: Policy | None, clock: Clock, *, apply: Callable[[Decision], Applied | None] | None = None,
                 recorders: Sequence[Recorder] = (), decision_log: Path | str | None = None, min_samples: int = 0,
                 make_policy: Callable[[RunnerState], Policy] | None = None, loop_state: LoopState | None = None) -> None:
        if policy is None and make_policy is None:
            raise ValueError("TickLoop needs a policy or make_policy")
        self.runner = runner
        self.policy = policy
        self.clock = clock
        self.apply = apply if apply is not None else (lambda decision: apply_plan(runner.apply, decision.plan))  # type: ignore[attr-defined]
        self.recorders = tuple(recorders)
        self.min_samples = min_samples
        self.make_policy = make_policy
        self.loop_state = loop_state if loop_state is not None else LoopState()
        self.decision_log = Path(decision_log) if decision_log else None
        if self.decision_log is not None:
            with naming_the_path(self.decision_log):
                self.decision_log.parent.mkdir(parents=True, exist_ok=True)
                self.decision_log.write_text("")

    def run(self) -> None:
        """Tick at each ``clock.wait()`` until the run finishes or the clock stops."""
        while self.clock.wait():
            if self.tick().finished:
                return

    def tick(self) -> Tick:
        """Read, decide, apply and record once (see the module docstring)."""
        self.loop_state.ticks += 1
        try:
            state = self.runner.state()
        except Exception as exc:  # noqa: BLE001 - the runner may be busy or gone: the next tick tries again
            return self._failed(None, f"runner call failed: {_text(exc)}")
        for r in self.recorders:
            r.observed(state)
        if state.finished:
            return Tick(state)
        try:
            page = self.runner.samples(self.loop_state.cursor)
        except Exception as exc:  # noqa: BLE001 - as above
            return self._failed(state, f"runner call failed: {_text(exc)}")
        samples = list(page.samples)
        if len(samples) < self.min_samples:
            return Tick(state, samples=len(samples))
        if self.policy is None:
            self.policy = self.make_policy(state)  # type: ignore[misc]
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            decision = self.policy.decide(state, samples)
        except Exception as exc:  # noqa: BLE001 - a failing policy keeps the configuration and the samples
            self.clock.charge(time.process_time() - c0, time.perf_counter() - t0)
            return self._failed(state, f"policy failed: {_text(exc)}", len(samples))
        decided_at, record = time.time(), getattr(self.policy, "last_record", None)
        self.clock.charge(time.process_time() - c0, time.perf_counter() - t0)
        decided_t = self.clock.now()
        self.loop_state.cursor = page.next
        if decision.plan is None:
            return Tick(state, decision, samples=len(samples))
        applied = self._apply(decision)
        if applied is None:  # the run ended before the plan could go to the runner
            return Tick(state, decision, samples=len(samples))
        tell_policy(self.policy, decision.plan, applied.outcome)
        line = self._decided(state, decision, applied, decided_t, decided_at, record)
        return Tick(state, decision, applied, line, len(samples))

    def _apply(self, decision: Decision) -> Applied | None:
        try:
            return self.apply(decision)
        except Exception as exc:  # noqa: BLE001 - an applier that raises refuses the plan
            return Applied(None, ApplyOutcome.refused(_text(exc)), _text(exc))

    def _decided(self, state: RunnerState, decision: Decision, applied: Applied, t: float, at: float, record: Any) -> dict[str, Any]:
        """Count and log one plan handed to the runner: the one place refusals and repeats are counted. ``record``:
        the policy's ``last_record`` as it decided (its ``detail``). The decision-log line holds ``tick, t, at,
        policy, reason`` (the plan's), ``plan, [detail], apply, outcome, refused_repeated``; a failed tick's line
        (``_failed``) holds ``tick, t, at, policy, error``."""
        s, outcome, plan = self.loop_state, applied.outcome, decision.plan
        key = (plan_signature(plan), placement_signature(state))
        repeated = key in s.refused
        detail = {"detail": record.to_dict()} if hasattr(record, "to_dict") else {}
        line = {"tick": s.ticks, "t": round(t, 3), "at": at, "policy": self.policy.name, "reason": plan.reason or "plan without a reason",
                "plan": plan.to_dict(), **detail, "apply": applied.report.to_dict() if applied.report is not None else None,
                "outcome": outcome.to_dict(), "refused_repeated": repeated}
        s.decisions += 1
        s.outcomes.append(outcome)
        s.applied += int(outcome.status == ApplyStatus.LANDED and outcome.changed)
        s.refused_repeated += int(repeated)
        if outcome.status != ApplyStatus.LANDED:
            s.applies_refused += 1
            s.refused.add(key)
        self._log(line)
        for r in self.recorders:
            r.decided(state, decision, applied, line)
        return line

    def _failed(self, state: RunnerState | None, error: str, samples: int = 0) -> Tick:
        self.loop_state.errors += 1
        line = {"tick": self.loop_state.ticks, "t": round(self.clock.now(), 3), "at": time.time(),
                "policy": getattr(self.policy, "name", None), "error": error}
        self._log(line)
        for r in self.recorders:
            r.failed(line)
        return Tick(state, line=line, samples=samples, error=error)

    def _log(self, line: dict[str, Any]) -> None:
        if self.decision_log is not None:
            with naming_the_path(self.decision_log), self.decision_log.open("a") as f:
                f.write(json.dumps(line, default=str) + "\n")
