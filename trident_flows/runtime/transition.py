"""From the running state and a target Plan to ordered rolling steps (a pure function).

Contract:
- ``check_plan(plan, state)`` refuses (``RuntimeConfigError``) a plan naming an unknown
  operator, leaving an operator without replicas, or needing more CPUs/GPUs than the cluster.
- ``plan_transition(state, plan) -> Transition``: per operator, the replicas to start and to
  retire per config (canaries apart: ``OperatorPlan.canary`` -> ``CANARY`` / ``END_CANARY``).
  Starts come before retires, to keep capacity high; when the free resources of the
  cluster do not fit a start, the planner retires one replica (of the same operator first)
  to make room, then continues, so a full cluster still rolls replica by replica.
  Operators not named in the plan keep their replicas. No Ray, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from trident_flows.runtime.state import OperatorState, RunnerState, RuntimeConfigError
from trident_flows.scheduler.types import OpConfig, Plan, StepKind, Transition, TransitionStep

_EPS = 1e-9


def _target_counts(plan_groups) -> dict[OpConfig, int]:
    counts: dict[OpConfig, int] = {}
    for g in plan_groups:
        counts[g.config] = counts.get(g.config, 0) + g.replicas
    return counts


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


@dataclass
class _Move:
    operator: str
    config: OpConfig
    count: int
    reason: str


def _changes(op: OperatorState, op_plan) -> tuple[list[_Move], list[_Move], list[TransitionStep]]:
    current = op.configs()
    target = _target_counts(op_plan.groups)
    reason = op_plan.reason or "plan"
    starts = [_Move(op.name, c, n - current.get(c, 0), reason) for c, n in target.items() if n > current.get(c, 0)]
    retires = [_Move(op.name, c, n - target.get(c, 0), reason) for c, n in current.items() if n > target.get(c, 0)]
    canaries = sorted({r.config for r in op.active if r.canary}, key=lambda c: c.label())
    canary_steps: list[TransitionStep] = []
    for c in canaries:
        if c != op_plan.canary:
            canary_steps.append(TransitionStep(StepKind.END_CANARY, op.name, c, 1, reason=f"end canary: {reason}"))
    if op_plan.canary is not None and op_plan.canary not in canaries:
        canary_steps.append(TransitionStep(StepKind.CANARY, op.name, op_plan.canary, 1, reason=f"canary: {reason}"))
    return starts, retires, canary_steps


def plan_transition(state: RunnerState, plan: Plan) -> Transition:
    """Rolling steps from ``state`` to ``plan`` (see the module docstring)."""
    check_plan(plan, state)
    free_cpus = state.cluster_cpus - state.used_cpus
    free_gpus = state.cluster_gpus - state.used_gpus
    starts: list[_Move] = []
    retires: list[_Move] = []
    steps: list[TransitionStep] = []
    end_canaries: list[TransitionStep] = []
    new_canaries: list[TransitionStep] = []
    for op_plan in plan.operators:
        s, r, c = _changes(state.operator(op_plan.operator), op_plan)
        starts += s
        retires += r
        end_canaries += [x for x in c if x.kind == StepKind.END_CANARY]
        new_canaries += [x for x in c if x.kind == StepKind.CANARY]
    # Ending canaries frees room first; new canaries are started like any other replica.
    for step in end_canaries:
        steps.append(step)
        free_cpus += step.config.cpus
        free_gpus += step.config.gpus
    pending_starts = [(m, False) for m in starts] + [(_Move(s.operator, s.config, 1, s.reason), True) for s in new_canaries]
    while pending_starts:
        progressed = False
        for entry in list(pending_starts):
            move, is_canary = entry
            fits = move.count
            if move.config.cpus > 0:
                fits = min(fits, int((free_cpus + _EPS) // move.config.cpus))
            if move.config.gpus > 0:
                fits = min(fits, int((free_gpus + _EPS) // move.config.gpus))
            if fits > 0:
                kind = StepKind.CANARY if is_canary else StepKind.START
                steps.append(TransitionStep(kind, move.operator, move.config, fits, reason=move.reason))
                free_cpus -= fits * move.config.cpus
                free_gpus -= fits * move.config.gpus
                move.count -= fits
                progressed = True
            if move.count == 0:
                pending_starts.remove(entry)
        if not pending_starts:
            break
        if not progressed:
            blocked = pending_starts[0][0]
            same_op = [m for m in retires if m.operator == blocked.operator and m.count > 0]
            pool = same_op or [m for m in retires if m.count > 0]
            if not pool:
                raise RuntimeConfigError(f"operator {blocked.operator!r}: cannot start {blocked.count} replica(s) of {blocked.config.label()}; "
                                         "the cluster has no free resources left and nothing to retire")
            victim = pool[0]
            steps.append(TransitionStep(StepKind.RETIRE, victim.operator, victim.config, 1, reason=f"make room: {victim.reason}"))
            free_cpus += victim.config.cpus
            free_gpus += victim.config.gpus
            victim.count -= 1
    for move in retires:
        if move.count > 0:
            steps.append(TransitionStep(StepKind.RETIRE, move.operator, move.config, move.count, reason=move.reason))
    reason = plan.reason or ("no change" if not steps else "apply plan")
    return Transition(tuple(steps), reason=reason, expected_gain=0.0, plan=plan)
