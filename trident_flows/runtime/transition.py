"""From the running state and a target Plan to ordered rolling steps (pure functions; no Ray, no I/O).

Contract:
- ``check_plan(plan, state)`` refuses (``RuntimeConfigError``) a plan naming an unknown operator,
  leaving an operator without replicas, or needing more CPUs/GPUs than the cluster.
- ``rolling_steps(state, plan) -> Transition``: per operator (and node class, where the plan names
  classes and the state lists nodes) the replicas to start and retire, canaries as ``CANARY`` /
  ``END_CANARY``, in ``core.step_order.order_steps``' order (the one the scheduler prices): starts
  before retires, just enough retires first where a start does not fit, a last replica swapped in
  place; ``room_first(steps, k, free, pools, node_of)``: at run time, a start no node has room for waits for the
  plan's next retire, or a CPU replica moves off a node where it then fits; ``step_room`` both, before each step. Replicas whose config changes only in batch size are ``RESIZE``d in place first
  (``core.step_order.batch_resizes``). Operators not in the plan keep their replicas. A plan whose classes do not fit the live
  nodes node by node (``nodes.check_fits``) is refused with the reason.
- ``resize_victims`` (which replicas a ``RESIZE`` takes), ``retire_victims`` (which replicas a retire takes, ``RoomFor``/``room_for`` ranking), ``no_room`` /
  ``refuse_without_room`` (a start that cannot fit now) and ``emptied_by_swap`` (operators a failed
  swap left without a serving replica) are shared by the live runner and the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Hashable, Mapping, Sequence

from trident_flows.core.signatures import config_counts
from trident_flows.core.state import OperatorState, RunnerState, RuntimeConfigError
from trident_flows.core.step_order import Phase, batch_resizes, order_steps
from trident_flows.core.types import OpConfig, Plan, StepKind, Transition, TransitionStep
from trident_flows.runtime.nodes import check_fits, classes

_EPS = 1e-9


def check_plan(plan: Plan, state: RunnerState) -> None:
    """Refuse a plan the runner cannot carry out, naming the operator and what to change."""
    known = {o.name for o in state.operators}
    need_cpus = need_gpus = 0.0
    planned = set()
    for op_plan in plan.operators:
        if op_plan.operator not in known:
            raise RuntimeConfigError(f"plan names unknown operator {op_plan.operator!r}; the pipeline's operators are {sorted(known)}")
        if op_plan.operator in planned:
            raise RuntimeConfigError(f"plan lists operator {op_plan.operator!r} twice; merge its groups into one OperatorPlan")
        planned.add(op_plan.operator)
        if op_plan.replicas < 1:
            raise RuntimeConfigError(f"plan gives operator {op_plan.operator!r} no replicas; give it at least 1 or the pipeline stalls")
        configs = [g.config for g in op_plan.groups] + ([op_plan.canary] if op_plan.canary else [])
        for config in configs:
            if config.gpus > state.cluster_gpus + _EPS:
                raise RuntimeConfigError(f"operator {op_plan.operator!r}: a replica with gpus={config.gpus} does not fit a cluster with "
                                         f"{state.cluster_gpus:g} GPUs; lower gpus or use device='cpu'")
        need_cpus += sum(g.config.cpus * g.replicas for g in op_plan.groups) + (op_plan.canary.cpus if op_plan.canary else 0.0)
        need_gpus += sum(g.config.gpus * g.replicas for g in op_plan.groups) + (op_plan.canary.gpus if op_plan.canary else 0.0)
    for op in state.operators:
        if op.name not in planned:
            need_cpus += sum(r.config.cpus for r in op.active)
            need_gpus += sum(r.config.gpus for r in op.active)
    if need_cpus > state.cluster_cpus + _EPS:
        raise RuntimeConfigError(f"plan needs {need_cpus:g} CPUs but the cluster has {state.cluster_cpus:g}; "
                                 "use fewer replicas or fewer cpus per replica")
    if need_gpus > state.cluster_gpus + _EPS:
        raise RuntimeConfigError(f"plan needs {need_gpus:g} GPUs but the cluster has {state.cluster_gpus:g}; "
                                 "use fewer GPU replicas or fractional gpus")


_CLUSTER = "cluster"


def _counts(op: OperatorState, op_plan) -> tuple[dict[tuple, int], dict[tuple, int]]:
    """Current and target replica counts of one operator, keyed (operator, config, class[, "canary"])."""
    current: dict[tuple, int] = {}
    for r in op.active:
        key = (op.name, r.config, _CLUSTER, "canary") if r.canary else (op.name, r.config, _CLUSTER)
        current[key] = current.get(key, 0) + 1
    if op_plan is None:
        return current, dict(current)
    target = {(op.name, c, _CLUSTER): n for c, n in config_counts(op_plan.groups).items()}
    if op_plan.canary is not None:
        target[(op.name, op_plan.canary, _CLUSTER, "canary")] = 1
    return current, target


def _names_classes(plan: Plan, state: RunnerState) -> bool:
    return bool(state.nodes) and any(g.node_class for o in plan.operators for g in o.groups)


def _class_counts(state: RunnerState, plan: Plan) -> tuple[dict[tuple, int], dict[tuple, int], dict[str, tuple[float, float]]]:
    """Current and target counts keyed (operator, config, node class[, "canary"]) and each class's
    free capacity, for a plan that names node classes; refuses one that does not fit the live nodes."""
    by_class = classes(state.nodes)
    for o in plan.operators:
        for g in o.groups:
            if g.node_class and g.node_class not in by_class:
                raise RuntimeConfigError(f"the plan places {g.replicas} x {o.operator} {g.config.label()} on node class {g.node_class!r}, "
                                         f"which no live node has (now: {sorted(by_class)}): a node left or the plan is stale; plan again")
    biggest = max(by_class, key=lambda c: sum(n.cpus for n in by_class[c]))
    capacity = {c: [sum(n.cpus for n in ns), sum(n.gpus for n in ns)] for c, ns in by_class.items()}
    current: dict[tuple, int] = {}
    for op in state.operators:
        for r in op.replicas:
            where = r.node_class if r.node_class in by_class else biggest
            if r.draining:
                capacity[where][0] -= r.config.cpus
                capacity[where][1] -= r.config.gpus
                continue
            key = (op.name, r.config, where, "canary") if r.canary else (op.name, r.config, where)
            current[key] = current.get(key, 0) + 1
    planned = {o.operator: o for o in plan.operators}
    target: dict[tuple, int] = {}
    for op in state.operators:
        op_plan = planned.get(op.name)
        if op_plan is None:  # not in the plan: keeps what runs where it runs
            target.update({k: n for k, n in current.items() if k[0] == op.name})
            continue
        if op_plan.canary is not None:
            old = next((k for k in current if k[0] == op.name and len(k) == 4 and k[1] == op_plan.canary), None)
            target[old or (op.name, op_plan.canary, biggest, "canary")] = 1
        for g in op_plan.groups:
            if not g.replicas:
                continue
            if g.node_class:
                key = (op.name, g.config, g.node_class)
                target[key] = target.get(key, 0) + g.replicas
                continue
            left = g.replicas  # no class: keep the replicas of this config where they run, the rest where most CPUs are
            for key, n in sorted(current.items(), key=lambda kv: -kv[1]):
                if len(key) == 3 and key[0] == op.name and key[1] == g.config and left:
                    take = min(n - target.get(key, 0), left)
                    if take > 0:
                        target[key] = target.get(key, 0) + take
                        left -= take
            if left:
                key = (op.name, g.config, biggest)
                target[key] = target.get(key, 0) + left
    check_fits(state.nodes, [(f"{k[0]} {k[1].label()}", k[2], k[1].cpus, k[1].gpus) for k, n in target.items() for _ in range(n)])
    return current, target, {c: (v[0], v[1]) for c, v in capacity.items()}


def rolling_steps(state: RunnerState, plan: Plan) -> Transition:
    """Rolling steps from ``state`` to ``plan`` (see the module docstring)."""
    check_plan(plan, state)
    if _names_classes(plan, state):
        return _class_transition(state, plan)
    draining = [r.config for o in state.operators for r in o.replicas if r.draining]
    capacity = {_CLUSTER: (state.cluster_cpus - sum(c.cpus for c in draining), state.cluster_gpus - sum(c.gpus for c in draining))}
    current: dict[tuple, int] = {}
    target: dict[tuple, int] = {}
    steps: list[TransitionStep] = []
    reasons: dict[str, str] = {}
    for op in state.operators:
        op_plan = plan.for_operator(op.name) if op.name in {o.operator for o in plan.operators} else None
        cur, tgt = _counts(op, op_plan)
        reasons[op.name] = (op_plan.reason if op_plan is not None else "") or "plan"
        for key, n in cur.items():
            if len(key) == 4 and key not in tgt:  # ending a canary frees its room before anything starts
                steps.append(TransitionStep(StepKind.END_CANARY, op.name, key[1], n, reason=f"end canary: {reasons[op.name]}"))
                continue
            current[key] = n
        target.update(tgt)
    resized, current = batch_resizes(current, target, lambda k: k[1])
    steps += _resize_steps(resized, reasons, by_class=False)
    try:
        phases = order_steps(current, target, capacity, lambda k: (k[1].cpus, k[1].gpus), [o.operator for o in plan.operators],
                             resource_names=("CPUs", "GPUs"), label=lambda k: k[1].label())
    except ValueError as exc:
        raise RuntimeConfigError(f"{exc}; the cluster has no free resources left: free some or plan fewer replicas") from exc
    steps += _phase_steps(phases, reasons, by_class=False)
    reason = plan.reason or ("no change" if not steps else "apply plan")
    return Transition(tuple(steps), reason=reason, expected_gain=0.0, plan=plan)


def _class_transition(state: RunnerState, plan: Plan) -> Transition:
    """``rolling_steps`` for a plan that names node classes: every step names its class."""
    current, target, capacity = _class_counts(state, plan)
    reasons = {o.operator: o.reason or "plan" for o in plan.operators}
    steps: list[TransitionStep] = []
    for key, n in list(current.items()):
        if len(key) == 4 and key not in target:  # ending a canary frees its room before anything starts
            steps.append(TransitionStep(StepKind.END_CANARY, key[0], key[1], n, node_class=key[2],
                                        reason=f"end canary: {reasons.get(key[0], 'plan')}"))
            del current[key]
    resized, current = batch_resizes(current, target, lambda k: k[1])
    steps += _resize_steps(resized, reasons, by_class=True)
    try:
        phases = order_steps(current, target, capacity, lambda k: (k[1].cpus, k[1].gpus), [o.operator for o in plan.operators],
                             resource_names=("CPUs", "GPUs"), label=lambda k: f"{k[1].label()} on {k[2]}")
    except ValueError as exc:
        raise RuntimeConfigError(f"{exc}; the node class has no free resources left: free some or plan fewer replicas") from exc
    steps += _phase_steps(phases, reasons, by_class=True)
    reason = plan.reason or ("no change" if not steps else "apply plan")
    return Transition(tuple(steps), reason=reason, expected_gain=0.0, plan=plan)


def _resize_steps(resized: list[tuple[tuple, tuple, int]], reasons: dict[str, str], by_class: bool) -> list[TransitionStep]:
    """The RESIZE steps of ``batch_resizes``' pairs, keys (operator, config, class); with ``by_class`` each names its class."""
    return [TransitionStep.resize(new[0], old[1], new[1], n, new[2] if by_class else None, reasons.get(new[0], "plan"))
            for old, new, n in resized]


