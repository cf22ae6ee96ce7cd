"""Placement MILP: replicas x OpConfig x device x node class for every operator.

Contract:
- ``solve_placement(demands, cluster, current=None, solver="highs"|"cbc", time_limit_s=1.0)``
  returns a ``PlacementResult`` whose ``plan`` (a ``types.Plan``) maximises the pipeline
  throughput ``T`` (input items/s): ``max T`` s.t. for every operator the summed capacity
  of its replicas >= ``work_per_item * T``.
- Variables are integers per (operator, option, node class): identical nodes form one
  class, so the model does not grow with the node count. Per class: CPUs, GPUs (effective
  fractions, see ``placement.model.effective_gpus``), host memory, host<->device bandwidth
  (bytes/item x items/s) and, where a class declares its network link (``NodeClass.nic_bandwidth_bps``)
  and operators' ``input_bytes_per_item`` are known, the bytes/s the placement sends across
  nodes in each direction (``placement.model`` docstring; flow variables per operator and class,
  unset links add no variable or row). Per operator: min/max replicas, allowed classes. Concave
  throughput curves are the minimum of their segments' lines (no extra binaries).
- Solve path: LP relaxation (a bound) -> rounded-down replicas raised bottleneck-first by
  a greedy (``_Greedy``) -> if that is within ``GAP_REL`` of the bound it is the answer;
  otherwise the bound is tightened by buying whole replicas at the LP's resource prices
  (``placement.bound.rounding_bound``; measured on benchmark instances at 1-16 nodes: the
  LP relaxation is 0.1-7% above the integer optimum, this bound within 0.01% on most and
  1.7% at worst), and the greedy plan is the
  MIP start of the MILP (HiGHS in-process by default, CBC optional). HiGHS is stopped as
  soon as a solution that packs node by node is within ``GAP_REL`` of that bound (its own
  bound, from cuts and branching, was what made solves hit the time limit). HiGHS first
  searches, for at most ``_TARGET_S`` of CPU, only among plans within ``GAP_REL`` of the bound
  (a lower bound on T); if none that packs turns up, the search from the greedy start
  follows. CBC gets the bound for its status and gap only.
- Every solution is packed onto individual nodes and GPUs (``placement.model.pack_class``);
  if fragmentation leaves replicas unplaced, they are dropped, the class's aggregate
  capacity is reduced by them and the greedy refills (at most ``MAX_REPAIRS`` times), so a
  returned plan always fits node by node; the gap is then reported against the bound. With
  HiGHS, the best improving solution that packed as found is the alternative when it
  beats the repaired plan.
- After solving, replicas that do not raise throughput are trimmed (non-bottleneck
  operators keep only what ``work_per_item * T`` needs, current replicas last).
- Switching cost is handled by "solve, then decide" (``placement.transition_cost.plan_transition``):
  the MILP only carries a tie-break (worth < 1e-6 of T) that prefers keeping the current
  replicas among plans of equal throughput. Pricing cold starts inside the MILP would need
  the regime duration and the rollout order (which replicas can start before others
  retire), which are not linear in the variables; the transition planner prices the exact
  step sequence instead, and WAITs when a plan's gain does not pay for its moves.
- ``status`` "optimal" means within ``GAP_REL`` (0.5%) of the best bound; "time_limit" means
  the best plan found when ``time_limit_s`` ran out, with its gap.
- Bad input raises ``PlacementError`` naming the operator and resource (e.g. an operator
  that fits no device, or minimum replicas that do not fit the cluster), never a solver
  status code. A time limit returns the best plan found with its status and gap.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import pulp

from trident_flows.scheduler.placement.model import (
    SPLIT_SEP,
    Key,
    NetworkEdge,
    base_class,
    _place_on_node,
    class_capacity,
    effective_gpus,
    ineligibility,
    network_edges,
    no_fit_message,
    operator_capacity,
    pack_cluster,
    throughput_of,
    usage_vector,
)
from trident_flows.scheduler.placement.bound import rounding_bound
from trident_flows.scheduler.placement.types import CurrentPlacement, GiB, OperatorDemand
from trident_flows.core.types import ClusterSpec, NodeClass, OperatorPlan, Plan, ReplicaGroup

MAX_REPAIRS = 5
SPLIT_MAX_NODES = 4
SOLVERS = ("highs", "cbc")
DEFAULT_SOLVER = "highs" if pulp.HiGHS().available() else "cbc"


def _silence_highs_banner() -> None:
    """HiGHS (highspy 1.16) prints its copyright banner into the output of the process on its first
    solver object, before PuLP can turn output off (``msg=False``); the banner is printed once per
    process. Make that first object here, with the process's stdout on /dev/null."""
    import os
    import sys

    import highspy

    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 1)
            highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)


