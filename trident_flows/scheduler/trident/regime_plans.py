"""Regime plans: per known regime, the allocation of every operator that regime runs fastest with.

Contract:
- ``plan(state, regime, live) -> RegimePlan | None``: while the regime is live and every operator
  has a fitted model and ran ``COVERED_ITEMS`` of its items, the placement MILP's answer for a
  pipeline working on that regime's items (capacity curves at the features measured there, scaled
  to the rate measured there, replicas beyond those running counted at ``confidence_z`` below the
  median as the placement's evidence gate counts them; candidates that ran it, accepted canaries and running configs, never
  an unsafe one nor, unless running, one below the operator's in-flight depth), re-solved after a refit at most every ``RESOLVE_S``; otherwise the last plan
  solved while live, else the one remembered from an earlier run, else None.
- ``refresh(state, regimes, live)`` solves the live regimes' plans when due, every tick;
  ``settle(state, regimes)`` at the run's end solves once each covered regime without a plan, so
  the next run remembers it.
- Measured beats predicted: ``refresh`` also counts each tick in which every operator works on one
  regime's items, every replica warm and none draining or a canary, as that allocation's measured
  end-to-end throughput on the regime. Once an allocation has ``MEASURED_TICKS`` such ticks, a plan
  that does not predict ``MEASURED_MARGIN`` more than the best measured mean gives way to that
  allocation (origin "measured", its mean as ``predicted``).
- ``gain(state, regime, plan)``: the models' throughput on the regime's items of ``plan``'s allocation over that of the
  allocation running now, on the same capacity curves (None when an operator has no fitted model or a config no curve).
- ``transition(state, regime, plan, duration_s, benefit_ratio)``: the move from the running allocation to ``plan``'s,
  ordered and priced on those curves over ``duration_s`` of the regime's items (``plan_transition``; None where ``gain``
  is None or the move cannot be ordered).
- ``RegimePlan.groups``: replicas per config per operator; ``predicted``: input items/s;
  ``origin``: "models" (this run), "memory" (an earlier one) or "measured".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from trident_flows.core.state import RunnerState
from trident_flows.core.types import OpConfig, OperatorPlan, Plan, ReplicaGroup, Transition
from trident_flows.scheduler.model_values import NoModelError
from trident_flows.scheduler.placement.inputs import concave_curve, current_placement, work_per_item
from trident_flows.scheduler.placement.transition_cost import plan_transition
from trident_flows.scheduler.placement.types import OperatorDemand
from trident_flows.scheduler.replicas import replica_limits
from trident_flows.scheduler.transfer import transfer_estimate
from trident_flows.scheduler.trident.batch_depth import BatchDepth
from trident_flows.scheduler.trident.context import Context
from trident_flows.scheduler.trident.operators import ColdStarts, Operators
from trident_flows.scheduler.trident.pace import Pace
from trident_flows.scheduler.trident.placement_step import placement_option, replica_cap
from trident_flows.scheduler.trident.safety import MemorySafety
from trident_flows.scheduler.trident.search import ConfigSearch
from trident_flows.scheduler.trident.source_regimes import Regime
from trident_flows.scheduler.trident_settings import PlacementSettings

# Items of a regime every operator must have measured in this run before its plan is solved from this run's models
# (and that a config must have run on it to be a candidate).
COVERED_ITEMS = 16.0
RESOLVE_S = 30.0  # a live regime's plan is solved again at most this often (runner seconds): each solve's CPU is the pipeline's
MEASURED_TICKS = 8  # steady ticks of the whole pipeline on one regime, in one allocation, before its mean throughput counts
MEASURED_MARGIN = 0.05  # a plan replaces the allocation measured best on its regime only when it predicts this much more


@dataclass(frozen=True)
class RegimePlan:
    """One regime's allocation: operator -> {config: replicas}, its predicted throughput and where it came from."""

    regime: int
    groups: Mapping[str, Mapping[OpConfig, int]]
    predicted: float
    origin: str

    def label(self, operator: str) -> str:
        return " + ".join(f"{n}x{c.label()}" for c, n in sorted(self.groups[operator].items(), key=lambda g: g[0].label()))


