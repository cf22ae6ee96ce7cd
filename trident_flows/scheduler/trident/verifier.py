"""The verifier of the Trident policy: a rollout is measured once in place and rolled back when it made things worse.

Contract:
- ``start(state, plan, predicted, before)`` puts a rolled-out plan under verification (``before``:
  the end-to-end throughputs of the ticks before it); ``pending`` is that plan (None: none).
- ``verify(state, measured)`` every tick returns what the verification says and the rollback plan,
  if any: the plan must be in place within ``apply_grace_ticks`` (else dropped), settled, then the
  next ``verify_ticks`` ticks are compared with those before. A worse plan is rolled back
  (``ROLLBACK`` rationale, canaries kept) and remembered as rejected in its regime, unless the
  workload changed meanwhile, the throughput is within ``VERIFY_TOLERANCE`` of the previous
  placement's prediction, or the previous placement ran unsafe configs.
- ``rejected(plan)``: rolled back before in the current regimes. ``drop()`` ends a verification;
  ``observe_apply(plan, outcome)`` ends it when the plan did not land at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from trident_flows.core.state import ApplyOutcome, RunnerState
from trident_flows.core.types import OpConfig, OperatorPlan, Plan, PlanKind, Rationale
from trident_flows.scheduler.replicas import canary_config, serving_groups
from trident_flows.scheduler.throughput_measure import placement_settled
from trident_flows.scheduler.trident.operators import Operators, plan_key
from trident_flows.scheduler.trident.safety import MemorySafety
from trident_flows.scheduler.trident_settings import VerifySettings

# A verification keeps a plan whose end-to-end throughput after is within this share of what the previous
# placement was predicted to do on the current workload, however far under the throughput before it fell.
VERIFY_TOLERANCE = 0.05


@dataclass
class Pending:
    """A rolled-out plan under verification."""

    plan: Plan
    predicted: float
    before: list        # end-to-end items/s of the ticks before the change
    previous: dict
    regime_key: tuple
    ticks_waiting: int = 0
    ticks_in_place: int = 0
    measured: list = field(default_factory=list)
    workload_changed: bool = False  # a features regime change was seen while it was measured


class Verifier:
    """The rollout under verification and the plans rolled back (see the module docstring)."""

    def __init__(self, settings: VerifySettings, ops: Operators, safety: MemorySafety) -> None:
        self.settings = settings
        self.ops = ops
        self.safety = safety
        self.pending: Pending | None = None
        self._rejected: set = set()

    def start(self, state: RunnerState, plan: Plan, predicted: float, before: list[float]) -> None:
        previous = {o.operator: serving_groups(state.operator(o.operator)) for o in plan.operators}
        self.pending = Pending(plan, predicted, before, previous, self.ops.regime_key())

    def drop(self) -> None:
        self.pending = None

    def mark_workload_changed(self) -> bool:
        """A features regime change was seen: a plan under verification is not compared with the ticks
        before it. Returns whether one is under verification."""
        if self.pending is None:
            return False
        self.pending.workload_changed = True
        return True

    def rejected(self, plan: Plan) -> bool:
        return (self.ops.regime_key(), plan_key(plan)) in self._rejected

    def in_place(self, state: RunnerState, plan: Plan) -> bool:
        for o in plan.operators:
            target: dict[OpConfig, int] = {}
            for g in o.groups:
                if g.replicas:
                    target[g.config] = target.get(g.config, 0) + g.replicas
            op = state.operator(o.operator)
            if op.configs() != target or any(not r.warm for r in op.active):
                return False
        return True

    def verify(self, state: RunnerState, measured: float) -> tuple[str, Plan | None]:
        p = self.pending
        if p is None:
            return "", None
        if not self.in_place(state, p.plan):
            p.ticks_waiting += 1
            if p.ticks_waiting > self.settings.apply_grace_ticks:
                self.pending = None
                return f"the plan was not in place after {self.settings.apply_grace_ticks} ticks (refused or failed): dropped", None
            return "waiting for the plan to be in place", None
        if (p.ticks_in_place == 0 and p.ticks_waiting < self.settings.apply_grace_ticks
                and not placement_settled(state, (o.operator for o in p.plan.operators))):
            p.ticks_waiting += 1
            return "plan in place; waiting for every replica's first batch (until then the output is the old placement's)", None
        p.ticks_in_place += 1
        if p.ticks_in_place == 1:  # this tick's interval still spans the rollout
            return "plan in place; measuring from the next tick", None
        p.measured.append(measured)
        if len(p.measured) < self.settings.ticks:
            return f"measuring ({len(p.measured)}/{self.settings.ticks}): {measured:.4g} items/s end to end", None
        self.pending = None
        worse, figures = worse_than_before(p.before, p.measured, self.settings.z)
        if not worse:
            return f"verified: {figures}; predicted {p.predicted:.4g} input items/s", None
        if p.workload_changed:
            return (f"slower ({figures}) but kept: the workload changed regime while it was measured, so before and after "
                    f"are not comparable"), None
        old = p.plan.rationale.throughput_before if p.plan.rationale is not None else None
        after = sum(p.measured) / len(p.measured)
        if old is not None and after >= old * (1 - VERIFY_TOLERANCE):
            # the workload slowed while the change was made (the sink still drained a lighter regime's items
            # before it): the old placement was predicted to do no better now, so the drop is not the change's
            return (f"slower ({figures}) but kept: at least the {old:.4g} input items/s the previous placement was "
                    f"predicted to do on the current workload"), None
        unsafe = [f"{name} {g.config.label()}" for name, groups in p.previous.items() for g in groups if self.safety.unsafe(name, g.config)]
        if unsafe:
            return f"slower ({figures}) but kept: the previous placement ran unsafe configs ({', '.join(unsafe)})", None
        self._rejected.add((p.regime_key, plan_key(p.plan)))
        why = f"rollback: the change made the pipeline slower ({figures})"
        ops = tuple(OperatorPlan(name, groups, why, canary_config(state.operator(name))) for name, groups in p.previous.items() if groups)
        before = p.before or p.measured  # as worse_than_before compares them
        rationale = Rationale(PlanKind.ROLLBACK, measured_before=sum(before) / len(before), measured_after=sum(p.measured) / len(p.measured))
        return why + "; restoring the previous placement", Plan(ops, 0.0, why + "; restoring the previous placement", rationale)

    def observe_apply(self, plan: Plan, outcome: ApplyOutcome) -> None:
        """A plan that did not land fully: the one under verification is dropped when nothing of it changed."""
        if self.pending is not None and plan_key(self.pending.plan) == plan_key(plan) and not outcome.changed:
            self.pending = None


def worse_than_before(before: Sequence[float], after: Sequence[float], z: float) -> tuple[bool, str]:
    """Whether the per-tick throughputs ``after`` a change are below those ``before`` it beyond their
    noise: mean after < mean before - ``z`` standard errors of the difference (Welch), and at
    least 5% lower (a smaller loss is within what one tick's batch boundaries move). With fewer
    than 2 ticks before, the ticks after give the noise of both. Returns the verdict and figures."""
    a = [float(x) for x in after]
    b = [float(x) for x in before] or a
    mean_a, mean_b = sum(a) / len(a), sum(b) / len(b)
    var_a = sum((x - mean_a) ** 2 for x in a) / max(1, len(a) - 1)
    var_b = sum((x - mean_b) ** 2 for x in b) / max(1, len(b) - 1) if len(b) >= 2 else var_a
    se = math.sqrt(var_a / len(a) + var_b / len(b))
    worse = mean_a < mean_b - z * se and mean_a < 0.95 * mean_b
    figures = (f"{mean_a:.4g} items/s end to end over {len(a)} ticks after vs {mean_b:.4g} over {len(b)} before, "
               f"noise {se:.3g} (x{z:g})")
    return worse, figures
