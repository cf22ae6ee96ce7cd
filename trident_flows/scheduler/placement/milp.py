"""Placement MILP: replicas x OpConfig x device x node class for every operator.

Contract:
- ``solve_placement(demands, cluster, current=None, solver=..., time_limit_s=1.0)`` returns a
  ``PlacementResult`` whose ``plan`` maximises the pipeline throughput ``T`` (input items/s) within
  every node class's resources (rows: ``formulation``); a cluster of at most ``SPLIT_MAX_NODES``
  nodes has a class per node.
- Solve path: the LP bound and a greedy plan (``greedy``), accepted within ``GAP_REL``; else HiGHS
  among plans near the bound, else the MILP warm-started from the greedy plan (``solvers``).
- Every returned plan packs node by node (``placement.model.pack_cluster``; repaired at most
  ``MAX_REPAIRS`` times), with replicas that add no throughput trimmed, except running ones no other
  replica needs the resources of: on a fixed cluster they cost nothing to keep, and a retired one
  costs its cold start when the workload turns back. ``status`` "optimal" is
  within ``GAP_REL`` of the best bound, "time_limit" the best plan by ``time_limit_s``, with its gap.
- Bad input raises ``PlacementError`` naming the operator and resource, never a solver status code.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Sequence

import pulp

from trident_flows.core.types import ClusterSpec, NodeClass, OperatorPlan, Plan, ReplicaGroup
from trident_flows.scheduler.placement.explain import diagnose_infeasible, operator_reason
from trident_flows.scheduler.placement.formulation import build_milp, integer_bound, throughput_bound
from trident_flows.scheduler.placement.greedy import Greedy, heuristic_start
from trident_flows.scheduler.placement.model import (
    SPLIT_SEP,
    Key,
    _place_on_node,
    base_class,
    class_capacity,
    effective_gpus,
    ineligibility,
    no_fit_message,
    operator_capacity,
    pack_cluster,
    throughput_of,
    usage_vector,
)
from trident_flows.scheduler.placement.solvers import DEFAULT_SOLVER, GAP_REL, SOLVERS, WarmHiGHS, solver_cmd, status_gap
from trident_flows.scheduler.placement.types import CurrentPlacement, OperatorDemand

MAX_REPAIRS = 5
SPLIT_MAX_NODES = 4
# HiGHS first searches only plans within GAP_REL of the bound, for _TARGET_S seconds of CPU
# when at least _TARGET_S / _TARGET_SHARE are left (measured on the 16-node benchmark: when
# it succeeds it does in 30-70 ms, versus 60-190 ms for the search from the greedy start;
# with less time left, what it costs when it fails weighs more than what it saves).
_TARGET_SHARE = 0.3
_TARGET_S = 0.05


class PlacementError(ValueError):
    """The placement problem has no solution; the message names the operator/resource."""


@dataclass(frozen=True)
class PlacementResult:
    """A solved placement: the plan, its replica counts, and how the solve went.

    ``status`` is "optimal" or "time_limit" (best plan found, optimality not proven);
    ``gap`` the relative gap between the best bound and the plan's objective (0 when
    optimal); ``repairs`` how many re-solves node-level packing needed."""

    plan: Plan
    counts: tuple[tuple[Key, int], ...]
    throughput: float
    status: str
    gap: float
    solver: str
    build_ms: float
    solve_ms: float
    total_ms: float
    repairs: int
    bottlenecks: tuple[str, ...]

    @property
    def count_map(self) -> dict[Key, int]:
        return dict(self.counts)


def _per_node_fit(option_vec: tuple[float, float, float], nc: NodeClass) -> int:
    mem = float(nc.host_memory_bytes) if nc.host_memory_bytes else math.inf
    return _place_on_node((float(nc.cpus), mem, (1.0,) * nc.gpus), option_vec, 10**9)[1]


def _split_small_classes(cluster: ClusterSpec) -> ClusterSpec:
    """In a cluster of at most ``SPLIT_MAX_NODES`` nodes every node becomes its own class,
    so per-node limits are exact where aggregation loses most (measured: splitting the
    classes of a 16-node cluster makes the MILP slower and its time-limited plans worse)."""
    if sum(nc.count for nc in cluster.node_classes) > SPLIT_MAX_NODES:
        return cluster
    classes = []
    for nc in cluster.node_classes:
        if nc.count > 1:
            classes += [replace(nc, name=f"{nc.name}{SPLIT_SEP}{i}", count=1) for i in range(nc.count)]
        else:
            classes.append(nc)
    return ClusterSpec(tuple(classes))


def _merge(counts: dict[Key, int]) -> dict[Key, int]:
    """Counts of per-node model classes summed back onto their node classes."""
    merged: dict[Key, int] = {}
    for (op, k, c), n in counts.items():
        key = Key(op, k, base_class(c))
        merged[key] = merged.get(key, 0) + n
    return merged


def _current_counts(demands: Sequence[OperatorDemand], cluster: ClusterSpec, current: CurrentPlacement) -> dict[Key, int]:
    """Current replicas as (operator, option, node class) counts; groups whose config is
    not an option are left out."""
    counts: dict[Key, int] = {}
    for d in demands:
        for g in current.for_operator(d.name):
            k = d.option_index(g.config)
            if k is None:
                continue
            c = g.node_class or next((nc.name for nc in cluster.node_classes if ineligibility(d, d.options[k], nc) is None), None)
            if c is not None:
                key = Key(d.name, k, c)
                counts[key] = counts.get(key, 0) + g.replicas
    return counts


def _validate(demands: Sequence[OperatorDemand], cluster: ClusterSpec, solver: str) -> None:
    if solver not in SOLVERS:
        raise ValueError(f"solver must be one of {SOLVERS}, got {solver!r}")
    names = [d.name for d in demands]
    if not demands:
        raise ValueError("demands is empty: give one OperatorDemand per pipeline operator")
    if len(set(names)) != len(names):
        raise ValueError(f"operator names must be unique, got {names}")
    known = {nc.name for nc in cluster.node_classes}
    for d in demands:
        for restriction in [d.node_classes] + [o.node_classes for o in d.options]:
            unknown = set(restriction or ()) - known
            if unknown:
                raise ValueError(f"operator {d.name!r} names unknown node classes {sorted(unknown)}; the cluster has {sorted(known)}")



def solve_placement(demands: Sequence[OperatorDemand], cluster: ClusterSpec, current: CurrentPlacement | None = None, *,
                    solver: str = DEFAULT_SOLVER, time_limit_s: float = 1.0, threads: int = 1) -> PlacementResult:
    """Solve the placement MILP; see the module docstring. ``time_limit_s`` bounds the whole
    call (all solves); at the limit the best plan found is returned with its status and gap.
    Raises ``PlacementError``.

    Packing repair: replicas that do not pack node by node are dropped, their class shrunk by them, and the
    greedy refills (at most ``MAX_REPAIRS`` times); then replicas that do not raise throughput are trimmed,
    current ones last, and current ones come back where their resources are left free (``_keep_running``). The cost of switching is left to ``placement.transition_cost``."""
    t0 = time.perf_counter()
    demands = list(demands)
    _validate(demands, cluster, solver)
    cur = _current_counts(demands, cluster, current) if current is not None else None
    original, cluster = cluster, _split_small_classes(cluster)
    eligible = _eligible(demands, cluster, original)
    reductions: dict[str, list[float]] = {nc.name: [0.0, 0.0, 0.0] for nc in cluster.node_classes}
    tb = time.perf_counter()
    prob, x, served = build_milp(demands, cluster, eligible, cur or {}, reductions)
    ts = time.perf_counter()
    build_ms = (ts - tb) * 1e3
    found = _search(prob, x, served, demands, cluster, eligible, reductions, cur or {}, solver=solver, time_limit_s=time_limit_s,
                    threads=threads, t0=t0)
    solve_ms = (time.perf_counter() - ts) * 1e3
    counts, repair, gap = _packed(found, demands, cluster, eligible, reductions)
    counts = _merge(_trim(demands, cluster, counts, cur or {}))
    if cur:
        counts = _keep_running(demands, original, counts, cur)
    return _result(demands, original, counts, cur, found.status, gap, solver, repair, build_ms, solve_ms, t0)


def _eligible(demands: Sequence[OperatorDemand], cluster: ClusterSpec, original: ClusterSpec) -> dict[Key, int]:
    """Every (operator, option, class) that may hold replicas, with an upper bound on them (what fits the
    class's nodes, capped by ``max_replicas``). An operator with none raises ``PlacementError`` (on ``original``)."""
    eligible: dict[Key, int] = {}
    for d in demands:
        for k, opt in enumerate(d.options):
            for nc in cluster.node_classes:
                if ineligibility(d, opt, nc) is None:
                    ub = nc.count * _per_node_fit(usage_vector(opt, nc), nc)
                    if d.max_replicas is not None:
                        ub = min(ub, d.max_replicas)
                    if ub > 0:
                        eligible[Key(d.name, k, nc.name)] = ub
        if not any(key.operator == d.name for key in eligible):
            raise PlacementError(no_fit_message(d, original))
    return eligible


@dataclass(frozen=True)
class _Searched:
    """What the search found: replica counts (they may not pack node by node yet), the solver's status and gap,
    the best solution seen that does pack (``fallback``), and the bound the gap is measured against
    (``relaxed_bound``, in units of ``t_scale`` input items/s; 0 when unknown)."""

    counts: dict[Key, int]
    status: str
    gap: float
    fallback: dict[Key, int] | None
    relaxed_bound: float
    t_scale: float


def _search(prob: pulp.LpProblem, x: dict[Key, pulp.LpVariable], served: dict[str, Key], demands: Sequence[OperatorDemand],
            cluster: ClusterSpec, eligible: dict[Key, int], reductions: dict[str, list[float]], cur: dict[Key, int], *,
            solver: str, time_limit_s: float, threads: int, t0: float) -> _Searched:
    """A greedy start and the LP bound; the greedy plan when it is within GAP_REL of the bound, else a
    search among plans near the bound (HiGHS, when time allows), else the full MILP warm-started from the greedy plan."""
    relaxed_bound, start = heuristic_start(prob, x, demands, cluster, eligible, reductions, cur)
    t_scale = throughput_bound(demands, eligible)
    start_counts = {key: n for key, n in start.items() if n > 0}
    t_start = throughput_of(demands, cluster, start_counts) if start_counts else 0.0
    if relaxed_bound and t_start / t_scale < (1 - GAP_REL) * relaxed_bound:
        upper = integer_bound(prob, x, served, demands, eligible, t_start, relaxed_bound * t_scale)
        relaxed_bound = min(relaxed_bound, upper / t_scale)
    if relaxed_bound and t_start / t_scale >= (1 - GAP_REL) * relaxed_bound:
        # the heuristic is within GAP_REL of the LP bound: no search needed
        return _Searched(start_counts, "optimal", max(0.0, 1 - t_start / t_scale / relaxed_bound), None, relaxed_bound, t_scale)
    stop_at = (1 - GAP_REL) * relaxed_bound if relaxed_bound else None

    def as_counts(values: Sequence[float]) -> dict[Key, int]:
        return {key: n for key, var in x.items() if (n := int(round(values[var.index]))) > 0}

    def packs(values: Sequence[float]) -> bool:
        return not pack_cluster(demands, cluster, as_counts(values))

    packed: list[tuple[float, list[float]]] = []  # improving solutions that pack node by node
    if solver == "highs" and stop_at is not None and relaxed_bound and \
            _TARGET_SHARE * (time_limit_s - (time.perf_counter() - t0)) >= _TARGET_S:
        # First a search among plans within GAP_REL of the bound only (T >= stop_at cuts off
        # every branch below it); the greedy start is not one of them.
        T = prob.variablesDict()["T"]
        T.lowBound = stop_at * t_scale
        first = WarmHiGHS({}, stop_at, packs, _TARGET_S, msg=False, gapRel=GAP_REL, threads=threads if threads > 1 else None,
                           timeLimit=max(0.05, time_limit_s - (time.perf_counter() - t0)))
        prob.solve(first)
        T.lowBound = 0
        packed = list(first.packed)
        if packed and max(obj for obj, _ in packed) >= stop_at:
            counts = as_counts(max(packed, key=lambda p: p[0])[1])
            gap = max(0.0, 1 - throughput_of(demands, cluster, counts) / t_scale / relaxed_bound)
            return _Searched(counts, "optimal", gap, None, relaxed_bound, t_scale)
    for key, n in start.items():
        x[key].setInitialValue(n)
    remaining = max(0.05, time_limit_s - (time.perf_counter() - t0))
    cmd = solver_cmd(solver, remaining, threads, {x[key]: n for key, n in start.items()}, stop_at, packs)
    prob.solve(cmd)
    if prob.sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        if prob.status == pulp.LpStatusInfeasible:
            raise PlacementError(diagnose_infeasible(demands, cluster, eligible))
        raise PlacementError(f"no feasible placement found within time_limit_s={time_limit_s} "
                             f"(solver {solver}: {pulp.LpStatus[prob.status]}); raise time_limit_s")
    counts = {key: int(round(var.value() or 0)) for key, var in x.items()}
    counts = {key: n for key, n in counts.items() if n > 0}
    status, gap = status_gap(prob, solver, relaxed_bound)
    if isinstance(cmd, WarmHiGHS):
        packed += cmd.packed
    # the best solution that fits node by node, the alternative to repairing one that does not
    fallback = as_counts(max(packed, key=lambda p: p[0])[1]) if packed else None
    return _Searched(counts, status, gap, fallback, relaxed_bound, t_scale)


def _packed(found: _Searched, demands: Sequence[OperatorDemand], cluster: ClusterSpec, eligible: dict[Key, int],
            reductions: dict[str, list[float]]) -> tuple[dict[Key, int], int, float]:
    """Counts that pack node by node: the search's, repaired (``_repair``), or the best packing solution it saw
    when repairing fails or yields less. Returns (counts, repairs made, gap widened by what the repair cost)."""
    gap = found.gap
    replaced = False
    try:
        counts, repair = _repair(demands, cluster, eligible, reductions, dict(found.counts))
    except PlacementError:
        if found.fallback is None:
            raise
        counts, repair, replaced = found.fallback, 0, True
    if repair and found.fallback and throughput_of(demands, cluster, found.fallback) > throughput_of(demands, cluster, counts):
        counts, repair, replaced = found.fallback, 0, True
    if (repair or replaced) and found.relaxed_bound:
        gap = max(gap, 1 - throughput_of(demands, cluster, counts) / found.t_scale / found.relaxed_bound)
    return counts, repair, gap


def _result(demands: Sequence[OperatorDemand], cluster: ClusterSpec, counts: dict[Key, int], cur: dict[Key, int] | None,
            status: str, gap: float, solver: str, repair: int, build_ms: float, solve_ms: float, t0: float) -> PlacementResult:
    """The plan of ``counts`` (one replica group per option and class, each with its reason) and the solve's figures."""
    throughput = throughput_of(demands, cluster, counts)
    bottlenecks = tuple(d.name for d in demands if operator_capacity(d, counts) / d.work_per_item <= throughput * (1 + 1e-6))
    ops = []
    for d in demands:
        groups = tuple(
            ReplicaGroup(d.options[k].config.with_changes(gpus=effective_gpus(d.options[k], cluster.node_class(c)))
                         if d.options[k].config.gpus > 0 else d.options[k].config, n, c)
            for (op, k, c), n in sorted(counts.items()) if op == d.name)
        ops.append(OperatorPlan(d.name, groups, operator_reason(d, cluster, counts, cur, throughput)))
    total_ms = (time.perf_counter() - t0) * 1e3
    plan = Plan(tuple(ops), throughput,
                f"T={throughput:.4g} input items/s, bottleneck {', '.join(bottlenecks) or 'bandwidth'}; {status} "
                f"({solver}, {total_ms:.0f} ms, gap {gap:.2g}{f', {repair} packing repairs' if repair else ''})")
    return PlacementResult(plan, tuple(sorted(counts.items())), throughput, status, gap, solver, build_ms, solve_ms, total_ms,
                           repair, bottlenecks)


def _repair(demands: Sequence[OperatorDemand], cluster: ClusterSpec, eligible: dict[Key, int],
            reductions: dict[str, list[float]], counts: dict[Key, int]) -> tuple[dict[Key, int], int]:
    """Fragmentation: while replicas do not pack node by node, drop them, shrink their
    class by them and refill greedily. Returns (counts that pack, repairs made)."""
    repair = 0
    while left := pack_cluster(demands, cluster, counts):
        repair += 1
        if repair > MAX_REPAIRS:
            raise PlacementError(f"could not pack the plan onto individual nodes after {MAX_REPAIRS} repairs: "
                                 f"{sum(left.values())} replicas of {sorted({k.operator for k in left})} do not fit; "
                                 "node resources are too fragmented for these replica sizes")
        for key, n in left.items():
            counts[key] -= n
            vec = usage_vector(next(d for d in demands if d.name == key.operator).options[key.option], cluster.node_class(key.node_class))
            for i in range(3):
                reductions[key.node_class][i] += vec[i] * n
        greedy = Greedy(demands, cluster, eligible, reductions, {key: counts.get(key, 0) for key in eligible})
        if not greedy.run():
            raise PlacementError("the operators' minimum replicas do not pack onto individual nodes (CPU, GPU and memory "
                                 "per node combined); lower min_replicas, choose smaller configs or add nodes")
        counts = {key: n for key, n in greedy.counts.items() if n > 0}
    return counts, repair


def _trim(demands: Sequence[OperatorDemand], cluster: ClusterSpec, counts: dict[Key, int], cur: dict[Key, int]) -> dict[Key, int]:
    """Drop replicas that do not raise throughput: a non-bottleneck operator keeps only the
    replicas it needs for ``work_per_item * T`` (new replicas go first, current ones last)."""
    target = throughput_of(demands, cluster, counts)
    trimmed = dict(counts)
    for d in demands:
        keys = sorted((key for key in trimmed if key.operator == d.name), key=lambda key: (cur.get(key._replace(node_class=base_class(key.node_class)), 0) > 0, key))
        before = {key: trimmed[key] for key in keys}
        for key in keys:
            while trimmed[key] > 0 and sum(trimmed[k] for k in keys) > d.min_replicas:
                trimmed[key] -= 1
                if operator_capacity(d, trimmed) < d.work_per_item * target * (1 + 1e-9):
                    trimmed[key] += 1
                    break
        if trimmed != counts and throughput_of(demands, cluster, trimmed) < target * (1 - 1e-9):
            trimmed.update(before)  # bandwidth made those replicas necessary after all
    return {key: n for key, n in trimmed.items() if n > 0}


def _keep_running(demands: Sequence[OperatorDemand], cluster: ClusterSpec, counts: dict[Key, int], cur: dict[Key, int]) -> dict[Key, int]:
    """``counts`` with the running replicas of each (operator, option, class) it keeps but with fewer replicas put back,
    one at a time in pipeline order, while their class has CPUs, GPUs and host memory left, the operator is under its
    ``max_replicas`` and the whole still packs node by node; ``counts`` itself when that lowers the throughput."""
    by_name = {d.name: d for d in demands}
    used: dict[str, list[float]] = {nc.name: [0.0, 0.0, 0.0] for nc in cluster.node_classes}
    for key, n in counts.items():
        vec = usage_vector(by_name[key.operator].options[key.option], cluster.node_class(key.node_class))
        for i in range(3):
            used[key.node_class][i] += vec[i] * n
    kept = dict(counts)
    for d in demands:
        for key in sorted(k for k in cur if k.operator == d.name and kept.get(k, 0) > 0):
            nc = cluster.node_class(key.node_class)
            vec, room = usage_vector(d.options[key.option], nc), class_capacity(nc)
            while (kept[key] < cur[key] and (d.max_replicas is None or sum(n for k, n in kept.items() if k.operator == d.name) < d.max_replicas)
                   and all(used[key.node_class][i] + vec[i] <= room[i] + 1e-9 for i in range(3))):
                kept[key] += 1
                for i in range(3):
                    used[key.node_class][i] += vec[i]
    if kept == counts or pack_cluster(demands, cluster, kept) or throughput_of(demands, cluster, kept) < throughput_of(demands, cluster, counts) * (1 - 1e-9):
        return counts
    return kept