class RegimePlans:
    """The known regimes' plans (see the module docstring)."""

    def __init__(self, settings: PlacementSettings, ctx: Context, ops: Operators, *, search: ConfigSearch, safety: MemorySafety,
                 pace: Pace, cold_starts: ColdStarts, depth: BatchDepth, solve: Callable[..., Any], confidence_z: float = 0.0) -> None:
        self.settings = settings
        self.confidence_z = confidence_z
        self.ctx = ctx
        self.ops = ops
        self.search = search
        self.safety = safety
        self.pace = pace
        self.cold_starts = cold_starts
        self.depth = depth
        self.solve = solve
        self._remembered: dict[int, RegimePlan] = {}
        self._solved: dict[int, tuple[tuple, float, RegimePlan]] = {}  # regime -> (models' versions, runner wall_s, plan)
        self._failed: dict[int, float] = {}  # regime -> runner wall_s of its last solve that found no plan
        self._measured: dict[int, dict[tuple, list[float]]] = {}  # regime -> allocation -> [steady ticks, summed throughput]

    def remember(self, plan: RegimePlan) -> None:
        self._remembered[plan.regime] = plan

    def refresh(self, state: RunnerState, regimes: Sequence[Regime], live: set[int], throughput: float) -> None:
        """Each tick: ``throughput`` (end-to-end input items/s since the last tick) counts for the allocation running when
        the whole pipeline is steady on one regime; the live regimes' plans are solved again when due (``plan``), so that
        each keeps the one solved last while the models were fresh on it."""
        if len(live) == 1 and all(r.warm and not r.draining and not r.canary for op in state.operators for r in op.replicas):
            ticks = self._measured.setdefault(next(iter(live)), {}).setdefault(_allocation_key(state), [0.0, 0.0])
            ticks[0] += 1
            ticks[1] += throughput
        for regime in regimes:
            if regime.id in live:
                self.plan(state, regime, True)

    def settle(self, state: RunnerState, regimes: Sequence[Regime]) -> None:
        names = [op.name for op in state.operators]
        for regime in regimes:
            if regime.id in self._solved or not regime.covered(names, COVERED_ITEMS):
                continue
            if all(n in self.ops and self.ops[n].model.ready for n in names) and (plan := self._solve(state, regime)) is not None:
                self._solved[regime.id] = (self._versions(names), state.wall_s, plan)

    def plan(self, state: RunnerState, regime: Regime, live: bool) -> RegimePlan | None:
        """``live``: an operator works on the regime's items now (only then are the models fresh on it). The allocation
        measured best on the regime where the plan does not predict ``MEASURED_MARGIN`` more (module docstring)."""
        planned = self._planned(state, regime, live)
        measured = self.measured(regime.id)
        if measured is None or (planned is not None and planned.predicted >= measured.predicted * (1 + MEASURED_MARGIN)):
            return planned
        return measured

    def measured(self, regime: int) -> RegimePlan | None:
        """The allocation with the highest mean throughput over at least ``MEASURED_TICKS`` steady ticks on ``regime``."""
        kept = [(total / n, key) for key, (n, total) in self._measured.get(regime, {}).items() if n >= MEASURED_TICKS]
        if not kept:
            return None
        rate, key = max(kept, key=lambda k: k[0])
        return RegimePlan(regime, {name: dict(groups) for name, groups in key}, rate, "measured")

    def _planned(self, state: RunnerState, regime: Regime, live: bool) -> RegimePlan | None:
        names = [op.name for op in state.operators]
        solved = self._solved.get(regime.id)
        if not live or not (regime.covered(names, COVERED_ITEMS) and all(n in self.ops and self.ops[n].model.ready for n in names)):
            return solved[2] if solved is not None else self._remembered.get(regime.id)
        key = self._versions(names)
        if state.wall_s - self._failed.get(regime.id, -math.inf) < RESOLVE_S:
            return None
        if solved is not None and (solved[0] == key or state.wall_s - solved[1] < RESOLVE_S):
            return solved[2]
        plan = self._solve(state, regime) or (solved[2] if solved is not None else self._remembered.get(regime.id))
        if plan is not None:
            self._solved[regime.id] = (key, state.wall_s, plan)
        else:
            self._failed[regime.id] = state.wall_s
        return plan

    def _versions(self, names: Sequence[str]) -> tuple:
        """The operators' model versions: a solved plan stands while they are unchanged."""
        return tuple((n, self.ops[n].model_version) for n in names)

    def gain(self, state: RunnerState, regime: Regime, plan: RegimePlan) -> float | None:
        """The models' throughput on ``regime``'s items with ``plan``'s allocation over the allocation running now (module
        docstring)."""
        against = self._against_running(state, regime, plan)
        if against is None:
            return None
        now, demands = against
        before, after = _rate(demands, now), _rate(demands, {n: plan.groups.get(n) or now[n] for n in now})
        return after / before if before and after is not None else None

    def transition(self, state: RunnerState, regime: Regime, plan: RegimePlan, duration_s: float, benefit_ratio: float) -> Transition | None:
        """The move to ``plan``'s allocation priced over ``duration_s`` of ``regime``'s items (module docstring)."""
        against = self._against_running(state, regime, plan)
        if against is None:
            return None
        now, demands = against
        target = Plan(tuple(OperatorPlan(n, tuple(ReplicaGroup(c, k) for c, k in (plan.groups.get(n) or now[n]).items()), "regime plan")
                            for n in now), plan.predicted, f"regime {regime.id}'s plan")
        try:
            return plan_transition(demands, self.ctx.planned_for(state), current_placement(state), target, duration_s, benefit_ratio=benefit_ratio)
        except (ValueError, RuntimeError):
            return None

    def _against_running(self, state: RunnerState, regime: Regime, plan: RegimePlan) -> tuple[dict[str, dict[OpConfig, int]], list[OperatorDemand]] | None:
        """The running allocation and the operators' curves on ``regime``'s items for its configs and ``plan``'s (None when
        an operator has no fitted model or a config no curve)."""
        names = [op.name for op in state.operators]
        if not all(n in self.ops and self.ops[n].model.ready for n in names):
            return None
        now = {op.name: op.configs() for op in state.operators}
        demands = self._demands(state, regime, {n: [*now[n], *plan.groups.get(n, {})] for n in names})
        return (now, demands) if demands is not None else None

    def _solve(self, state: RunnerState, regime: Regime) -> RegimePlan | None:
        demands = self._demands(state, regime)
        if demands is None:
            return None
        try:
            result = self.solve(demands, self.ctx.planned_for(state), current_placement(state), solver=self.settings.solver,
                                time_limit_s=self.settings.time_limit_s)
        except Exception:  # noqa: BLE001 - no plan for this regime now; the placement step plans from measurements
            return None
        groups: dict[str, dict[OpConfig, int]] = {}
        for op_plan in result.plan.operators:
            for g in op_plan.groups:
                groups.setdefault(op_plan.operator, {})
                groups[op_plan.operator][g.config] = groups[op_plan.operator].get(g.config, 0) + g.replicas
        return RegimePlan(regime.id, groups, float(result.throughput), "models")

    def _demands(self, state: RunnerState, regime: Regime, configs: Mapping[str, Sequence[OpConfig]] | None = None) -> list[OperatorDemand] | None:
        """Each operator as the placement sees it on ``regime``'s items: its capacity curve per candidate config (those it
        runs, accepted canaries and those that ran the regime; with ``configs``, exactly those, unsafe ones included),
        scaled to the rate measured on the regime. None when an operator has no config with a curve."""
        cluster = self.ctx.planned_for(state)
        work = work_per_item(state, tuple(self.pace.history))
        demands = []
        for op_state in state.operators:
            name = op_state.name
            op = self.ops[name]
            lo, hi = replica_limits(name, self.ctx.spec)
            if configs is not None:
                candidates = dict.fromkeys(configs.get(name, ()))
            else:
                measured = [c for c in regime.busy.get(name, {}) if (found := regime.rate(name, c)) is not None and found[0] >= COVERED_ITEMS]
                running = op_state.configs()
                candidates = dict.fromkeys([*running, *(c for c in [*op.accepted, *measured] if c in running or not self.depth.too_small(name, c))])
            features = _features_for(op.model, regime.features.get(name, {}))
            factor = _level(op.model, regime, name, features)
            options = []
            for config in candidates:
                if configs is None and self.safety.unsafe(name, config) is not None:
                    continue
                cap = replica_cap(cluster, config, hi)
                if cap < 1:
                    continue
                try:
                    totals = op.model.capacity_lower(config, cap, op_state.configs().get(config, 0), self.confidence_z, features)
                    curve = concave_curve((factor * totals).tolist())
                except (NoModelError, ValueError):
                    continue
                options.append(placement_option(name, config, curve, self.search, self.cold_starts, op))
            if not options:
                return None
            moved = transfer_estimate(smp for _, smp in op.window)
            demands.append(OperatorDemand(name, work[name], tuple(options), min_replicas=lo, max_replicas=hi,
                                          input_bytes_per_item=moved.bytes_per_item if moved else 0.0))
        return demands


