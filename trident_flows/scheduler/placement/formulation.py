"""The placement MILP's rows, and the bounds on its throughput read from them.

Contract:
- ``build_milp(demands, cluster, eligible, cur, reductions)`` returns (problem, replica variables, the
  key of each bandwidth-limited capacity variable by name): ``max T`` s.t. per operator the summed
  capacity of its replicas >= ``work_per_item * T`` (concave curves as the minimum of their segments'
  lines, no binaries); per node class CPUs, GPUs, host memory (less ``reductions``), host<->device
  bandwidth and, where a class declares its NIC, network bytes/s in and out; per operator min/max
  replicas. Integer variables per (operator, option, node class). A tie-break worth < 1e-6 of T
  prefers keeping the current replicas ``cur``; the objective is T scaled by ``throughput_bound``.
- ``integer_bound(...)``: after the LP relaxation's solve, a bound on T no weaker than the LP's, from
  the resource rows' duals bought in whole replicas (``placement.bound.rounding_bound``).
- ``throughput_bound(demands, eligible)``: each operator alone with all its replica bounds.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import pulp

from trident_flows.core.types import ClusterSpec
from trident_flows.scheduler.placement.bound import rounding_bound
from trident_flows.scheduler.placement.model import SPLIT_SEP, Key, NetworkEdge, base_class, class_capacity, network_edges, usage_vector
from trident_flows.scheduler.placement.types import GiB, OperatorDemand

_KEEP_WEIGHT = 1e-6
_BW_UNIT = 1e9  # bandwidth in GB/s inside the model
_RESOURCE_ROWS = ("cpus_", "gpus_", "mem_", "bw_")


def build_milp(demands: Sequence[OperatorDemand], cluster: ClusterSpec, eligible: dict[Key, int], cur: dict[Key, int],
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
    objective = [(T, 1.0 / throughput_bound(demands, eligible))]
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


def integer_bound(prob: pulp.LpProblem, x: dict[Key, pulp.LpVariable], served: dict[str, Key],
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


def throughput_bound(demands: Sequence[OperatorDemand], eligible: dict[Key, int]) -> float:
    """An upper bound on T (each operator alone with all its replica bounds), used to scale the objective."""
    bound = math.inf
    for d in demands:
        per_option: dict[int, int] = {}
        for (op, k, _), ub in eligible.items():
            if op == d.name:
                per_option[k] = per_option.get(k, 0) + ub
        bound = min(bound, sum(d.options[k].rate_at(n) for k, n in per_option.items()) / d.work_per_item)
    return bound if 0 < bound < math.inf else 1.0