def _phase_steps(phases: list[Phase], reasons: dict[str, str], by_class: bool) -> list[TransitionStep]:
    """The START/CANARY/RETIRE steps of ``order_steps``'s phases, keys (operator, config, class[, "canary"]);
    with ``by_class`` every step names its node class."""
    steps = []
    for phase in phases:
        for key, n in phase.moves:
            name, config = key[0], key[1]
            where = key[2] if by_class else None
            reason = reasons.get(name, "plan")
            if phase.kind == StepKind.START:
                canary = len(key) == 4
                steps.append(TransitionStep(StepKind.CANARY if canary else StepKind.START, name, config, n, node_class=where,
                                            reason=f"canary: {reason}" if canary else reason))
            else:
                steps.append(TransitionStep(StepKind.RETIRE, name, config, n, node_class=where,
                                            reason=f"make room: {phase.note}" if phase.note else reason))
    return steps


@dataclass(frozen=True)
class RoomFor:
    """The START a RETIRE step makes room for: its config and count, each node's free (CPUs, GPUs) now, and
    the node a replica holds (``node_of``; None while it has none)."""

    config: OpConfig
    count: int
    free: Mapping[Hashable, tuple[float, float]]
    node_of: Callable[[Any], Hashable | None]

    def _fits(self, room: tuple[float, float]) -> bool:
        return _fits(self.config, room)

    def _take(self, room: tuple[float, float]) -> tuple[float, float]:
        return room[0] - self.config.cpus, room[1] - self.config.gpus

    def pick(self, ranked: Sequence[Any], count: int) -> list[Any]:
        """``count`` of ``ranked`` (the pool's order): while the START lacks room, first the first victim on a node
        where it then fits; otherwise the pool's order."""
        lacking, free = _first_fit(self.config, self.count, self.free)  # the START takes the room there is first

        def freed(r: Any) -> tuple[float, float] | None:
            node = self.node_of(r)
            return None if node not in free else (free[node][0] + r.config.cpus, free[node][1] + r.config.gpus)

        rest, chosen = list(ranked), []
        while rest and len(chosen) < count:
            makes_room = [r for r in rest if lacking > 0 and (room := freed(r)) is not None and self._fits(room)]
            victim = makes_room[0] if makes_room else rest[0]
            rest.remove(victim)
            chosen.append(victim)
            room = freed(victim)
            if room is None:
                continue
            if lacking > 0 and self._fits(room):
                room, lacking = self._take(room), lacking - 1
            free[self.node_of(victim)] = room
        return chosen


