"""From the running state and a target Plan to ordered rolling steps (a pure function).

Contract:
- ``check_plan(plan, state)`` refuses (``RuntimeConfigError``) a plan naming an unknown
  operator, leaving an operator without replicas, or needing more CPUs/GPUs than the cluster.
- ``plan_transition(state, plan) -> Transition``: per operator, the replicas to start and to
  retire per config (canaries apart: ``OperatorPlan.canary`` -> ``CANARY`` / ``END_CANARY``).
  The order is ``scheduler.transition_cost.order_steps``, the same one the scheduler prices:
  starts before retires, to keep capacity high; when the free CPUs/GPUs do not fit a start,
  just enough replicas retire first, keeping every operator serving where possible, and an
  operator whose last replica must make room is swapped in place (drained, then replaced),
  so a full cluster still rolls replica by replica.
  Operators not named in the plan keep their replicas. No Ray, no I/O.
"""

from __future__ import annotations

from trident_flows.runtime.state import OperatorState, RunnerState, RuntimeConfigError
from trident_flows.scheduler.transition_cost import order_steps
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


_CLUSTER = "cluster"


def _counts(op: OperatorState, op_plan) -> tuple[dict[tuple, int], dict[tuple, int]]:
    """Current and target replica counts of one operator, keyed (operator, config, class[, "canary"])."""
    current: dict[tuple, int] = {}
    for r in op.active:
        key = (op.name, r.config, _CLUSTER, "canary") if r.canary else (op.name, r.config, _CLUSTER)
        current[key] = current.get(key, 0) + 1
    if op_plan is None:
        return current, dict(current)
    target = {(op.name, c, _CLUSTER): n for c, n in _target_counts(op_plan.groups).items()}
    if op_plan.canary is not None:
        target[(op.name, op_plan.canary, _CLUSTER, "canary")] = 1
    return current, target


def plan_transition(state: RunnerState, plan: Plan) -> Transition:
    """Rolling steps from ``state`` to ``plan`` (see the module docstring)."""
    check_plan(plan, state)
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
    try:
        phases = order_steps(current, target, capacity, lambda k: (k[1].cpus, k[1].gpus), [o.operator for o in plan.operators],
                             resource_names=("CPUs", "GPUs"), label=lambda k: k[1].label())
    except ValueError as exc:
        raise RuntimeConfigError(f"{exc}; the cluster has no free resources left: free some or plan fewer replicas") from exc
    for phase in phases:
        for key, n in phase.moves:
            name, config = key[0], key[1]
            if phase.kind == StepKind.START:
                canary = len(key) == 4
                steps.append(TransitionStep(StepKind.CANARY if canary else StepKind.START, name, config, n,
                                            reason=f"canary: {reasons[name]}" if canary else reasons[name]))
            else:
                steps.append(TransitionStep(StepKind.RETIRE, name, config, n,
                                            reason=f"make room: {phase.note}" if phase.note else reasons[name]))
    reason = plan.reason or ("no change" if not steps else "apply plan")
    return Transition(tuple(steps), reason=reason, expected_gain=0.0, plan=plan)


def plan_signature(plan: Plan) -> frozenset:
    """What a plan asks for (replicas per operator and config, and canaries), for telling an
    unchanged re-issue of a refused plan from a new one."""
    out = set()
    for o in plan.operators:
        for c, n in _target_counts(o.groups).items():
            if n:
                out.add((o.operator, c, n))
        if o.canary is not None:
            out.add((o.operator, o.canary, "canary"))
    return frozenset(out)


def placement_signature(state: RunnerState) -> frozenset:
    """What runs: non-draining replicas per (operator, config, canary or not)."""
    counts: dict[tuple, int] = {}
    for op in state.operators:
        for r in op.active:
            counts[(op.name, r.config, r.canary)] = counts.get((op.name, r.config, r.canary), 0) + 1
    return frozenset((*key, n) for key, n in counts.items())