if DEFAULT_SOLVER == "highs":
    _silence_highs_banner()
GAP_REL = 5e-3  # plans within 0.5% of the best bound count as optimal (well inside the throughput models' error)
_KEEP_WEIGHT = 1e-6
# HiGHS first searches only plans within GAP_REL of the bound, for _TARGET_S seconds of CPU
# when at least _TARGET_S / _TARGET_SHARE are left (measured on the 16-node benchmark: when
# it succeeds it does in 30-70 ms, versus 60-190 ms for the search from the greedy start;
# with less time left, what it costs when it fails weighs more than what it saves).
_TARGET_SHARE = 0.3
_TARGET_S = 0.05
_BW_UNIT = 1e9  # bandwidth in GB/s inside the model


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


def _diagnose_infeasible(demands: Sequence[OperatorDemand], cluster: ClusterSpec, eligible: dict[Key, int]) -> str:
    """Name the resource the operators' minimum replicas over-subscribe."""
    totals = [sum(class_capacity(nc)[i] for nc in cluster.node_classes) for i in range(3)]
    need = [0.0, 0.0, 0.0]
    for d in demands:
        vecs = [usage_vector(d.options[k], cluster.node_class(c)) for (op, k, c) in eligible if op == d.name]
        for i in range(3):
            need[i] += d.min_replicas * min(v[i] for v in vecs)
    units = [("CPUs", lambda v: f"{v:g}"), ("GPUs", lambda v: f"{v:g}"), ("host memory", lambda v: f"{v / GiB:.3g} GiB")]
    for i, (name, fmt) in enumerate(units):
        if need[i] > totals[i] + 1e-9:
            return (f"the cluster cannot host min_replicas of every operator: they need at least {fmt(need[i])} {name}, "
                    f"the cluster has {fmt(totals[i])}; lower min_replicas, choose smaller configs or add nodes")
    return ("the operators' minimum replicas do not fit together on the nodes (CPU, GPU and memory per node combined); "
            "lower min_replicas, allow more node classes or add nodes")


def _describe(groups: dict[tuple[str, str], int]) -> str:
    return ", ".join(f"{n} x {label} on {c}" for (label, c), n in sorted(groups.items()) if n) or "none"


def _operator_reason(d: OperatorDemand, cluster: ClusterSpec, new: dict[Key, int], cur: dict[Key, int] | None,
                     throughput: float) -> str:
    cap = operator_capacity(d, new) / d.work_per_item
    headroom = cap / throughput - 1 if throughput > 0 else math.inf
    head = "bottleneck" if headroom <= 1e-6 else f"headroom {headroom:.0%}"
    label = lambda k: d.options[k].config.label()  # noqa: E731
    new_g = {(label(k), c): n for (op, k, c), n in new.items() if op == d.name and n}
    raised = [f"gpus {d.options[k].config.gpus:g}->{effective_gpus(d.options[k], cluster.node_class(c)):.3g} on {c} so "
              f"{d.options[k].device_mem_bytes / GiB:.3g} GiB per replica fits one GPU"
              for (op, k, c), n in new.items() if op == d.name and n and effective_gpus(d.options[k], cluster.node_class(c)) > d.options[k].config.gpus]
    note = f" ({'; '.join(raised)})" if raised else ""
    if cur is None:
        return f"{head}: {_describe(new_g)}{note}"
    cur_g = {(label(k), c): n for (op, k, c), n in cur.items() if op == d.name and n}
    if cur_g == new_g:
        return f"unchanged ({head})"
    changes = []
    for key in sorted(set(new_g) | set(cur_g)):
        delta = new_g.get(key, 0) - cur_g.get(key, 0)
        if delta:
            changes.append(f"{delta:+d} replica{'s' if abs(delta) != 1 else ''} {key[0]} on {key[1]}")
    return f"{head}: {', '.join(changes)}{note}"


