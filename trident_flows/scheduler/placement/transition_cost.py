"""From the current placement to a plan: ordered rolling steps, priced, with the decision to
roll out or wait.

Contract (pure functions; applying a ``Transition`` is the runtime's job):
- ``plan_transition(demands, cluster, current, plan, regime_duration_s)`` returns a
  ``types.Transition``: replicas that change only in batch size resized in place first, at no cost
  (``core.step_order.batch_resizes``), then steps in ``core.step_order.order_steps``' order (the one
  the runner executes; starts before retires, each start fitting its node class at that point), priced by
  simulating the rollout phase by phase (``expected_gain``, ``cost_items``,
  ``cold_start_cost_s``, ``rollout_s``), with the verdict ROLL_OUT when the gain over the regime
  (or the run's time left, for a plan that stops nothing) exceeds ``benefit_ratio`` x the cost,
  else WAIT, and its reason.
- ``step_usage`` replays the steps and returns each class's resource use after every step, for
  callers (and tests) that check limits hold throughout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from trident_flows.core.step_order import batch_resizes, order_steps
from trident_flows.core.types import ClusterSpec, OpConfig, Plan, ReplicaGroup, StepKind, Transition, TransitionStep, TransitionVerdict
from trident_flows.scheduler.placement.model import Key, class_capacity, ineligibility, operator_capacity, throughput_of, usage_vector
from trident_flows.scheduler.placement.types import CurrentPlacement, OperatorDemand


def placement_counts(demands: Sequence[OperatorDemand], cluster: ClusterSpec, groups_of: dict[str, Sequence[ReplicaGroup]],
                     what: str) -> tuple[dict[Key, int], dict[Key, OpConfig]]:
    """Replica groups as (operator, option, class) counts, with the config each key runs.
    A group whose config is no option of its operator raises ``ValueError``."""
    counts: dict[Key, int] = {}
    configs: dict[Key, OpConfig] = {}
    for d in demands:
        for g in groups_of.get(d.name, ()):
            if g.replicas == 0:
                continue
            k = d.option_index(g.config)
            if k is None:
                raise ValueError(f"operator {d.name!r}: {what} config {g.config.label()} is not among its options; "
                                 "add it as a PlacementOption so the transition can price it")
            c = g.node_class or next((nc.name for nc in cluster.node_classes if ineligibility(d, d.options[k], nc) is None), None)
            if c is None:
                raise ValueError(f"operator {d.name!r}: {what} config {g.config.label()} fits no node class")
            key = Key(d.name, k, c)
            counts[key] = counts.get(key, 0) + g.replicas
            configs[key] = g.config
    return counts, configs


def _usage(demands: Sequence[OperatorDemand], cluster: ClusterSpec, key: Key) -> tuple[float, float, float]:
    d = next(d for d in demands if d.name == key.operator)
    return usage_vector(d.options[key.option], cluster.node_class(key.node_class))


def plan_transition(demands: Sequence[OperatorDemand], cluster: ClusterSpec, current: CurrentPlacement, plan: Plan,
                    regime_duration_s: float, *, benefit_ratio: float = 1.0, run_left_s: float | None = None) -> Transition:
    """Order and price the change from ``current`` to ``plan``.

    Steps START new replicas first and RETIRE old ones once the operator's replacements are warm, bottleneck
    operators first, so capacity stays as high as possible. Each START fits the free CPUs, GPUs and host memory
    of its node class at that point; when a class is too full to start before retiring, just enough replicas
    retire there first (never an operator's last one while another choice exists), as the step and transition
    reasons say.

    Pricing: the rollout is simulated phase by phase (a START phase lasts the longest cold start of its
    replicas, during which they add nothing; a RETIRE phase lasts the longest drain, during which draining
    replicas take no new work). Items over the regime are ``sum(T_phase * duration) + T_new * (rest of the
    regime)`` against ``T_now * duration`` when waiting. ``expected_gain`` = ``T_new - T_now`` (input items/s);
    the cost is the items lost against an instant switch (``cost_items``); ``cold_start_cost_s`` the
    replica-seconds spent warming up and draining; ``rollout_s`` the phases' summed length. ROLL_OUT when the
    gain over the regime exceeds ``benefit_ratio`` x the cost (and the rollout beats waiting), else WAIT; both
    with reasons. A plan that only starts replicas on free resources stops nothing running, and what it adds
    serves until a later plan retires it: with ``run_left_s`` given it is priced over the run's time left when
    that is longer than the regime's."""
    if not (regime_duration_s >= 0 and math.isfinite(regime_duration_s)):
        raise ValueError(f"regime_duration_s must be a finite number >= 0, got {regime_duration_s!r}")
    if run_left_s is not None and not (run_left_s >= 0 and math.isfinite(run_left_s)):
        raise ValueError(f"run_left_s must be None or a finite number >= 0, got {run_left_s!r}")
    demands = list(demands)
    cur, cur_cfg = placement_counts(demands, cluster, {op: gs for op, gs in current.groups}, "current")
    new, new_cfg = placement_counts(demands, cluster, {o.operator: o.groups for o in plan.operators}, "planned")
    if all(cur.get(k, 0) == new.get(k, 0) for k in {*cur, *new}):
        return Transition((), TransitionVerdict.WAIT, "the plan equals the current placement", 0.0, 0.0, plan)
    t_now = throughput_of(demands, cluster, cur) if all(any(k.operator == d.name for k in cur) for d in demands) else 0.0
    t_new = throughput_of(demands, cluster, new)
    rollout = _rollout(demands, cluster, cur, new, {**cur_cfg, **new_cfg}, plan)
    return _priced(rollout, demands, plan, t_now, t_new, regime_duration_s, benefit_ratio, run_left_s)


@dataclass(frozen=True)
class _Rollout:
    """The ordered steps of a change and the phases they run in: (seconds, pipeline throughput during them)."""

    steps: tuple[TransitionStep, ...]
    phases: tuple[tuple[float, float], ...]
    interleaved: tuple[str, ...]  # why retires had to be interleaved with starts (resources too tight)


def _rollout(demands: list[OperatorDemand], cluster: ClusterSpec, cur: dict[Key, int], new: dict[Key, int],
             cfg: dict[Key, OpConfig], plan: Plan) -> _Rollout:
    """The steps from ``cur`` to ``new`` in the runner's order (``order_steps``, bottleneck first),
    each phase with how long it lasts (its longest cold start or drain) and what the pipeline serves meanwhile."""
    by_name = {d.name: d for d in demands}
    capacity = {nc.name: class_capacity(nc) for nc in cluster.node_classes}
    order = sorted(demands, key=lambda d: operator_capacity(d, cur) / d.work_per_item)  # bottleneck first
    resized, active = batch_resizes(cur, new, lambda k: cfg[k])
    steps: list[TransitionStep] = [
        TransitionStep.resize(new_key.operator, cfg[old], cfg[new_key], n, new_key.node_class, plan.for_operator(new_key.operator).reason)
        for old, new_key, n in resized]
    phases_plan = order_steps(active, new, capacity, lambda k: _usage(demands, cluster, k), [d.name for d in order],
                              headroom=lambda name: operator_capacity(by_name[name], cur) / by_name[name].work_per_item,
                              label=lambda k: cfg[k].label())
    growing = {k.operator for k in new if new[k] > active.get(k, 0)}
    phases: list[tuple[float, float]] = []
    interleaved: list[str] = []
    for phase in phases_plan:
        if phase.kind == StepKind.START:
            phases.append((max(by_name[k.operator].options[k.option].cold_start_s for k, _ in phase.moves),
                           _serving_throughput(demands, cluster, active)))
            for key, n in phase.moves:
                active[key] = active.get(key, 0) + n
                head = "current bottleneck first" if key.operator == order[0].name else "start before retiring"
                steps.append(TransitionStep(StepKind.START, key.operator, cfg[key], n, key.node_class, f"{head}: {plan.for_operator(key.operator).reason}"))
            continue
        for key, n in phase.moves:
            active[key] -= n
        phases.append((max(by_name[k.operator].options[k.option].drain_s for k, _ in phase.moves), _serving_throughput(demands, cluster, active)))
        if phase.note:
            interleaved.append(phase.note)
        for key, n in phase.moves:
            why = (f"interleaved: {phase.note}" if phase.note else
                   "its replacements are warm" if key.operator in growing else "scale down once the others have started")
            steps.append(TransitionStep(StepKind.RETIRE, key.operator, cfg[key], n, key.node_class, why))
    return _Rollout(tuple(steps), tuple(phases), tuple(interleaved))


def _serving_throughput(demands: Sequence[OperatorDemand], cluster: ClusterSpec, counts: dict[Key, int]) -> float:
    """Pipeline throughput with ``counts`` serving (0 while an operator has no replica)."""
    if any(not any(n > 0 and k.operator == d.name for k, n in counts.items()) for d in demands):
        return 0.0
    return throughput_of(demands, cluster, {k: n for k, n in counts.items() if n > 0})


def _priced(rollout: _Rollout, demands: Sequence[OperatorDemand], plan: Plan, t_now: float, t_new: float,
            regime_duration_s: float, benefit_ratio: float, run_left_s: float | None = None) -> Transition:
    """The items the rollout gains and costs over the regime, and ROLL_OUT or WAIT (see ``plan_transition``)."""
    by_name = {d.name: d for d in demands}
    steps = rollout.steps

    def replica_s(kind: StepKind, seconds: str) -> float:
        return sum(s.count * getattr(by_name[s.operator].options[by_name[s.operator].option_index(s.config)], seconds)
                   for s in steps if s.kind == kind)

    started_total = sum(s.count for s in steps if s.kind == StepKind.START)
    cap_s = replica_s(StepKind.START, "cold_start_s") + replica_s(StepKind.RETIRE, "drain_s")
    if run_left_s is not None and not any(s.kind == StepKind.RETIRE for s in steps):
        # only replicas started on free resources: nothing running stops, and the added capacity serves
        # until a later plan retires it, so it is priced over the run's time left, not the regime's
        regime_duration_s = max(regime_duration_s, run_left_s)
    left = regime_duration_s
    items_roll = 0.0
    for seconds, t in rollout.phases:
        dt = min(seconds, left)
        items_roll += t * dt
        left -= dt
    items_roll += t_new * left
    items_wait = t_now * regime_duration_s
    gain_items = (t_new - t_now) * regime_duration_s
    cost_items = max(0.0, gain_items - (items_roll - items_wait))
    rollout_s = sum(s for s, _ in rollout.phases)
    detail = (f"T {t_now:.4g} -> {t_new:.4g} input items/s over a {regime_duration_s:.0f} s regime: gain {gain_items:.0f} items, "
              f"cost {cost_items:.0f} items ({started_total} replicas starting, {cap_s:.0f} replica-s of cold start and drain, "
              f"rollout {rollout_s:.0f} s)")
    if rollout.interleaved:
        detail += "; resources too tight to start everything before retiring, interleaved: " + "; ".join(rollout.interleaved)
    if t_new > t_now and gain_items > benefit_ratio * cost_items and items_roll > items_wait:
        return Transition(steps, TransitionVerdict.ROLL_OUT, "roll out: " + detail, t_new - t_now, cap_s, plan, rollout_s, cost_items)
    why = "no throughput gain" if t_new <= t_now else "the gain does not pay for the switch"
    return Transition(steps, TransitionVerdict.WAIT, f"wait ({why}): " + detail, t_new - t_now, cap_s, plan, rollout_s, cost_items)


def step_usage(demands: Sequence[OperatorDemand], cluster: ClusterSpec, current: CurrentPlacement,
               transition: Transition) -> list[dict[str, tuple[float, float, float]]]:
    """Per class (CPUs, GPUs, host memory bytes) in use after each step of ``transition``
    (a START holds its resources from the moment it starts; a RETIRE frees them)."""
    cur, _ = placement_counts(demands, cluster, {op: gs for op, gs in current.groups}, "current")
    used = {nc.name: [0.0, 0.0, 0.0] for nc in cluster.node_classes}
    for key, n in cur.items():
        for i, v in enumerate(_usage(demands, cluster, key)):
            used[key.node_class][i] += v * n
    out = []
    by_name = {d.name: d for d in demands}
    for step in transition.steps:
        k = by_name[step.operator].option_index(step.config)
        sign = 1 if step.kind == StepKind.START else 0 if step.kind == StepKind.RESIZE else -1
        for i, v in enumerate(_usage(demands, cluster, Key(step.operator, k, step.node_class))):
            used[step.node_class][i] += sign * v * step.count
        out.append({c: tuple(u) for c, u in used.items()})
    return out