def _rate(demands: Sequence[OperatorDemand], groups: Mapping[str, Mapping[OpConfig, int]]) -> float | None:
    """Input items/s the allocation ``groups`` sustains on ``demands``' curves: the slowest operator's capacity over its work
    per item (None when a config has no curve)."""
    rates = []
    for demand in demands:
        curves = {option.config: option for option in demand.options}
        capacity = 0.0
        for config, n in groups.get(demand.name, {}).items():
            if config not in curves:
                return None
            capacity += curves[config].rate_at(n)
        rates.append(capacity / demand.work_per_item if demand.work_per_item > 0 else math.inf)
    return min(rates, default=None)


def _allocation_key(state: RunnerState) -> tuple:
    """The serving replicas per config of every operator, hashable."""
    return tuple((op.name, tuple(sorted(op.configs().items(), key=lambda g: g[0].label()))) for op in state.operators)


def _level(model: Any, regime: Regime, name: str, features: dict[str, float] | None) -> float:
    """Measured over predicted rate of one replica of the config the operator ran most on the regime's items (1.0: none
    measured or no prediction): the model gives the shape of the capacity curves, the regime's own batches their level."""
    measured = [(config, found) for config in regime.busy.get(name, {}) if (found := regime.rate(name, config)) is not None]
    if not measured:
        return 1.0
    config, (_, rate) = max(measured, key=lambda m: m[1][0])
    try:
        predicted = float(model.predict_many([config], 1, features)[0][0])
    except (NoModelError, ValueError):
        return 1.0
    return rate / predicted if predicted > 0 else 1.0


def _features_for(model: Any, measured: Mapping[str, float]) -> dict[str, float] | None:
    """The per-item features a model predicts at: those measured on the regime, the model's own for any it lacks (None: none)."""
    names = model.feature_names
    if not names:
        return None
    current = model.current_features
    return {f: float(measured.get(f, current.get(f, 0.0))) for f in names}