class _WarmHiGHS(pulp.HiGHS):
    """PuLP's in-process HiGHS, given a MIP start (PuLP passes none to it). Every improving
    solution that ``packs`` (column values -> fits node by node) is kept in ``packed`` as
    (objective, column values); the solve is interrupted as soon as one of them reaches
    ``stop_at`` (the objective within ``GAP_REL`` of a bound HiGHS does not know:
    ``_integer_bound``), or once ``timeLimit`` (wall clock) or ``cpu_s`` (CPU time of this
    process, which does not grow while other processes hold the cores) has passed."""

    def __init__(self, start: dict[pulp.LpVariable, int], stop_at: float | None,
                 packs: Callable[[Sequence[float]], bool] | None, cpu_s: float | None = None, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.start = start
        self.stop_at = stop_at
        self.packs = packs
        self.cpu_s = cpu_s
        self.packed: list[tuple[float, list[float]]] = []

    def callSolver(self, lp: pulp.LpProblem) -> None:
        if self.start and self.mip:
            import numpy as np

            idx = np.array([v.index for v in self.start], dtype=np.int32)
            lp.solverModel.setSolution(len(idx), idx, np.array(list(self.start.values()), dtype=np.float64))
        if self.packs is not None and self.mip:
            packs, stop_at = self.packs, self.stop_at if self.stop_at is not None else math.inf

            def improving(event: object) -> None:
                values = list(event.data_out.mip_solution)  # type: ignore[attr-defined]
                if packs(values):
                    self.packed.append((-event.data_out.objective_function_value, values))  # type: ignore[attr-defined]  # PuLP minimises -objective

            deadline = time.perf_counter() + self.timeLimit if self.timeLimit else math.inf
            cpu_deadline = time.process_time() + self.cpu_s if self.cpu_s is not None else math.inf

            def stop(event: object) -> None:
                # HiGHS checks its own time limit only between stages (measured: 325 ms runs under a 50 ms limit)
                if ((self.packed and max(obj for obj, _ in self.packed) >= stop_at) or time.perf_counter() > deadline
                        or time.process_time() > cpu_deadline):
                    event.interrupt()  # type: ignore[attr-defined]

            lp.solverModel.cbMipImprovingSolution.subscribe(improving)
            lp.solverModel.cbMipInterrupt.subscribe(stop)
        lp.solverModel.run()


def _solver_cmd(solver: str, time_limit_s: float, threads: int, start: dict[pulp.LpVariable, int],
                stop_at: float | None, packs: Callable[[Sequence[float]], bool] | None) -> pulp.LpSolver:
    if solver == "highs":
        return _WarmHiGHS(start, stop_at, packs, msg=False, timeLimit=time_limit_s, gapRel=GAP_REL,
                          threads=threads if threads > 1 else None)
    # CBC given threads=1 runs its parallel mode with one worker and waits on it: pass threads only above 1.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # PuLP 3.3 deprecates its bundled-CBC class name
        return pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s, gapRel=GAP_REL, threads=threads if threads > 1 else None,
                                 warmStart=bool(start))