def emptied_by_swap(done: Sequence[Mapping[str, Any]], serving: Callable[[str], bool]) -> list[tuple[str, OpConfig]]:
    """(operator, config it last retired) for each operator ``done`` retired replicas of that now has no serving replica."""
    last: dict[str, OpConfig] = {}
    for step in done:
        if step["kind"] == StepKind.RETIRE.value:
            last[step["operator"]] = OpConfig.from_dict(step["config"])
    return [(name, config) for name, config in last.items() if not serving(name)]


def _fits(config: OpConfig, room: tuple[float, float]) -> bool:
    return room[0] + _EPS >= config.cpus and room[1] + _EPS >= config.gpus


def _first_fit(config: OpConfig, count: int, free: Mapping[Hashable, tuple[float, float]]) -> tuple[int, dict[Hashable, tuple[float, float]]]:
    """``count`` replicas of ``config`` placed first-fit on ``free`` (each node's free CPUs and GPUs): how many
    find no node, and each node's room left after them."""
    left, rooms = count, dict(free)
    for node, room in rooms.items():
        while left > 0 and _fits(config, room):
            room, left = (room[0] - config.cpus, room[1] - config.gpus), left - 1
        rooms[node] = room
    return left, rooms


def no_room(step: TransitionStep, free: Mapping[Hashable, tuple[float, float]]) -> str | None:
    """Why START/CANARY ``step``'s replicas cannot all start now, placed first-fit on ``free`` (each node's free
    CPUs and GPUs); None when they fit, when no node is known or when the step names a node class.

    Both runners (``refuse_without_room``) refuse such a step at once while no replica drains (on a fixed
    cluster nothing else makes room) instead of waiting out the warm timeout: the total free CPUs/GPUs that
    steps and canaries are admitted on may sit on nodes where a GPU replica cannot take its CPU beside its
    GPU, and each such wait would hold the control loop for the whole timeout."""
    if not free or step.node_class is not None:
        return None
    config = step.config
    left, _ = _first_fit(config, step.count, free)
    if not left:
        return None
    cpus, gpus = sum(room[0] for room in free.values()), sum(room[1] for room in free.values())
    return (f"no node has room for {left} of {step.count} {config.label()} replica(s) ({config.cpus:g} CPUs + {config.gpus:g} GPUs "
            f"each, on one node; {cpus:g} CPUs and {gpus:g} GPUs are free over {len(free)} nodes) and no replica is draining")


