"""The placement model with node counts as variables: the cheapest cluster for a throughput, and resource prices.

Contract:
- The model is the placement MILP's aggregated per node class: integer replicas per (operator,
  option, class), each class's CPUs and GPUs at most its capacity times its node count, every
  operator's capacity at least ``work_per_item * T``. It ignores node-by-node packing, so its
  price is a lower bound the planner checks with ``placement.milp.solve_placement``.
- ``cheapest_counts(demands, catalogue, target, fixed=..., at_least=...)``: the least hourly price
  (fewest nodes on ties) reaching ``target``, or None; ``fixed`` pins classes' counts,
  ``at_least`` bounds them below. ``most_efficient_counts``: the least price per item/s
  (Dinkelbach). ``fastest_within(demands, catalogue, price)``: the highest throughput within a price.
- ``resource_prices(demands, catalogue, counts)``: the LP relaxation's ``T`` and per (class,
  resource) dual prices (a class with no node priced at its first unit); ``gain_of_node`` turns
  them into the first-order gain of one more node (an estimate the planner re-solves to check).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import pulp

from trident_flows.planning.catalogue import Catalogue, NodeType
from trident_flows.scheduler.placement.model import Key, ineligibility, usage_vector
from trident_flows.scheduler.placement.types import OperatorDemand

RESOURCES = ("cpus", "gpus")
SOLVE_LIMIT_S = 30.0
_DINKELBACH_STEPS = 30  # measured: 2-5 steps on the default catalogue
_NODE_TIEBREAK = 1e-4  # per node, in price units: among clusters of equal price, fewer nodes
# Prices are read with every class holding this many more nodes: at a count of 0 every row of a class has
# right-hand side 0 and the LP is degenerate (any split of an option's value between its CPU and GPU rows is
# a valid dual; measured: a g1 CPU priced at 20x a c16 CPU). A small positive capacity lets the row that
# really binds carry the price.
_PRICE_PERTURBATION = 1e-3


def _solver() -> pulp.LpSolver:
    return pulp.HiGHS(msg=False, timeLimit=SOLVE_LIMIT_S) if pulp.HiGHS().available() else pulp.PULP_CBC_CMD(msg=False, timeLimit=SOLVE_LIMIT_S)


def _node_capacity(node: NodeType) -> tuple[float, float]:
    return node.cpus, float(node.gpus)


@dataclass
class _Model:
    problem: pulp.LpProblem
    x: dict[Key, pulp.LpVariable]
    rows: dict[tuple[str, str], str]  # (class, resource) -> constraint name


def _build(demands: Sequence[OperatorDemand], catalogue: Catalogue, nodes: Mapping[str, pulp.LpVariable | float],
           sense: int, integer: bool, min_replicas: bool = True, problem: pulp.LpProblem | None = None) -> _Model:
    problem = problem or pulp.LpProblem("sizing", sense)
    cat = "Integer" if integer else "Continuous"
    x: dict[Key, pulp.LpVariable] = {}
    for d in demands:
        for k, opt in enumerate(d.options):
            for node in catalogue.nodes:
                if ineligibility(d, opt, node.node_class(1)) is None:
                    x[Key(d.name, k, node.name)] = problem.add_variable(f"x_{len(x)}", lowBound=0, cat=cat)
        if not any(key.operator == d.name for key in x):
            raise ValueError(f"operator {d.name!r} fits no node class of the catalogue; add one with a GPU or more GPU memory")
    rows = {}
    for node in catalogue.nodes:
        capacity = _node_capacity(node)
        for i, resource in enumerate(RESOURCES):
            terms = [(var, usage_vector(next(d for d in demands if d.name == key.operator).options[key.option], node.node_class(1))[i])
                     for key, var in x.items() if key.node_class == node.name]
            terms = [(v, c) for v, c in terms if c > 0]
            if not terms:
                continue
            name = f"{resource}_{node.name}"
            problem += pulp.lpSum(c * v for v, c in terms) <= capacity[i] * nodes[node.name], name
            rows[(node.name, resource)] = name
    if min_replicas:
        for d in demands:
            problem += pulp.lpSum(x[key] for key in x if key.operator == d.name) >= 1, f"min_{d.name}"
    return _Model(problem, x, rows)


def _capacity(demands: Sequence[OperatorDemand], x: Mapping[tuple[str, int, str], pulp.LpVariable], d: OperatorDemand):
    return pulp.lpSum(d.options[key.option].rate_per_replica * var for key, var in x.items() if key.operator == d.name)


def _count_variables(problem: pulp.LpProblem, catalogue: Catalogue, fixed: Mapping[str, int] | None,
                     at_least: Mapping[str, int] | None) -> dict[str, pulp.LpVariable]:
    """One integer count per class in ``[0, max_count]``, ``fixed`` ones pinned, ``at_least`` ones bounded below."""
    fixed, at_least = dict(fixed or {}), dict(at_least or {})
    return {node.name: problem.add_variable(f"n_{node.name}", lowBound=fixed.get(node.name, at_least.get(node.name, 0)),
                                            upBound=fixed.get(node.name, node.max_count), cat="Integer") for node in catalogue.nodes}


def cheapest_counts(demands: Sequence[OperatorDemand], catalogue: Catalogue, target: float,
                    fixed: Mapping[str, int] | None = None, at_least: Mapping[str, int] | None = None) -> dict[str, int] | None:
    """The cheapest node counts whose aggregate capacity reaches ``target`` input items/s (see the module docstring)."""
    problem = pulp.LpProblem("sizing", pulp.LpMinimize)
    n = _count_variables(problem, catalogue, fixed, at_least)
    model = _build(demands, catalogue, n, pulp.LpMinimize, integer=True, problem=problem)
    for d in demands:
        model.problem += _capacity(demands, model.x, d) >= d.work_per_item * target, f"work_{d.name}"
    model.problem += pulp.lpSum((node.price_per_hour + _NODE_TIEBREAK) * n[node.name] for node in catalogue.nodes)
    status = model.problem.solve(_solver())
    if pulp.LpStatus[status] != "Optimal":
        return None
    return {name: int(round(var.value() or 0)) for name, var in n.items()}


def most_efficient_counts(demands: Sequence[OperatorDemand], catalogue: Catalogue, target: float,
                          fixed: Mapping[str, int] | None = None, at_least: Mapping[str, int] | None = None) -> dict[str, int] | None:
    """The node counts with the least hourly price per item/s (so the least cost per item) among those reaching ``target``.

    A job's cost is ``price / T * items``: the fractional program ``min P(n) / T`` is solved by
    Dinkelbach's method, a sequence of MILPs ``min P(n) - lambda * T`` with ``lambda`` the ratio
    of the previous answer, which ends at the optimal ratio in finitely many steps (the model has
    finitely many count vectors). ``None`` when no catalogue cluster reaches ``target``.
    """
    start = cheapest_counts(demands, catalogue, target, fixed, at_least)
    if start is None:
        return None
    best, ratio = start, math.inf
    for _ in range(_DINKELBACH_STEPS):
        problem = pulp.LpProblem("efficiency", pulp.LpMinimize)
        n = _count_variables(problem, catalogue, fixed, at_least)
        model = _build(demands, catalogue, n, pulp.LpMinimize, integer=True, problem=problem)
        t = problem.add_variable("T", lowBound=target)
        for d in demands:
            model.problem += _capacity(demands, model.x, d) >= d.work_per_item * t, f"work_{d.name}"
        price = pulp.lpSum((node.price_per_hour + _NODE_TIEBREAK) * n[node.name] for node in catalogue.nodes)
        lam = ratio if math.isfinite(ratio) else sum((node.price_per_hour + _NODE_TIEBREAK) * start[node.name]
                                                     for node in catalogue.nodes) / max(target, 1e-12)
        model.problem += price - lam * t
        if pulp.LpStatus[model.problem.solve(_solver())] != "Optimal":
            break
        found_price, found_t = float(pulp.value(price)), float(t.value() or 0.0)
        if found_t <= 0 or found_price - lam * found_t >= -1e-9 * max(found_price, 1.0):
            break
        best, ratio = {name: int(round(var.value() or 0)) for name, var in n.items()}, found_price / found_t
    return best


def fastest_within(demands: Sequence[OperatorDemand], catalogue: Catalogue, price_per_hour: float) -> tuple[dict[str, int], float] | None:
    """The node counts of the highest aggregate throughput whose hourly price is at most ``price_per_hour``, and that throughput."""
    problem = pulp.LpProblem("fastest", pulp.LpMaximize)
    n = {node.name: problem.add_variable(f"n_{node.name}", lowBound=0, upBound=node.max_count, cat="Integer") for node in catalogue.nodes}
    model = _build(demands, catalogue, n, pulp.LpMaximize, integer=True, problem=problem)
    t = problem.add_variable("T", lowBound=0)
    for d in demands:
        model.problem += _capacity(demands, model.x, d) >= d.work_per_item * t, f"work_{d.name}"
    price = pulp.lpSum(node.price_per_hour * n[node.name] for node in catalogue.nodes)
    model.problem += price <= price_per_hour * (1 + 1e-9), "price"
    # fewest nodes among the fastest (a tie-break worth far less than any throughput difference)
    model.problem += t - 1e-7 * pulp.lpSum(n.values())
    if pulp.LpStatus[model.problem.solve(_solver())] != "Optimal":
        return None
    return {name: int(round(var.value() or 0)) for name, var in n.items()}, float(t.value() or 0.0)


@dataclass(frozen=True)
class ResourcePrices:
    """The LP relaxation's throughput and its dual prices (items/s per unit of a class's resource)."""

    throughput: float
    prices: Mapping[tuple[str, str], float]

    def gain_of_node(self, node: NodeType) -> float:
        """First-order items/s one more ``node`` adds: its capacity at the class's prices."""
        capacity = _node_capacity(node)
        return sum(self.prices.get((node.name, r), 0.0) * capacity[i] for i, r in enumerate(RESOURCES))

    def binding(self) -> list[tuple[str, str, float]]:
        """(class, resource, price) of the resources whose price is not zero, dearest first."""
        return sorted(((c, r, p) for (c, r), p in self.prices.items() if p > 1e-9), key=lambda t: -t[2])


