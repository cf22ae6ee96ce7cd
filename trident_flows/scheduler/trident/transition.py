"""The transition step of the Trident policy: roll the MILP's plan out now, or wait, and why.

Contract: ``decide(state, placed) -> Decision`` compares the MILP's plan with the running
placement; the first rule that applies decides:
- no operator changes: hold ``OPTIMAL``;
- with ``max_changes``, at most that many operators change (growing, then most saturated, first;
  none fits: ``MAX_CHANGES``);
- a plan rolled back before in the current regimes: ``ROLLED_BACK_BEFORE``;
- the change is ordered as the runner orders it and priced over the time it can pay off (the
  regime's expected remaining time, the items known ahead, the run's time left); unpriceable:
  ``CANNOT_PRICE``;
- moving off an unsafe config rolls out whatever its gain (``MEMORY_SAFETY``);
- else ``ROLL_OUT`` only when the pricing says so (else ``NO_GAIN`` / ``DOES_NOT_PAY``) and the gain
  is at least ``min_gain`` (else ``UNDER_MIN_GAIN``), with a ``THROUGHPUT`` rationale.
"""

from __future__ import annotations

import math
from dataclasses import replace

from trident_flows.core.decision import Decision, Hold, HoldKind
from trident_flows.core.state import RunnerState
from trident_flows.core.types import OperatorPlan, PlanKind, Rationale, TransitionVerdict
from trident_flows.scheduler.placement.inputs import current_placement
from trident_flows.scheduler.placement.transition_cost import plan_transition
from trident_flows.scheduler.replicas import held
from trident_flows.scheduler.trident.operators import replica_counts
from trident_flows.scheduler.trident.pace import Pace
from trident_flows.scheduler.trident.placement_step import Placed
from trident_flows.scheduler.trident.regimes import Regimes
from trident_flows.scheduler.trident.source_regimes import SourceRegimes
from trident_flows.scheduler.trident.verifier import Verifier
from trident_flows.scheduler.trident_settings import TransitionSettings


