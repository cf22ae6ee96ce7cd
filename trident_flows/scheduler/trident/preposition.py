"""Pre-positioning: each operator moved to a known regime's allocation before that regime's items reach it.

Contract:
- ``plan(state) -> Plan | None``: per operator, the segment it works on next (``SourceRegimes``:
  the one at its stream position, or the next when it arrives within a cold start plus a tick);
  when that segment's regime is known (an earlier run, or an earlier segment) and its
  ``RegimePlan`` gives the operator other groups, the operator moves to them, provided the plan is worth it: a plan
  from memory is applied at once (an earlier run verified it); one of this run, where the models can tell
  (``RegimePlans.gain``), must predict ``MARGIN`` more throughput on the regime's items than the allocation running
  when the segment is first met, and the move must pay for its cold starts within the segment
  (``RegimePlans.transition`` over ``SourceRegimes.span`` items at the plan's rate, ``benefit_ratio`` as the
  transition step's). Decided once per segment, for every operator; ``skipped`` counts the segments declined.
  Each operator moves
  at most once per segment and never back (``positioned``); never to an unsafe config nor to one
  below its in-flight depth (``BatchDepth.too_small``); a
  saturated operator is not shrunk; GPU growth only where it packs device by device (else no
  operator moves for that regime this tick); moves beyond the cluster's CPUs/GPUs wait.
- The plan is a ``REGIME_PLAN`` rollout; its reason names the regime, where its items are and the
  plan's origin. ``moves`` counts the operators moved.
"""

from __future__ import annotations

from trident_flows.core.state import RunnerState
from trident_flows.core.types import OpConfig, OperatorPlan, Plan, PlanKind, Rationale, TransitionVerdict
from trident_flows.scheduler.occupancy import Occupancy, classify
from trident_flows.scheduler.replicas import gpus_pack, held, replica_groups
from trident_flows.scheduler.throughput_measure import stream_positions
from trident_flows.scheduler.trident.batch_depth import BatchDepth
from trident_flows.scheduler.trident.context import Context
from trident_flows.scheduler.trident.operators import ColdStarts
from trident_flows.scheduler.trident.pace import Pace
from trident_flows.scheduler.trident.regime_plans import RegimePlan, RegimePlans
from trident_flows.scheduler.trident.safety import MemorySafety
from trident_flows.scheduler.trident.source_regimes import Segment, SourceRegimes

RATE_TICKS = 5  # ticks over which an operator's intake rate is measured
MARGIN = 0.05  # a regime's plan is pre-positioned only when the models predict it this much faster on the regime's items