def _max_throughput(demands: Sequence[OperatorDemand], catalogue: Catalogue, nodes: Mapping[str, float]) -> tuple[_Model, pulp.LpVariable]:
    """The LP relaxation with ``nodes`` per class fixed, solved for the most throughput (without the min-replica rows)."""
    model = _build(demands, catalogue, {node.name: float(nodes.get(node.name, 0.0)) for node in catalogue.nodes},
                   pulp.LpMaximize, integer=False, min_replicas=False)
    t = model.problem.add_variable("T", lowBound=0)
    for d in demands:
        model.problem += _capacity(demands, model.x, d) >= d.work_per_item * t, f"work_{d.name}"
    model.problem += t
    status = model.problem.solve(_solver())
    if pulp.LpStatus[status] != "Optimal":
        raise RuntimeError(f"throughput LP ended {pulp.LpStatus[status]}")
    return model, t


def resource_prices(demands: Sequence[OperatorDemand], catalogue: Catalogue, counts: Mapping[str, int]) -> ResourcePrices:
    """LP relaxation with ``counts`` fixed: max T and the dual price of every resource row."""
    # without the min-replica rows: they would price a class with no node at the cost of an operator's first
    # replica, not at the value of capacity; the LP's prices are then those of throughput alone
    model, t = _max_throughput(demands, catalogue, {node.name: counts.get(node.name, 0) + _PRICE_PERTURBATION for node in catalogue.nodes})
    pi = {row.name: row.pi for row in model.problem.constraints()}
    prices = {key: abs(float(pi.get(name) or 0.0)) for key, name in model.rows.items()}
    return ResourcePrices(float(t.value() or 0.0), prices)