def solve_placement(demands: Sequence[OperatorDemand], cluster: ClusterSpec, current: CurrentPlacement | None = None, *,
                    solver: str = DEFAULT_SOLVER, time_limit_s: float = 1.0, threads: int = 1) -> PlacementResult:
    """Solve the placement MILP; see the module docstring. ``time_limit_s`` bounds the whole
    call (all solves); at the limit the best plan found is returned with its status and gap.
    Raises ``PlacementError``."""
    t0 = time.perf_counter()
    demands = list(demands)
    _validate(demands, cluster, solver)
    cur = _current_counts(demands, cluster, current) if current is not None else None
    original, cluster = cluster, _split_small_classes(cluster)
    eligible = _eligible(demands, cluster, original)
    reductions: dict[str, list[float]] = {nc.name: [0.0, 0.0, 0.0] for nc in cluster.node_classes}
    tb = time.perf_counter()
    prob, x, served = _build(demands, cluster, eligible, cur or {}, reductions)
    ts = time.perf_counter()
    build_ms = (ts - tb) * 1e3
    found = _search(prob, x, served, demands, cluster, eligible, reductions, cur or {}, solver=solver, time_limit_s=time_limit_s,
                    threads=threads, t0=t0)
    solve_ms = (time.perf_counter() - ts) * 1e3
    counts, repair, gap = _packed(found, demands, cluster, eligible, reductions)
    counts = _merge(_trim(demands, cluster, counts, cur or {}))
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
    relaxed_bound, start = _heuristic_start(prob, x, demands, cluster, eligible, reductions, cur)
    t_scale = _throughput_bound(demands, eligible)
    start_counts = {key: n for key, n in start.items() if n > 0}
    t_start = throughput_of(demands, cluster, start_counts) if start_counts else 0.0
    if relaxed_bound and t_start / t_scale < (1 - GAP_REL) * relaxed_bound:
        upper = _integer_bound(prob, x, served, demands, eligible, t_start, relaxed_bound * t_scale)
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
        first = _WarmHiGHS({}, stop_at, packs, _TARGET_S, msg=False, gapRel=GAP_REL, threads=threads if threads > 1 else None,
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
    cmd = _solver_cmd(solver, remaining, threads, {x[key]: n for key, n in start.items()}, stop_at, packs)
    prob.solve(cmd)
    if prob.sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        if prob.status == pulp.LpStatusInfeasible:
            raise PlacementError(_diagnose_infeasible(demands, cluster, eligible))
        raise PlacementError(f"no feasible placement found within time_limit_s={time_limit_s} "
                             f"(solver {solver}: {pulp.LpStatus[prob.status]}); raise time_limit_s")
    counts = {key: int(round(var.value() or 0)) for key, var in x.items()}
    counts = {key: n for key, n in counts.items() if n > 0}
    status, gap = _status_gap(prob, solver, relaxed_bound)
    if isinstance(cmd, _WarmHiGHS):
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
        ops.append(OperatorPlan(d.name, groups, _operator_reason(d, cluster, counts, cur, throughput)))
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
        greedy = _Greedy(demands, cluster, eligible, reductions, {key: counts.get(key, 0) for key in eligible})
        if not greedy.run():
            raise PlacementError("the operators' minimum replicas do not pack onto individual nodes (CPU, GPU and memory "
                                 "per node combined); lower min_replicas, choose smaller configs or add nodes")
        counts = {key: n for key, n in greedy.counts.items() if n > 0}
    return counts, repair


def _build(demands: Sequence[OperatorDemand], cluster: ClusterSpec, eligible: dict[Key, int], cur: dict[Key, int],
           reductions: dict[str, list[float]]) -> tuple[pulp.LpProblem, dict[Key, pulp.LpVariable], dict[str, Key]]:
    """The MILP of the module docstring (rows are built from coefficient lists: PuLP's
    operator overloading copies expressions and dominated build time). Returns the
    problem, the replica variables and, by name, the key of each bandwidth-limited
    capacity variable."""
    prob = pulp.LpProblem("placement", pulp.LpMaximize)

    def row(terms: list[tuple[pulp.LpVariable, float]], sense: int, rhs: float, name: str) -> None:
        prob.addConstraint(pulp.LpConstraint(pulp.LpAffineExpression(terms), sense, rhs=rhs), name)

    le, ge = pulp.LpConstraintLE, pulp.LpConstraintGE
    T = prob.add_variable("T", lowBound=0)
    x = {key: prob.add_variable(f"x_{i}", lowBound=0, upBound=ub, cat=pulp.LpInteger) for i, (key, ub) in enumerate(eligible.items())}
    by_name = {d.name: d for d in demands}
    bw_terms: dict[str, list[tuple[pulp.LpVariable, float]]] = {nc.name: [] for nc in cluster.node_classes}
    served: dict[str, Key] = {}
    n_caps = 0
    for d in demands:
        op_caps = []
        for k, opt in enumerate(d.options):
            keys = [key for key in x if key.operator == d.name and key.option == k]
            if not keys:
                continue
            n_caps += 1
            cap = prob.add_variable(f"cap_{n_caps}", lowBound=0)
            for j, (a, slope) in enumerate(opt.segments()):  # cap <= a + slope * replicas
                row([(cap, 1.0)] + [(x[key], -slope) for key in keys], le, a, f"curve_{n_caps}_{j}")
            bw_keys = [key for key in keys if opt.bandwidth_bytes_per_item > 0 and cluster.node_class(key.node_class).host_device_bandwidth_bps > 0]
            if bw_keys:  # capacity on a bandwidth-limited class is its own variable, counted against the class
                parts = [(cap, 1.0)]
                for key in keys:
                    if key in bw_keys:
                        cc = prob.add_variable(f"capc_{n_caps}_{key.node_class}", lowBound=0)
                        served[cc.name] = key
                        row([(cc, 1.0), (x[key], -opt.rate_per_replica)], le, 0.0, f"capc_{n_caps}_{key.node_class}")
                        bw_terms[key.node_class].append((cc, opt.bandwidth_bytes_per_item / _BW_UNIT))
                        parts.append((cc, -1.0))
                    else:
                        parts.append((x[key], -opt.rate_per_replica))
                row(parts, le, 0.0, f"capsplit_{n_caps}")
            op_caps.append(cap)
        row([(c, 1.0) for c in op_caps] + [(T, -d.work_per_item)], ge, 0.0, f"work_{d.name}")
        reps = [(x[key], 1.0) for key in x if key.operator == d.name]
        row(reps, ge, d.min_replicas, f"min_{d.name}")
        if d.max_replicas is not None:
            row(reps, le, d.max_replicas, f"max_{d.name}")
    for nc in cluster.node_classes:
        capacity = class_capacity(nc)
        keys = [key for key in x if key.node_class == nc.name]
        vecs = {key: usage_vector(by_name[key.operator].options[key.option], nc) for key in keys}
        for i, res in enumerate(("cpus", "gpus", "mem")):
            unit = GiB if res == "mem" else 1.0  # memory in GiB keeps the matrix well scaled
            terms = [(x[key], vecs[key][i] / unit) for key in keys if vecs[key][i] > 0]
            if terms and math.isfinite(capacity[i]):
                row(terms, le, (capacity[i] - reductions[nc.name][i]) / unit, f"{res}_{nc.name}")
        if bw_terms[nc.name]:
            row(bw_terms[nc.name], le, nc.host_device_bandwidth_bps / _BW_UNIT * nc.count, f"bw_{nc.name}")
    edges = network_edges(demands, cluster)
    if edges:
        _network_rows(prob, row, T, x, demands, cluster, edges)
    objective = [(T, 1.0 / _throughput_bound(demands, eligible))]
    kept = {key: [xk for xk in x if xk[:2] == key[:2] and base_class(xk.node_class) == key.node_class] for key in cur}
    kept = {key: xs for key, xs in kept.items() if xs}
    if kept:  # tie-break: keep current replicas
        total_cur = sum(cur[key] for key in kept)
        for i, (key, xs) in enumerate(kept.items()):
            kv = prob.add_variable(f"keep_{i}", lowBound=0, upBound=cur[key])
            row([(kv, 1.0)] + [(x[xk], -1.0) for xk in xs], le, 0.0, f"keep_{i}")
            objective.append((kv, _KEEP_WEIGHT / total_cur))
    for nc, nxt in zip(cluster.node_classes, cluster.node_classes[1:]):  # identical split nodes: fill in order
        if SPLIT_SEP in nc.name and base_class(nc.name) == base_class(nxt.name):
            cpus = {k: by_name[k.operator].options[k.option].config.cpus for k in x}
            row([(x[k], cpus[k]) for k in x if k.node_class == nc.name] + [(x[k], -cpus[k]) for k in x if k.node_class == nxt.name], ge, 0.0,
                f"order_{nxt.name}")
    prob.setObjective(pulp.LpAffineExpression(objective))
    return prob, x, served


def _network_rows(prob: pulp.LpProblem, row: Callable[..., None], T: pulp.LpVariable, x: dict[Key, pulp.LpVariable],
                  demands: Sequence[OperatorDemand], cluster: ClusterSpec, edges: Sequence[NetworkEdge]) -> None:
    """The network rows (``placement.model`` docstring): per operator on an edge, its items/s on each class
    (``flow``: under its replicas' full rate there, summing to ``work_per_item * T``, so no class can be
    credited with items the operator does not serve); per edge and class, the bytes/s read on the node that
    produced them (``local``, at most what the class produces and what it consumes); per class with a
    declared NIC, bytes/s in and bytes/s out each <= ``nic_bandwidth_bps * count``."""
    le = pulp.LpConstraintLE
    flow: dict[tuple[int, int], pulp.LpVariable] = {}
    for i in sorted({i for e in edges for i in (e.producer, e.consumer)}):
        d = demands[i]
        for ci, nc in enumerate(cluster.node_classes):
            keys = [key for key in x if key.operator == d.name and key.node_class == nc.name]
            if keys:
                f = flow[i, ci] = prob.add_variable(f"flow_{i}_{ci}", lowBound=0)
                row([(f, 1.0)] + [(x[key], -d.options[key.option].rate_per_replica) for key in keys], le, 0.0, f"flowcap_{i}_{ci}")
        row([(f, 1.0) for (j, _), f in flow.items() if j == i] + [(T, -d.work_per_item)], pulp.LpConstraintEQ, 0.0, f"flow_{i}")
    for ci, nc in enumerate(cluster.node_classes):
        if nc.nic_bandwidth_bps <= 0:
            continue  # no declared link: traffic here constrains nothing (the other end's link still counts it)
        inbound: list[tuple[pulp.LpVariable, float]] = []
        outbound: list[tuple[pulp.LpVariable, float]] = []
        for e in edges:
            consumer, producer = flow.get((e.consumer, ci)), flow.get((e.producer, ci))
            if consumer is not None:
                inbound.append((consumer, e.consumed_bytes_per_item / _BW_UNIT))
            if producer is not None:
                outbound.append((producer, e.produced_bytes_per_item / _BW_UNIT))
            if consumer is not None and producer is not None:
                local = prob.add_variable(f"local_{e.consumer}_{ci}", lowBound=0)
                row([(local, 1.0), (consumer, -e.consumed_bytes_per_item / _BW_UNIT)], le, 0.0, f"localin_{e.consumer}_{ci}")
                row([(local, 1.0), (producer, -e.produced_bytes_per_item / _BW_UNIT)], le, 0.0, f"localout_{e.consumer}_{ci}")
                inbound.append((local, -1.0))
                outbound.append((local, -1.0))
        for name, terms in (("nicin", inbound), ("nicout", outbound)):
            if terms:
                row(terms, le, nc.nic_bandwidth_bps / _BW_UNIT * nc.count, f"{name}_{ci}")


_RESOURCE_ROWS = ("cpus_", "gpus_", "mem_", "bw_")


def _integer_bound(prob: pulp.LpProblem, x: dict[Key, pulp.LpVariable], served: dict[str, Key],
                   demands: Sequence[OperatorDemand], eligible: dict[Key, int], t_feasible: float, t_lp: float) -> float:
    """An upper bound on T no weaker than the LP relaxation's ``t_lp`` (``t_feasible``: the
    throughput of a plan that satisfies the model, which limits the search): the class resource
    rows summed with the LP's row duals as weights, then bought in whole replicas per
    operator (``placement.bound.rounding_bound``). Call right after the LP relaxation
    solve (it reads the row duals). Any non-negative weights give a valid bound, so the
    duals' sign convention does not matter (their magnitude is the price)."""
    names = {var.name: key for key, var in x.items()}
    prices = {key: [0.0, 0.0] for key in eligible}
    budget = 0.0
    for row in prob.constraints():
        if not row.name.startswith(_RESOURCE_ROWS) or not row.pi:
            continue
        weight = abs(row.pi)
        budget += weight * -row.constant
        for var, coef in row.items():
            if var.name in names:
                prices[names[var.name]][0] += weight * coef
            else:  # items/s served on a bandwidth-limited class
                prices[served[var.name]][1] += weight * coef
    bound = rounding_bound(demands, {key: (p, q) for key, (p, q) in prices.items()}, budget, eligible, t_feasible, t_lp)
    return min(bound, t_lp)


def _throughput_bound(demands: Sequence[OperatorDemand], eligible: dict[Key, int]) -> float:
    """An upper bound on T (each operator alone with all its replica bounds), used to scale the objective."""
    bound = math.inf
    for d in demands:
        per_option: dict[int, int] = {}
        for (op, k, _), ub in eligible.items():
            if op == d.name:
                per_option[k] = per_option.get(k, 0) + ub
        bound = min(bound, sum(d.options[k].rate_at(n) for k, n in per_option.items()) / d.work_per_item)
    return bound if 0 < bound < math.inf else 1.0


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


def _heuristic_start(prob: pulp.LpProblem, x: dict[Key, pulp.LpVariable], demands: Sequence[OperatorDemand],
                     cluster: ClusterSpec, eligible: dict[Key, int], reductions: dict[str, list[float]],
                     cur: dict[Key, int]) -> tuple[float | None, dict[Key, int]]:
    """A MIP start: solve the LP relaxation, round replicas down, then raise the bottleneck
    operator one replica at a time, taking room from operators with headroom when its class
    is full (``_Greedy``). The same greedy also starts from the current placement (when it
    fits); that one wins ties, so an unchanged situation gives an unchanged plan. Returns
    (LP relaxation objective = a bound, replica counts); a start within ``GAP_REL`` of the
    bound is returned as the plan, otherwise it is the solver's MIP start."""
    lp_solver = pulp.HiGHS(msg=False, mip=False) if pulp.HiGHS().available() else pulp.PULP_CBC_CMD(msg=False, mip=False)
    prob.solve(lp_solver)
    if prob.status != pulp.LpStatusOptimal:
        return None, {}
    bound = pulp.value(prob.objective)
    starts = [{key: int(math.floor((var.value() or 0.0) + 1e-6)) for key, var in x.items()}]
    for var in prob.variables():
        var.varValue = None  # the MILP recomputes continuous values from the integer start
    if cur and all(key in eligible for key in cur):
        starts.insert(0, {key: cur.get(key, 0) for key in eligible})
    best, best_t = {}, -1.0
    for counts in starts:
        greedy = _Greedy(demands, cluster, eligible, reductions, counts)
        if any(f < -1e-9 for free in greedy.free.values() for f in free) or not greedy.run():
            continue  # the current placement does not fit this model (or min replicas cannot be reached)
        placed = {key: n for key, n in greedy.counts.items() if n > 0}
        t = throughput_of(demands, cluster, placed)
        if t > best_t * (1 + 1e-9):
            best, best_t = dict(greedy.counts), t
    return bound, best


class _Greedy:
    """Integer replica counts improved by bottleneck-first moves over aggregate class
    resources: CPUs, GPUs, host memory and host<->device bandwidth (a replica counted at
    its full single-replica rate, which is conservative). The network rows are not among
    them (they couple operators, not replicas): its plans are priced by ``throughput_of``,
    which has them, and the MILP search improves on them."""

    def __init__(self, demands: Sequence[OperatorDemand], cluster: ClusterSpec, eligible: dict[Key, int],
                 reductions: dict[str, list[float]], counts: dict[Key, int]) -> None:
        self.demands = {d.name: d for d in demands}
        self.eligible = eligible
        self.counts = counts
        by_name = self.demands
        self.vecs = {key: usage_vector(by_name[key.operator].options[key.option], cluster.node_class(key.node_class)) + (self._bandwidth(key, cluster),)
                     for key in eligible}
        self.free = {nc.name: [class_capacity(nc)[i] - reductions[nc.name][i] for i in range(3)]
                     + [nc.host_device_bandwidth_bps * nc.count if nc.host_device_bandwidth_bps > 0 else math.inf]
                     for nc in cluster.node_classes}
        self.n_opt: dict[tuple[str, int], int] = {}
        for key, n in counts.items():
            self.n_opt[key[:2]] = self.n_opt.get(key[:2], 0) + n
            for i in range(4):
                self.free[key.node_class][i] -= self.vecs[key][i] * n
        totals = [sum(class_capacity(nc)[i] for nc in cluster.node_classes) for i in range(3)]
        totals.append(sum(nc.host_device_bandwidth_bps * nc.count for nc in cluster.node_classes))
        self.share = {key: sum(v / t for v, t in zip(vec, totals) if t > 0 and math.isfinite(t)) for key, vec in self.vecs.items()}
        self.keys_of = {name: [key for key in eligible if key.operator == name] for name in by_name}
        self.by_class = {nc.name: [key for key in eligible if key.node_class == nc.name] for nc in cluster.node_classes}
        self.replicas = {name: sum(counts[k] for k in keys) for name, keys in self.keys_of.items()}
        self.level = {name: self._capacity(name) / d.work_per_item for name, d in by_name.items()}

    def _bandwidth(self, key: Key, cluster: ClusterSpec) -> float:
        opt = self.demands[key.operator].options[key.option]
        return opt.bandwidth_bytes_per_item * opt.rate_per_replica if cluster.node_class(key.node_class).host_device_bandwidth_bps > 0 else 0.0

    def _capacity(self, name: str, change: dict[Key, int] | None = None) -> float:
        d = self.demands[name]
        total = 0.0
        for k, opt in enumerate(d.options):
            n = self.n_opt.get((name, k), 0) + sum(v for key, v in (change or {}).items() if key.operator == name and key.option == k)
            total += opt.rate_at(n)
        return total

    def _apply(self, key: Key, delta: int) -> None:
        self.counts[key] += delta
        self.n_opt[key[:2]] = self.n_opt.get(key[:2], 0) + delta
        self.replicas[key.operator] += delta
        for i in range(4):
            self.free[key.node_class][i] -= self.vecs[key][i] * delta
        self.level[key.operator] = self._capacity(key.operator) / self.demands[key.operator].work_per_item

    def _fits(self, key: Key) -> bool:
        return self.counts[key] < self.eligible[key] and all(self.vecs[key][i] <= self.free[key.node_class][i] + 1e-9 for i in range(4))

    def _best_addition(self, name: str, cheapest: bool = False) -> Key | None:
        """The replica to add to ``name``: most items/s per resource share, or (``cheapest``,
        for minimum replicas) the smallest resource share."""
        best, best_score = None, -math.inf
        for key in self.keys_of[name]:
            if not self._fits(key):
                continue
            gain = self._capacity(name, {key: 1}) - self._capacity(name)
            score = -self.share[key] + 1e-12 * gain if cheapest else gain / max(self.share[key], 1e-12)
            if score > best_score and (cheapest or gain > 0):
                best, best_score = key, score
        return best

    def _best_swap(self, name: str) -> tuple[Key, Key, int] | None:
        """Add one replica of ``name`` by retiring ``m`` replicas of a donor with headroom in the same class."""
        now = min(self.level.values())
        best, best_t = None, now
        for key in self.keys_of[name]:
            if self.counts[key] >= self.eligible[key]:
                continue
            vec, free = self.vecs[key], self.free[key.node_class]
            deficit = [vec[i] - free[i] for i in range(4)]
            new_level = self._capacity(name, {key: 1}) / self.demands[name].work_per_item
            for donor in self.by_class[key.node_class]:
                if donor.operator == name or self.counts[donor] == 0:
                    continue
                dvec = self.vecs[donor]
                if any(deficit[i] > 1e-9 and dvec[i] <= 0 for i in range(4)):
                    continue
                m = max([math.ceil((deficit[i] - 1e-9) / dvec[i]) for i in range(4) if deficit[i] > 1e-9] or [0])
                donor_op = self.demands[donor.operator]
                if m == 0 or m > self.counts[donor] or self.replicas[donor.operator] - m < donor_op.min_replicas:
                    continue
                donor_level = self._capacity(donor.operator, {donor: -m}) / donor_op.work_per_item
                t = min([new_level, donor_level] + [lv for op, lv in self.level.items() if op not in (name, donor.operator)])
                if t > best_t * (1 + 1e-9):
                    best, best_t = (key, donor, m), t
        return best

    def _raise_bottleneck(self) -> None:
        for _ in range(20_000):
            name = min(self.level, key=self.level.get)
            d = self.demands[name]
            if d.max_replicas is not None and self.replicas[name] >= d.max_replicas:
                return
            key = self._best_addition(name)
            if key is not None:
                self._apply(key, 1)
                continue
            swap = self._best_swap(name)
            if swap is None:
                return
            add, donor, m = swap
            self._apply(donor, -m)
            self._apply(add, 1)

    def _compact(self) -> bool:
        """Re-provision each operator with headroom as the cheapest single (option, class)
        group that still carries the current throughput; True if any resources were freed."""
        target = min(self.level.values())
        changed = False
        for name, d in self.demands.items():
            if self.level[name] <= target * (1 + 1e-9):
                continue
            need = d.work_per_item * target
            held = {k: self.counts[k] for k in self.keys_of[name] if self.counts[k]}
            cost = sum(self.share[k] * n for k, n in held.items())
            for k, n in held.items():
                self._apply(k, -n)
            best, best_cost = None, cost - 1e-12
            for key in self.keys_of[name]:
                opt = d.options[key.option]
                most = min(self.eligible[key], d.max_replicas or self.eligible[key])
                if opt.rate_at(most) < need:
                    continue
                lo, hi = max(1, d.min_replicas), most  # fewest replicas reaching ``need``
                while lo < hi:
                    mid = (lo + hi) // 2
                    lo, hi = (lo, mid) if opt.rate_at(mid) >= need else (mid + 1, hi)
                if self.share[key] * lo < best_cost and all(self.vecs[key][i] * lo <= self.free[key.node_class][i] + 1e-9 for i in range(4)):
                    best, best_cost = (key, lo), self.share[key] * lo
            for k, n in ({best[0]: best[1]} if best else held).items():
                self._apply(k, n)
            changed = changed or best is not None
        return changed

    def run(self) -> bool:
        """Reach min replicas, then alternately raise the bottleneck and compact the
        operators with headroom; False if min replicas do not fit."""
        for name, d in self.demands.items():
            while self.replicas[name] < d.min_replicas:
                key = self._best_addition(name, cheapest=True)
                if key is None:
                    return False
                self._apply(key, 1)
        for _ in range(10):
            self._raise_bottleneck()
            if not self._compact():
                break
        self._raise_bottleneck()
        return True


def _status_gap(prob: pulp.LpProblem, solver: str, relaxed_bound: float | None) -> tuple[str, float]:
    """("optimal" | "time_limit", relative gap between the best bound and the objective).
    The bound is the better of the solver's own (HiGHS reports it; CBC does not through
    PuLP) and ``relaxed_bound`` (LP relaxation and whole-replica bound); a plan within
    ``GAP_REL`` of either is optimal (HiGHS is interrupted once it gets there)."""
    obj = pulp.value(prob.objective) or 0.0
    lp_gap = max(0.0, (relaxed_bound - obj) / abs(relaxed_bound)) if relaxed_bound else math.inf
    if solver == "highs":
        import highspy

        optimal = prob.solverModel.getModelStatus() == highspy.HighsModelStatus.kOptimal
        gap = prob.solverModel.getInfo().mip_gap
        gap = min(lp_gap, max(0.0, gap) if math.isfinite(gap) else math.inf)
        return ("optimal" if optimal or gap <= GAP_REL else "time_limit"), (gap if math.isfinite(gap) else math.nan)
    if prob.sol_status == pulp.LpSolutionOptimal:
        return "optimal", 0.0
    if lp_gap <= GAP_REL:
        return "optimal", lp_gap
    return "time_limit", lp_gap if math.isfinite(lp_gap) else math.nan
