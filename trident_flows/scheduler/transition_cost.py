"""From the current placement to a plan: ordered rolling steps, priced, with the decision to
roll out or wait.

Contract (pure functions; applying a ``Transition`` is the runtime's job):
- ``plan_transition(demands, cluster, current, plan, regime_duration_s)`` returns a
  ``types.Transition`` whose steps START new replicas first and RETIRE old ones once the
  operator's replacements are warm, bottleneck operators first, so capacity stays as high
  as possible. Each START fits the free CPUs, GPUs and host memory of its node class at that
  point; when a class is too full to start before retiring, the planner retires just enough
  replicas there first (never an operator's last one while another choice exists) and
  says so in the step and transition reasons.
- Pricing: the rollout is simulated phase by phase (a START phase lasts the longest cold
  start of its replicas, during which they add nothing; a RETIRE phase lasts the longest
  drain, during which draining replicas take no new work). Items over the regime are
  ``sum(T_phase * duration) + T_new * (rest of the regime)`` against ``T_now * duration``
  when waiting. ``expected_gain`` = ``T_new - T_now`` (input items/s); the cost is the
  items lost against an instant switch (``cost_items``); ``cold_start_cost_s`` the
  replica-seconds spent warming up and draining; ``rollout_s`` the phases' summed length. ROLL_OUT when the gain over the regime exceeds
  ``benefit_ratio`` x the cost (and the rollout beats waiting), else WAIT; both with reasons.
- ``step_usage`` replays the steps and returns each class's resource use after every
  step, for callers (and tests) that check limits hold throughout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Mapping, Sequence

from trident_flows.scheduler.placement_eval import Key, class_capacity, ineligibility, operator_capacity, throughput_of, usage_vector
from trident_flows.scheduler.placement_types import CurrentPlacement, OperatorDemand
from trident_flows.scheduler.types import ClusterSpec, Decision, OpConfig, Plan, ReplicaGroup, StepKind, Transition, TransitionStep

_RES_NAMES = ("CPUs", "GPUs", "host memory")


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
            counts[(d.name, k, c)] = counts.get((d.name, k, c), 0) + g.replicas
            configs[(d.name, k, c)] = g.config
    return counts, configs


def _usage(demands: Sequence[OperatorDemand], cluster: ClusterSpec, key: Key) -> tuple[float, float, float]:
    d = next(d for d in demands if d.name == key[0])
    return usage_vector(d.options[key[1]], cluster.node_class(key[2]))


@dataclass(frozen=True)
class Phase:
    """One phase of a rolling change: replicas started together (``StepKind.START``) or drained and
    retired together (``StepKind.RETIRE``); ``moves`` are (key, count) with key = (operator, option, class);
    ``note`` says why a retirement had to come before the starts it makes room for."""

    kind: StepKind
    moves: tuple[tuple[Hashable, int], ...]
    note: str = ""


def order_steps(current: Mapping[Any, int], target: Mapping[Any, int], capacity: Mapping[str, Sequence[float]],
                usage: Callable[[Any], Sequence[float]], priority: Sequence[str] = (), *,
                resource_names: Sequence[str] = _RES_NAMES, headroom: Callable[[str], float] | None = None,
                label: Callable[[Any], str] = str) -> list[Phase]:
    """The rolling order from ``current`` to ``target`` replica counts per key (operator, option, class):
    the one ordering both the pricing here and the runner (``runtime.transition``) execute.

    Starts come first (operators in ``priority`` order), each as many as fit the class's free
    resources; an operator's old replicas retire once its new ones are all started (warm).
    When nothing fits, just enough replicas are retired first: of one that keeps its operator
    serving (the blocked operator's own first, then the one with most ``headroom``); when only
    an operator's last replica can make room, it is swapped in place: drained and retired
    before its replacement starts (the operator serves nothing meanwhile; the pricing counts it).
    Raises ``ValueError`` when a start cannot fit even with every planned retirement done."""
    starts = {k: n - current.get(k, 0) for k, n in target.items() if n > current.get(k, 0)}
    retires = {k: n - target.get(k, 0) for k, n in current.items() if n > target.get(k, 0)}
    used = {c: [0.0] * len(cap) for c, cap in capacity.items()}
    for key, n in current.items():
        for i, v in enumerate(usage(key)):
            used[key[2]][i] += v * n
    alive: dict[str, int] = {}
    for key, n in current.items():
        alive[key[0]] = alive.get(key[0], 0) + n
    rank = {name: i for i, name in enumerate(priority)}
    by_rank = lambda k: (rank.get(k[0], len(rank)), str(k))  # noqa: E731

    def fits(key) -> int:
        room = [capacity[key[2]][i] - used[key[2]][i] for i in range(len(used[key[2]]))]
        vec = usage(key)
        return min((int((room[i] + 1e-9) // vec[i]) if vec[i] > 0 else starts[key]) for i in range(len(vec)))

    def take(key, n: int, sign: int) -> None:
        for i, v in enumerate(usage(key)):
            used[key[2]][i] += sign * v * n
        alive[key[0]] = alive.get(key[0], 0) + sign * n

    phases: list[Phase] = []
    for _ in range(10_000):
        if not starts and not retires:
            return phases
        started = []
        for key in sorted(starts, key=by_rank):
            n = min(starts[key], max(0, fits(key)))
            if n > 0:
                take(key, n, +1)
                starts[key] -= n
                started.append((key, n))
        starts = {k: n for k, n in starts.items() if n > 0}
        if started:
            phases.append(Phase(StepKind.START, tuple(started)))
        ready = [k for k in sorted(retires, key=by_rank) if not any(s[0] == k[0] for s in starts)]
        if ready:  # operators whose new replicas are all started (or that only shrink) drain the old ones
            moves = tuple((k, retires.pop(k)) for k in ready)
            for key, n in moves:
                take(key, n, -1)
            phases.append(Phase(StepKind.RETIRE, moves))
        if started or ready or not starts:
            continue
        blocked = min(starts, key=by_rank)
        need = usage(blocked)
        cap = capacity[blocked[2]]
        short = [i for i in range(len(need)) if need[i] > cap[i] - used[blocked[2]][i] + 1e-9]
        helpful = [k for k in retires if k[2] == blocked[2] and any(usage(k)[i] > 0 for i in short)]
        if not helpful:
            raise ValueError(f"cannot order the transition: {blocked[0]!r} cannot start on {blocked[2]!r} and nothing there is left to retire")

        def count(k) -> int:
            vec = usage(k)
            return min(retires[k], max(math.ceil((need[i] - (cap[i] - used[k[2]][i]) - 1e-9) / vec[i]) for i in short if vec[i] > 0))

        # Keep every operator serving where possible (the blocked operator's own replicas first: they go anyway),
        # then take from the operator with the most headroom.
        key = min(helpful, key=lambda k: (alive[k[0]] - count(k) < 1, k[0] != blocked[0],
                                          -(headroom(k[0]) if headroom else 0.0), by_rank(k)))
        n = count(key)
        names = ", ".join(resource_names[i] for i in short)
        if alive[key[0]] - n < 1:
            note = (f"{blocked[2]} lacks {names} to start {blocked[0]} beside {key[0]}'s last replica: swapping it in place "
                    f"(drain {n} x {label(key)} of {key[0]} first; it serves nothing until the new one is warm)")
        else:
            note = f"{blocked[2]} lacks {names} to start {blocked[0]} before retiring: retiring {n} x {label(key)} of {key[0]} first"
        take(key, n, -1)
        retires[key] -= n
        retires = {k: v for k, v in retires.items() if v > 0}
        phases.append(Phase(StepKind.RETIRE, ((key, n),), note))
    raise RuntimeError("transition ordering did not converge")


def plan_transition(demands: Sequence[OperatorDemand], cluster: ClusterSpec, current: CurrentPlacement, plan: Plan,
                    regime_duration_s: float, *, benefit_ratio: float = 1.0) -> Transition:
    """Order and price the change from ``current`` to ``plan``; see the module docstring."""
    if not (regime_duration_s >= 0 and math.isfinite(regime_duration_s)):
        raise ValueError(f"regime_duration_s must be a finite number >= 0, got {regime_duration_s!r}")
    demands = list(demands)
    by_name = {d.name: d for d in demands}
    cur, cur_cfg = placement_counts(demands, cluster, {op: gs for op, gs in current.groups}, "current")
    new, new_cfg = placement_counts(demands, cluster, {o.operator: o.groups for o in plan.operators}, "planned")
    t_now = throughput_of(demands, cluster, cur) if all(any(k[0] == d.name for k in cur) for d in demands) else 0.0
    t_new = throughput_of(demands, cluster, new)
    starts = {k: new.get(k, 0) - cur.get(k, 0) for k in new if new.get(k, 0) > cur.get(k, 0)}
    retires = {k: cur[k] - new.get(k, 0) for k in cur if cur[k] > new.get(k, 0)}
    if not starts and not retires:
        return Transition((), Decision.WAIT, "the plan equals the current placement", 0.0, 0.0, plan)

    capacity = {nc.name: class_capacity(nc) for nc in cluster.node_classes}
    order = sorted(demands, key=lambda d: operator_capacity(d, cur) / d.work_per_item)  # bottleneck first
    cfg = {**cur_cfg, **new_cfg}
    phases_plan = order_steps(cur, new, capacity, lambda k: _usage(demands, cluster, k), [d.name for d in order],
                              headroom=lambda name: operator_capacity(by_name[name], cur) / by_name[name].work_per_item,
                              label=lambda k: cfg[k].label())
    growing = {k[0] for k in starts}

    def pipeline_t(counts: dict[Key, int]) -> float:
        """Pipeline throughput with ``counts`` serving (0 while an operator has no replica)."""
        if any(not any(n > 0 and k[0] == d.name for k, n in counts.items()) for d in demands):
            return 0.0
        return throughput_of(demands, cluster, {k: n for k, n in counts.items() if n > 0})

    active = dict(cur)
    steps: list[TransitionStep] = []
    phases: list[tuple[float, float]] = []  # (seconds, pipeline throughput during them)
    interleaved: list[str] = []
    for phase in phases_plan:
        if phase.kind == StepKind.START:
            phases.append((max(by_name[k[0]].options[k[1]].cold_start_s for k, _ in phase.moves), pipeline_t(active)))
            for key, n in phase.moves:
                active[key] = active.get(key, 0) + n
                head = "current bottleneck first" if key[0] == order[0].name else "start before retiring"
                steps.append(TransitionStep(StepKind.START, key[0], cfg[key], n, key[2], f"{head}: {plan.for_operator(key[0]).reason}"))
            continue
        for key, n in phase.moves:
            active[key] -= n
        phases.append((max(by_name[k[0]].options[k[1]].drain_s for k, _ in phase.moves), pipeline_t(active)))
        if phase.note:
            interleaved.append(phase.note)
        for key, n in phase.moves:
            why = (f"interleaved: {phase.note}" if phase.note else
                   "its replacements are warm" if key[0] in growing else "scale down once the others have started")
            steps.append(TransitionStep(StepKind.RETIRE, key[0], cfg[key], n, key[2], why))

    started_total = sum(s.count for s in steps if s.kind == StepKind.START)
    cap_s = sum(s.count * by_name[s.operator].options[by_name[s.operator].option_index(s.config)].cold_start_s
                for s in steps if s.kind == StepKind.START)
    cap_s += sum(s.count * by_name[s.operator].options[by_name[s.operator].option_index(s.config)].drain_s
                 for s in steps if s.kind == StepKind.RETIRE)
    left = regime_duration_s
    items_roll = 0.0
    for seconds, t in phases:
        dt = min(seconds, left)
        items_roll += t * dt
        left -= dt
    items_roll += t_new * left
    items_wait = t_now * regime_duration_s
    gain_items = (t_new - t_now) * regime_duration_s
    cost_items = max(0.0, gain_items - (items_roll - items_wait))
    rollout_s = sum(s for s, _ in phases)
    detail = (f"T {t_now:.4g} -> {t_new:.4g} input items/s over a {regime_duration_s:.0f} s regime: gain {gain_items:.0f} items, "
              f"cost {cost_items:.0f} items ({started_total} replicas starting, {cap_s:.0f} replica-s of cold start and drain, "
              f"rollout {rollout_s:.0f} s)")
    if interleaved:
        detail += "; resources too tight to start everything before retiring, interleaved: " + "; ".join(interleaved)
    if t_new > t_now and gain_items > benefit_ratio * cost_items and items_roll > items_wait:
        return Transition(tuple(steps), Decision.ROLL_OUT, "roll out: " + detail, t_new - t_now, cap_s, plan, rollout_s, cost_items)
    why = "no throughput gain" if t_new <= t_now else "the gain does not pay for the switch"
    return Transition(tuple(steps), Decision.WAIT, f"wait ({why}): " + detail, t_new - t_now, cap_s, plan, rollout_s, cost_items)


def step_usage(demands: Sequence[OperatorDemand], cluster: ClusterSpec, current: CurrentPlacement,
               transition: Transition) -> list[dict[str, tuple[float, float, float]]]:
    """Per class (CPUs, GPUs, host memory bytes) in use after each step of ``transition``
    (a START holds its resources from the moment it starts; a RETIRE frees them)."""
    cur, _ = placement_counts(demands, cluster, {op: gs for op, gs in current.groups}, "current")
    used = {nc.name: [0.0, 0.0, 0.0] for nc in cluster.node_classes}
    for key, n in cur.items():
        for i, v in enumerate(_usage(demands, cluster, key)):
            used[key[2]][i] += v * n
    out = []
    by_name = {d.name: d for d in demands}
    for step in transition.steps:
        k = by_name[step.operator].option_index(step.config)
        sign = 1 if step.kind == StepKind.START else -1
        for i, v in enumerate(_usage(demands, cluster, (step.operator, k, step.node_class))):
            used[step.node_class][i] += sign * v * step.count
        out.append({c: tuple(u) for c, u in used.items()})
    return out