def refuse_without_room(step: TransitionStep, pools: Sequence[Any], free: Callable[[], Mapping[Hashable, tuple[float, float]]]) -> None:
    """Raise ``RuntimeError`` (``no_room``'s reason) when START/CANARY ``step`` cannot start now while no replica
    of ``pools`` (the runner's, live or simulated: records with ``draining`` and ``dead``) drains; ``free()``
    reads each node's free CPUs and GPUs, only then."""
    if any(r.draining and not r.dead for pool in pools for r in pool.replicas.values()):
        return
    why = no_room(step, free())
    if why is not None:
        raise RuntimeError(why)


def room_for(steps: Sequence[TransitionStep], k: int, free: Callable[[], Mapping[Hashable, tuple[float, float]]],
             node_of: Callable[[Any], Hashable | None]) -> RoomFor | None:
    """The room step ``k`` (a RETIRE) should make: for the next START or CANARY of ``steps``, with each node's free
    resources as ``free()`` reads them now (only for such a step); None when none follows or no node is known."""
    if steps[k].kind != StepKind.RETIRE:
        return None
    start = next((s for s in steps[k + 1:] if s.kind in (StepKind.START, StepKind.CANARY)), None)
    now = free() if start is not None else {}
    return RoomFor(start.config, start.count, now, node_of) if now else None


