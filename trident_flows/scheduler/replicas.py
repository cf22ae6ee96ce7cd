"""Reading replica counts out of a ``RunnerState``, writing "scale this operator" plans, packing replicas' GPU shares on devices.

Contract (pure functions, shared by the baseline policies and the Trident controller):
- ``replica_groups(counts)``: ``{config: replicas}`` as an ``OperatorPlan``'s groups, one per config, sorted by label.
- ``serving_groups(op)``: one ``ReplicaGroup`` per config among its non-draining, non-canary replicas.
- ``main_config(op, spec)``: the most common serving config (ties: the spec's initial config).
- ``scaled_plan(op, target, reason)``: the ``OperatorPlan`` giving ``op`` ``target`` replicas of its
  main config (others kept; the main config goes first when scaling down; canaries carried over).
- ``canary_config(op)`` / ``canary_busy(op, config)``: its running canary and whether it holds a batch.
- ``replica_limits(name, spec)``: ``(min_replicas, max_replicas)`` (``(1, 64)`` without a spec).
- ``free_resources(state)`` / ``held(counts)``: ``(cpus, gpus)`` free, or held by ``counts``.
- ``within_cluster(plan, state)``: ``plan`` with replicas taken off, largest group first, until it needs no more
  CPUs or GPUs than the cluster has (counted as ``runtime.transition.check_plan`` counts them), and what was taken.
- ``gpus_pack(state, cluster, moves)``: whether the allocation after ``moves`` fits the GPUs device
  by device, as far as the state tells (one node, no device shared now; whole-GPU shares first,
  then fractional ones first fit).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Mapping, Sequence

from trident_flows.core.state import OperatorState, RunnerState
from trident_flows.core.types import ClusterSpec, OpConfig, OperatorPlan, Plan, ReplicaGroup


def replica_groups(counts: Mapping[OpConfig, int]) -> tuple[ReplicaGroup, ...]:
    """``counts`` as one ``ReplicaGroup`` per config, sorted by the config's label."""
    return tuple(ReplicaGroup(c, n) for c, n in sorted(counts.items(), key=lambda kv: kv[0].label()))


def serving_groups(op: OperatorState) -> tuple[ReplicaGroup, ...]:
    """Non-draining, non-canary replicas of ``op`` as one group per config (sorted by label)."""
    return replica_groups(op.configs(include_canary=False))


def canary_config(op: OperatorState) -> OpConfig | None:
    """The config of the operator's running canary, if any."""
    for r in op.active:
        if r.canary:
            return r.config
    return None


def canary_busy(op: OperatorState, config: OpConfig) -> bool:
    """The operator's running canary of ``config`` holds a batch (it is measuring one, not starved)."""
    return any(r.canary and r.config == config and r.inflight > 0 for r in op.active)


def replica_limits(name: str, spec: Any | None) -> tuple[int, int]:
    """(min_replicas, max_replicas) of operator ``name`` from the pipeline spec."""
    if spec is None:
        return 1, 64
    try:
        op = spec.operator(name)
    except (KeyError, ValueError):
        return 1, 64
    return int(op.min_replicas), int(op.max_replicas)


def main_config(op: OperatorState, spec: Any | None = None) -> OpConfig | None:
    """The most common serving config of ``op`` (None when it runs no replica)."""
    counts = op.configs(include_canary=False)
    if not counts:
        return None
    initial = None
    if spec is not None:
        try:
            initial = spec.operator(op.name).config
        except (KeyError, ValueError):
            initial = None
    return max(counts, key=lambda c: (counts[c], c == initial, c.label()))


def scaled_plan(op: OperatorState, target: int, reason: str, spec: Any | None = None) -> OperatorPlan:
    """``op`` with ``target`` replicas in all: the main config absorbs the change (see module docstring)."""
    if target < 1:
        raise ValueError(f"operator {op.name!r}: target replicas must be >= 1, got {target}")
    counts = dict(op.configs(include_canary=False))
    main = main_config(op, spec)
    if main is None:
        raise ValueError(f"operator {op.name!r} runs no replica to scale; give it a config first")
    others = sum(n for c, n in counts.items() if c != main)
    if target > others:
        counts[main] = target - others
    else:  # scaling below the other configs: keep `target` of them, largest groups first
        counts = {main: 0}
        left = target
        for c, n in sorted(op.configs(include_canary=False).items(), key=lambda kv: (-kv[1], kv[0].label())):
            if c == main:
                continue
            keep = min(n, left)
            counts[c] = keep
            left -= keep
        if left > 0:
            counts[main] = left
    groups = tuple(ReplicaGroup(c, n) for c, n in sorted(counts.items(), key=lambda kv: kv[0].label()) if n > 0)
    return OperatorPlan(op.name, groups, reason, canary_config(op))


