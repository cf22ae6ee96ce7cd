"""What a control loop keeps during a run for the account at its end (``control.account``).

Contract:
- ``RunRecord.observe(state, at=None)`` keeps one ``CountPoint`` per tick (wall-clock time, each
  operator's cumulative items taken and serving replicas, input items done); at ``MAX_POINTS``
  every other point is dropped, so the record stays small while covering the whole run.
- ``RunRecord.decided(state, decision, applied, at)`` keeps one ``DecisionTaken`` per plan handed
  to the runner: when, its kind (``Rationale.kind``; ``rebalance`` without one), what it changes
  (``core.changes``), its reason, how the apply ended (``landed``, ``partial``, ``refused``; a
  landed apply that changed nothing is ``refused``), when its last step finished, and the configs
  a memory-safety move moves off.
- Plain data: the record is pickled with the Prefect sidecar's memory between ticks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from trident_flows.core.changes import OperatorChange, changes_of
from trident_flows.core.decision import Decision
from trident_flows.core.state import ApplyStatus, RunnerState
from trident_flows.core.types import OpConfig
from trident_flows.loop.apply import Applied

MAX_POINTS = 2000
REBALANCE = "rebalance"  # the kind of a plan without a rationale (the baseline policies)


@dataclass(frozen=True)
class CountPoint:
    """The pipeline at one tick: wall-clock time, per operator items taken (cumulative) and serving replicas, input items done."""

    at: float
    items_in: tuple[tuple[str, int], ...]
    replicas: tuple[tuple[str, int], ...]
    items_done: int


@dataclass(frozen=True)
class DecisionTaken:
    """One plan handed to the runner and how its apply ended (see the module docstring)."""

    at: float
    kind: str
    changes: tuple[OperatorChange, ...]
    reason: str
    status: str
    status_reason: str
    landed_at: float | None
    unsafe: tuple[tuple[str, OpConfig], ...] = ()

    @property
    def operators(self) -> tuple[str, ...]:
        return tuple(c.operator for c in self.changes)


@dataclass
class RunRecord:
    """Count points and decisions of one run (see the module docstring)."""

    points: list[CountPoint] = field(default_factory=list)
    decisions: list[DecisionTaken] = field(default_factory=list)

    def observe(self, state: RunnerState, at: float | None = None) -> None:
        if len(self.points) >= MAX_POINTS:
            self.points[:] = self.points[::2]
        self.points.append(CountPoint(time.time() if at is None else at, tuple((o.name, o.items_in) for o in state.operators),
                                      tuple((o.name, sum(o.configs().values())) for o in state.operators),
                                      state.items_written + state.items_dead_lettered))

    def decided(self, state: RunnerState, decision: Decision, applied: Applied, at: float) -> DecisionTaken:
        plan, rationale = decision.plan, decision.rationale
        outcome = applied.outcome
        status, why = outcome.status.value, outcome.reason or applied.error
        if outcome.status == ApplyStatus.LANDED and not outcome.changed:
            status, why = ApplyStatus.REFUSED.value, "the runner found nothing to roll out: the plan equals the running configuration"
        report = applied.report
        landed_at = report.started_at + report.seconds if report is not None and report.started_at > 0 and outcome.changed else None
        taken = DecisionTaken(at, rationale.kind.value if rationale is not None else REBALANCE, changes_of(state, plan),
                              plan.reason or decision.reason, status, why, landed_at, rationale.unsafe if rationale is not None else ())
        self.decisions.append(taken)
        return taken