def room_first(steps: Sequence[TransitionStep], k: int, free: Callable[[], Mapping[Hashable, tuple[float, float]]],
               pools: Sequence[tuple[str, Any]] = (), node_of: Callable[[Any], Hashable | None] = lambda r: None) -> tuple[TransitionStep, ...]:
    """``steps`` made to give START/CANARY step ``k`` room where no node has it now (``no_room`` on ``free()``);
    ``steps`` unchanged otherwise. ``order_steps`` orders by a class's totals, so a start may find the free CPUs on one
    node and the free GPU share on another. The plan's next RETIRE moves before the start (it then retires where the
    start fits, ``room_for``); where none follows, a CPU replica moves off a node where the start would then fit: a START
    of one replica of its config (it cannot land there: that node lacks the CPUs) and a RETIRE of one, which ``room_for``
    aims at that node. ``pools``: ``(operator, pool)`` pairs of either runner, whose serving CPU-only replicas on a
    known node (``node_of``) may move; at most ``steps[k].count`` such moves per start. The runners call this before
    each step."""
    step = steps[k]
    if step.kind not in (StepKind.START, StepKind.CANARY):
        return tuple(steps)
    j = next((j for j in range(k + 1, len(steps)) if steps[j].kind == StepKind.RETIRE), None)
    if j is None and step.config.gpus == 0:
        return tuple(steps)  # a CPU replica no node has room for: no CPU is free anywhere, no move makes one
    room = free()
    if no_room(step, room) is None:
        return tuple(steps)
    if j is not None:
        return (*steps[:k], steps[j], *steps[k:j], *steps[j + 1:])
    why = f"make room on one node for {step.operator} {step.config.label()}"
    if sum(1 for s in steps[:k] if s.kind == StepKind.RETIRE and s.reason == why) >= step.count:
        return tuple(steps)
    move = _cpu_move(step.config, room, _cpu_replicas_by_node(pools, node_of))
    if move is None:
        return tuple(steps)
    name, config = move
    return (*steps[:k], TransitionStep(StepKind.START, name, config, 1, reason=why), TransitionStep(StepKind.RETIRE, name, config, 1, reason=why),
            *steps[k:])


def step_room(steps: Sequence[TransitionStep], k: int, free: Callable[[], Mapping[Hashable, tuple[float, float]]],
              pools: Sequence[tuple[str, Any]], node_of: Callable[[Any], Hashable | None]) -> tuple[tuple[TransitionStep, ...], RoomFor | None]:
    """What the runners do before step ``k``: ``steps`` as ``room_first`` makes them, and the room their step ``k``
    makes (``room_for``)."""
    steps = room_first(steps, k, free, pools, node_of)
    return steps, room_for(steps, k, free, node_of)