def free_resources(state: RunnerState) -> tuple[float, float]:
    """(cpus, gpus) of the cluster that no replica holds."""
    return state.cluster_cpus - state.used_cpus, state.cluster_gpus - state.used_gpus


def within_cluster(plan: Plan, state: RunnerState) -> tuple[Plan, list[str]]:
    """``plan`` trimmed to the cluster's CPUs and GPUs: its groups and canaries, and every operator it leaves out as it
    runs, need no more than ``state.cluster_cpus`` / ``cluster_gpus``; while they do, one replica fewer of the plan's
    largest group of a config holding the resource short (never an operator's last serving replica). Returns the plan
    (``plan`` itself when it fits) and one note per group trimmed. A canary carried into a placement that filled a
    multi-node cluster (whose canary room is kept only on a single node) is what overfills one."""
    ops = list(plan.operators)
    planned = {o.operator for o in ops}
    unplanned = [r.config for op in state.operators if op.name not in planned for r in op.active]

    def short() -> tuple[float, float]:
        configs = [(g.config, g.replicas) for o in ops for g in o.groups] + [(o.canary, 1) for o in ops if o.canary is not None]
        configs += [(c, 1) for c in unplanned]
        return (sum(c.cpus * n for c, n in configs) - state.cluster_cpus, sum(c.gpus * n for c, n in configs) - state.cluster_gpus)

    taken: dict[tuple[str, str], int] = {}
    while True:
        cpus, gpus = short()
        if cpus <= 1e-9 and gpus <= 1e-9:
            break
        trimmable = [(i, j) for i, o in enumerate(ops) for j, g in enumerate(o.groups)
                     if o.replicas > 1 and g.replicas > 0 and ((cpus > 1e-9 and g.config.cpus > 0) or (gpus > 1e-9 and g.config.gpus > 0))]
        if not trimmable:
            break  # nothing left to take: the runner refuses the plan with what it needs
        i, j = max(trimmable, key=lambda ij: (ops[ij[0]].groups[ij[1]].replicas, ops[ij[0]].operator))
        group = ops[i].groups[j]
        groups = list(ops[i].groups)
        groups[j] = replace(group, replicas=group.replicas - 1)
        ops[i] = replace(ops[i], groups=tuple(g for g in groups if g.replicas > 0))
        key = (ops[i].operator, group.config.label())
        taken[key] = taken.get(key, 0) + 1
    if not taken:
        return plan, []
    return replace(plan, operators=tuple(ops)), [f"{name}: {n} replica(s) of {label} fewer" for (name, label), n in taken.items()]


def held(counts: Mapping[OpConfig, int]) -> tuple[float, float]:
    """(cpus, gpus) held by ``counts[config]`` replicas of each config."""
    return sum(c.cpus * n for c, n in counts.items()), sum(c.gpus * n for c, n in counts.items())


def gpus_pack(state: RunnerState, cluster: ClusterSpec, moves: Mapping[str, Mapping[OpConfig, int]]) -> bool:
    """Whether the allocation after ``moves`` (every other operator as it runs) fits the GPUs device by device, as far as
    the runner's state tells: one node, no device shared by fractional replicas now (then the free devices are whole),
    and the GPU shares of every replica after the moves placed, largest first, onto its devices."""
    if len(cluster.node_classes) != 1 or cluster.node_classes[0].count != 1:
        return False
    if any(r.config.gpus > 0 and abs(r.config.gpus - round(r.config.gpus)) > 1e-9 for op in state.operators for r in op.replicas):
        return False
    after = {op.name: moves.get(op.name, op.configs()) for op in state.operators}
    shares = sorted((c.gpus for groups in after.values() for c, n in groups.items() for _ in range(n) if c.gpus > 0), reverse=True)
    devices = [1.0] * int(cluster.total_gpus)  # the room left on each device
    return (_place_whole_gpu_shares(devices, [s for s in shares if s >= 1])
            and _place_fractional_gpu_shares(devices, [s for s in shares if s < 1]))


def _place_whole_gpu_shares(devices: list[float], shares: Sequence[float]) -> bool:
    """Each share of one GPU or more (``k`` GPUs, rounded up) uses up the first ``k`` devices still whole; False when a
    share finds too few. ``devices`` (room left per device) is updated in place."""
    for share in shares:
        need = math.ceil(share - 1e-9)
        whole = [i for i, room in enumerate(devices) if room + 1e-9 >= 1.0]
        if len(whole) < need:
            return False
        for i in whole[:need]:
            devices[i] -= 1.0
    return True


def _place_fractional_gpu_shares(devices: list[float], shares: Sequence[float]) -> bool:
    """Each share under one GPU, in the order given, goes on the first device with room for it (first fit); False when
    none has. ``devices`` (room left per device) is updated in place."""
    for share in shares:
        fit = next((i for i, room in enumerate(devices) if room + 1e-9 >= share), None)
        if fit is None:
            return False
        devices[fit] -= share
    return True