class TransitionStep:
    """Whether the MILP's plan is rolled out now (see the module docstring)."""

    def __init__(self, settings: TransitionSettings, regimes: Regimes, pace: Pace, verifier: Verifier, sources: SourceRegimes) -> None:
        self.settings = settings
        self.regimes = regimes
        self.sources = sources
        self.pace = pace
        self.verifier = verifier

    def decide(self, state: RunnerState, placed: Placed) -> Decision:
        demands, cluster, result, forced, notes = placed
        plan = result.plan
        current = current_placement(state)
        rate = self.pace.completion_rate() or result.throughput
        # the regime lasts at least until the items of it the source already read have passed the pipeline's end
        expected = max(self.regimes.expected_s(state, rate), self.sources.known_ahead(state) / rate if rate > 0 else 0.0)
        changed = [o for o in plan.operators if dict(replica_counts(o.groups)) != dict(replica_counts(current.for_operator(o.operator)))]
        if not changed:
            return Decision.no_change(f"the current placement is the MILP's optimum ({plan.reason})", Hold(HoldKind.OPTIMAL), plan.predicted_throughput)
        limited = ""
        if self.settings.max_changes is not None and len(changed) > self.settings.max_changes:
            changed = self._limit_changes(state, changed)
            limited = f"; limited to {len(changed)} operator change(s) per plan (max_changes={self.settings.max_changes})"
            if not changed:
                return Decision.wait(f"the MILP's plan changes operators but max_changes={self.settings.max_changes} allows none ({plan.reason})",
                                     Hold(HoldKind.MAX_CHANGES), result.throughput)
        plan = replace(plan, operators=tuple(changed), reason=plan.reason + limited)
        if self.verifier.rejected(plan):
            return Decision.wait(f"the MILP's plan was rolled back before in this regime: keeping the current placement ({plan.reason})",
                                 Hold(HoldKind.ROLLED_BACK_BEFORE), result.throughput)
        named = {o.operator for o in changed}
        executed = replace(result.plan, operators=tuple(o if o.operator not in named else next(c for c in changed if c.operator == o.operator)
                                                        for o in result.plan.operators if o.operator in named)
                           + tuple(OperatorPlan(o.operator, current.for_operator(o.operator), "unchanged")
                                   for o in result.plan.operators if o.operator not in named))
        try:  # the same ordering the runner executes: a plan that cannot be ordered is never issued
            transition = plan_transition(demands, cluster, current, executed, expected, benefit_ratio=self.settings.benefit_ratio,
                                         run_left_s=self.pace.run_left_s(state))
        except (ValueError, RuntimeError) as exc:
            return Decision.wait(f"cannot order or price the change ({exc}); keeping the current placement", Hold(HoldKind.CANNOT_PRICE),
                                 result.throughput)
        t_now = result.throughput - transition.expected_gain
        gain = transition.expected_gain / t_now if t_now > 0 else math.inf
        figures = dict(throughput_before=t_now, throughput_after=result.throughput, rollout_s=transition.rollout_s,
                       switch_cost_items=transition.cost_items, bottlenecks=result.bottlenecks)
        if forced:  # safety comes before gain, but only with a feasible order; the price is recorded
            runs = "; ".join(f"{name} runs {config.label()}: {why}" for name, config, why in forced)
            rationale = Rationale(PlanKind.MEMORY_SAFETY, **figures, unsafe=tuple((name, config) for name, config, _ in forced))
            return Decision.roll_out(replace(plan, rationale=rationale), f"memory safety: {runs}; {transition.reason}; new placement {plan.reason}",
                                     result.throughput)
        if transition.verdict != TransitionVerdict.ROLL_OUT:
            kind = HoldKind.NO_GAIN if transition.expected_gain <= 0 else HoldKind.DOES_NOT_PAY
            return Decision.wait(f"{transition.reason} ({plan.reason})", Hold(kind), result.throughput)
        if gain < self.settings.min_gain:
            return Decision.wait(f"predicted gain {gain:+.1%} ({t_now:.4g} -> {result.throughput:.4g} items/s) is under min_gain "
                                 f"{self.settings.min_gain:.0%}: keeping the current placement", Hold(HoldKind.UNDER_MIN_GAIN, gain, self.settings.min_gain),
                                 result.throughput)
        head = f"predicted {t_now:.4g} -> {result.throughput:.4g} input items/s ({gain:+.1%}); {transition.reason}"
        if notes:
            head += "; " + "; ".join(notes)
        return Decision.roll_out(replace(plan, reason=f"{head}; {plan.reason}", rationale=Rationale(PlanKind.THROUGHPUT, **figures)),
                                 f"{head}; {plan.reason}", result.throughput)

    def _limit_changes(self, state: RunnerState, changed: list[OperatorPlan]) -> list[OperatorPlan]:
        """At most ``max_changes`` operator plans, operators that grow first (a plan that only shrinks
        gains nothing), most saturated first, keeping the cluster's CPUs/GPUs."""
        used_cpus, used_gpus = state.used_cpus, state.used_gpus
        kept = []
        grows = lambda o: sum(n for _, n in replica_counts(o.groups)) > sum(state.operator(o.operator).configs().values())  # noqa: E731
        for o in sorted(changed, key=lambda o: (not grows(o), -state.operator(o.operator).busy_fraction)):
            if len(kept) == self.settings.max_changes:
                break
            new_cpus, new_gpus = held(dict(replica_counts(o.groups)))
            old_cpus, old_gpus = held(state.operator(o.operator).configs())
            d_cpus, d_gpus = new_cpus - old_cpus, new_gpus - old_gpus
            if used_cpus + d_cpus <= state.cluster_cpus + 1e-9 and used_gpus + d_gpus <= state.cluster_gpus + 1e-9:
                kept.append(o)
                used_cpus += d_cpus
                used_gpus += d_gpus
        return kept