def _cpu_move(config: OpConfig, free: Mapping[Hashable, tuple[float, float]],
              movable: Mapping[Hashable, Sequence[tuple[str, OpConfig]]]) -> tuple[str, OpConfig] | None:
    """A CPU replica (operator, config) whose move frees a replica of ``config`` room: on a node with the GPU share but
    too few CPUs (fewer than it holds, so its new replica lands elsewhere), where another node has its CPUs free."""
    for node, (cpus, gpus) in free.items():
        if gpus + _EPS < config.gpus or cpus + _EPS >= config.cpus:
            continue
        for name, held in movable.get(node, ()):
            if (held.gpus == 0 and cpus + held.cpus + _EPS >= config.cpus and cpus + _EPS < held.cpus
                    and any(other != node and room[0] + _EPS >= held.cpus for other, room in free.items())):
                return name, held
    return None


def _cpu_replicas_by_node(pools: Sequence[tuple[str, Any]], node_of: Callable[[Any], Hashable | None]) -> dict[Hashable, list[tuple[str, OpConfig]]]:
    """Each node's serving CPU-only replicas as (operator, config), from ``(operator, pool)`` pairs of either runner
    (records with ``config``, ``canary``, ``draining`` and ``dead``)."""
    out: dict[Hashable, list[tuple[str, OpConfig]]] = {}
    for name, pool in pools:
        for r in pool.replicas.values():
            node = node_of(r)
            if node is not None and r.config.gpus == 0 and not (r.canary or r.draining or r.dead):
                out.setdefault(node, []).append((name, r.config))
    return out


def resize_victims(pool: Any, step: TransitionStep) -> list[Any]:
    """The replicas a ``RESIZE`` ``step`` moves to its config in ``pool`` (the live runner's and the simulator's alike):
    ``step.count`` serving ones (not draining, not canaries) of ``step.from_config``, those on ``step.node_class`` first
    where the step names one; ``RuntimeConfigError`` when fewer run."""
    found = sorted((r for r in pool.replicas.values() if r.config == step.from_config and not r.draining and not r.dead and not r.canary),
                   key=lambda r: step.node_class is not None and getattr(r, "node_class", None) != step.node_class)
    if len(found) < step.count:
        raise RuntimeConfigError(f"operator {step.operator!r}: asked to resize {step.count} replica(s) of "
                                 f"{step.from_config.label() if step.from_config else '?'} but only {len(found)} run with that config")
    return found[: step.count]


def retire_victims(pool: Any, step: TransitionStep, replaced: bool, room: RoomFor | None = None, **choose: Any) -> list[Any]:
    """The replicas a RETIRE / END_CANARY ``step`` takes from ``pool`` (the live runner's and the simulator's
    alike), or ``RuntimeConfigError`` when the pool runs too few of that config or the step would leave the
    operator with no replica and no replacement. ``replaced``: a later step starts a replacement; ``room``: the
    start it makes room for; ``choose``: more arguments for the pool's ``choose_retire`` (the live pool's
    ``node_class``).

    With ``room``, victims on nodes where that START then fits go first: the step order counts the cluster's
    (or a class's) free resources in total, and a GPU replica needs its CPU on the node of its GPU. Freeing
    CPUs on nodes without a free GPU leaves a start of GPU replicas waiting out the warm timeout, with the
    retire that would have made room queued behind it."""
    canary = step.kind == StepKind.END_CANARY
    ranked = pool.choose_retire(step.config, len(pool.replicas), canary=canary, **choose)
    victims = room.pick(ranked, step.count) if room is not None and not canary else ranked[: step.count]
    if canary and not victims:
        victims = pool.active(canary=True)[: step.count]
    if len(victims) < step.count:
        raise RuntimeConfigError(f"operator {step.operator!r}: asked to retire {step.count} replica(s) of {step.config.label()} "
                                 f"but only {len(victims)} run with that config")
    if not canary and not replaced and len(pool.active(canary=False)) - len(victims) < 1:
        raise RuntimeConfigError(f"operator {step.operator!r}: retiring {len(victims)} would leave no replica and no later step "
                                 "starts a replacement; start new ones first")
    return victims