class PrePositioning:
    """Moves operators ahead of a known regime's items (see the module docstring)."""

    def __init__(self, ctx: Context, sources: SourceRegimes, plans: RegimePlans, *, pace: Pace, cold_starts: ColdStarts,
                 safety: MemorySafety, depth: BatchDepth, benefit_ratio: float, tick_s: float = 1.0) -> None:
        self.ctx = ctx
        self.sources = sources
        self.plans = plans
        self.pace = pace
        self.cold_starts = cold_starts
        self.safety = safety
        self.depth = depth
        self.benefit_ratio = benefit_ratio
        self.tick_s = tick_s
        self.positioned: dict[str, Segment] = {}
        self._worth: dict[float, bool] = {}  # segment start -> whether its regime's plan is worth moving to
        self.moves = 0
        self.skipped = 0

    def plan(self, state: RunnerState) -> Plan | None:
        if not self.sources.segments:
            return None
        positions = stream_positions(state)
        rates = self._position_rates(state, positions)
        live = self.sources.live(state)
        partial: set[int] = set()  # regimes whose allocation cannot be pre-positioned whole this tick
        targets: dict[str, tuple[Segment, RegimePlan, dict[OpConfig, int]]] = {}
        growing: dict[str, dict[OpConfig, int]] = {}  # moves that hold more GPUs: made only if the whole allocation packs
        for op_state in state.operators:
            name = op_state.name
            segment = self._next_segment(name, positions[name], rates.get(name, 0.0), op_state.configs())
            done = self.positioned.get(name)
            if segment is None or (done is not None and done.start >= segment.start) or not self._known(segment):
                continue  # positioned for it, or for a later segment already (never back to an earlier one)
            regime_plan = self.plans.plan(state, segment.regime, segment.regime.id in live)
            groups = dict(regime_plan.groups.get(name, {})) if regime_plan is not None else {}
            if not groups or any(self.safety.unsafe(name, c) is not None or self.depth.too_small(name, c) for c in groups):
                continue
            if groups == op_state.configs() or not self._worth_it(state, segment, regime_plan):
                self.positioned[name] = segment
                continue
            if sum(groups.values()) < sum(op_state.configs().values()) and classify(op_state) is Occupancy.SATURATED:
                continue  # work waits at it and every replica is busy: what it measures now outweighs a plan made on other items
            if held(groups)[1] > held(op_state.configs())[1] + 1e-9:
                growing[name] = groups
            targets[name] = (segment, regime_plan, groups)
        if growing and not gpus_pack(state, self.ctx.planned_for(state), {n: t[2] for n, t in targets.items()}):
            partial.update(targets[n][0].regime.id for n in growing)  # left to the placement, which packs GPUs by device
        targets = {n: t for n, t in targets.items() if t[0].regime.id not in partial}  # half a regime's allocation is no plan
        if not targets:
            return None
        current = {op.name: op.configs() for op in state.operators}
        final = {n: (targets[n][2] if n in targets else g) for n, g in current.items()}
        cluster = self.ctx.planned_for(state)
        moving = list(targets)
        if sum(held(g)[0] for g in final.values()) > cluster.total_cpus + 1e-9 or sum(held(g)[1] for g in final.values()) > cluster.total_gpus + 1e-9:
            moving = [n for n in moving if all(a <= b + 1e-9 for a, b in zip(held(targets[n][2]), held(current[n])))]
        if not moving:
            return None
        ops = []
        for name in moving:
            segment, regime_plan, groups = targets[name]
            self.positioned[name] = segment
            where = "reach it" if positions[name] < segment.start else "are at it"
            ops.append(OperatorPlan(name, replica_groups(groups),
                                    f"{name}: regime {segment.regime.id} ({segment.regime.describe()} at the source) from input item "
                                    f"{segment.start:.0f}, whose items {where} ({positions[name]:.0f} taken): its {regime_plan.origin} "
                                    f"allocation {regime_plan.label(name)}"))
        self.moves += len(ops)
        head = targets[moving[0]][1]
        reason = f"pre-positioned {len(ops)} operator(s) for known regimes: " + "; ".join(o.reason for o in ops)
        return Plan(tuple(ops), head.predicted, reason, Rationale(PlanKind.REGIME_PLAN, throughput_after=head.predicted))

    def _worth_it(self, state: RunnerState, segment: Segment, regime_plan: RegimePlan) -> bool:
        """Whether ``segment``'s regime plan predicts ``MARGIN`` more than the allocation running now and pays for its
        cold starts within the segment (decided at the first operator that meets the segment; True for a plan from memory
        and where the models cannot tell)."""
        if regime_plan.origin == "memory":
            return True
        if segment.start not in self._worth:
            self._worth[segment.start] = self._gains(state, segment, regime_plan) and self._pays(state, segment, regime_plan)
            self.skipped += not self._worth[segment.start]
        return self._worth[segment.start]

    def _gains(self, state: RunnerState, segment: Segment, regime_plan: RegimePlan) -> bool:
        gain = self.plans.gain(state, segment.regime, regime_plan)
        return gain is None or gain >= 1.0 + MARGIN

    def _pays(self, state: RunnerState, segment: Segment, regime_plan: RegimePlan) -> bool:
        rate = regime_plan.predicted if regime_plan.predicted > 0 else self.pace.completion_rate()
        if not rate or rate <= 0:
            return True
        move = self.plans.transition(state, segment.regime, regime_plan, self.sources.span(segment) / rate, self.benefit_ratio)
        return move is None or move.verdict is TransitionVerdict.ROLL_OUT

    def _known(self, segment: Segment) -> bool:
        return segment.regime.remembered or any(s.regime is segment.regime for s in self.sources.segments if s.start < segment.start)

    def _next_segment(self, name: str, position: float, rate: float, configs: dict[OpConfig, int]) -> Segment | None:
        here = self.sources.at(position)
        ahead = self.sources.next_after(position)
        if ahead is None or rate <= 0:
            return here
        lead_s = max((self.cold_starts.cold_start(name, c.device) for c in configs), default=0.0) + self.tick_s
        return ahead if (ahead.start - position) / rate <= lead_s else here

    def _position_rates(self, state: RunnerState, positions: dict[str, float]) -> dict[str, float]:
        """Input items per second each operator's stream position advanced over the last ``RATE_TICKS`` ticks."""
        history = list(self.pace.history)[-RATE_TICKS:]
        if not history or len(history[0].operators) != len(state.operators):
            return {}
        dt = state.wall_s - history[0].wall_s
        if dt <= 0:
            return {}
        before = stream_positions(history[0])
        return {name: max(0.0, (p - before.get(name, p)) / dt) for name, p in positions.items()}
