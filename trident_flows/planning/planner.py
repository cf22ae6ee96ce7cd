"""Which cluster to rent for a corpus: node counts per class chosen by optimisation, checked in the simulator.

Contract:
- A ``Goal`` is ``items`` input items and either a deadline (``deadline_h``: the least job cost
  finishing by it) or a budget (``budget``: the least job cost for the items, refused when even
  that exceeds it). A job costs the clusters' hourly price times its hours: the catalogue's
  start-up minutes plus the items at the predicted rate.
- ``plan_cluster(workload, catalogue, goal)`` returns a ``ClusterPlan``: the recommendation (the
  node-count MILP checked by the placement MILP node by node), runner-ups and the Pareto front of
  cost and duration, the best options re-ranked by the simulator, each with a throughput, hours
  and cost range.
- A goal no catalogue cluster can meet raises ``PlanningError`` saying what the fastest cluster
  needs and what to change. Prices are the catalogue's (placeholders in the default one, and the
  plan says so).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from trident_flows.core.types import Plan
from trident_flows.planning.catalogue import Catalogue, PlanningError
from trident_flows.planning.demands import operator_demands
from trident_flows.planning.simcheck import simulate_plan
from trident_flows.planning.sizing import cheapest_counts, fastest_within, most_efficient_counts, resource_prices
from trident_flows.planning.workload import PlanWorkload
from trident_flows.scheduler.placement.milp import PlacementError, PlacementResult, solve_placement
from trident_flows.scheduler.placement.model import Key, throughput_of
from trident_flows.scheduler.placement.types import OperatorDemand

MAX_RAISES = 5
MAX_PRICE_LEVELS = 200  # measured: 1-10 levels on the default catalogue before the stop rule ends the walk
SWEEP = (0.25, 0.4, 0.6, 0.8, 1.25, 1.6, 2.0, 3.0)  # throughput targets around the goal's, for runner-ups and the Pareto plot
# the throughput range is the prediction and the simulator's figure widened by this share: the simulator's worst
# throughput error against live runs measured by `bench sim-fidelity` (16.8%), as the cost models behind both
MODEL_ERROR = 0.168
PLACEMENT_LIMIT_S = 2.0  # per placement solve; plans are within 0.5% of its bound well before (see scheduler/placement/milp.py)
SIM_ITEMS_MIN, SIM_ITEMS_MAX, SIM_SECONDS = 2000, 20000, 600  # the simulated stream: ~10 minutes at the predicted rate, bounded


@dataclass(frozen=True)
class Goal:
    items: int
    deadline_h: float | None = None
    budget: float | None = None

    def __post_init__(self) -> None:
        if self.items < 1:
            raise PlanningError(f"--items {self.items}: give the number of input items to process (>= 1)")
        if (self.deadline_h is None) == (self.budget is None):
            raise PlanningError("give one goal: --deadline-h H (least cost finishing by then) or --budget B (most items per unit cost)")
        if self.deadline_h is not None and not (self.deadline_h > 0 and math.isfinite(self.deadline_h)):
            raise PlanningError(f"--deadline-h {self.deadline_h}: give a number of hours > 0")
        if self.budget is not None and not (self.budget > 0 and math.isfinite(self.budget)):
            raise PlanningError(f"--budget {self.budget}: give an amount > 0")

    def describe(self, currency: str) -> str:
        if self.deadline_h is not None:
            return f"{self.items} items within {self.deadline_h:g} h at least cost"
        return f"{self.items} items, most items per {currency} within a budget of {self.budget:g} {currency}"


@dataclass(frozen=True)
class ClusterOption:
    """One checked cluster: counts per class, the placement's plan and throughput, its price, and (if run) the simulator's figure."""

    counts: Mapping[str, int]
    items_per_s: float
    plan: Plan
    price_per_hour: float
    items: int
    blocks_items_per_s: float = 0.0
    simulated_items_per_s: float | None = None
    bottlenecks: tuple[str, ...] = ()
    startup_h: float = 0.0

    @property
    def hours(self) -> float:
        """Hours from renting to the last item: start-up, then the items at the predicted rate."""
        return self.startup_h + self.items / self.items_per_s / 3600 if self.items_per_s > 0 else math.inf

    @property
    def cost(self) -> float:
        return self.hours * self.price_per_hour

    @property
    def checked_hours(self) -> float:
        """Hours at the lower of the predicted and the simulated rate (the prediction alone when not simulated)."""
        rate = min(self.items_per_s, self.simulated_items_per_s or self.items_per_s)
        return self.startup_h + self.items / rate / 3600 if rate > 0 else math.inf

    @property
    def checked_cost(self) -> float:
        return self.checked_hours * self.price_per_hour

    @property
    def items_per_s_range(self) -> tuple[float, float]:
        figures = [self.items_per_s] + ([self.simulated_items_per_s] if self.simulated_items_per_s else [])
        return min(figures) * (1 - MODEL_ERROR), max(figures) * (1 + MODEL_ERROR)

    def hours_range(self) -> tuple[float, float]:
        low, high = self.items_per_s_range
        return self.startup_h + self.items / high / 3600, self.startup_h + self.items / low / 3600

    def cost_range(self) -> tuple[float, float]:
        low, high = self.hours_range()
        return low * self.price_per_hour, high * self.price_per_hour

    def label(self) -> str:
        return " + ".join(f"{n}x {c}" for c, n in self.counts.items() if n > 0)

    def key(self) -> tuple[tuple[str, int], ...]:
        return tuple(sorted((c, n) for c, n in self.counts.items() if n > 0))

    def to_dict(self) -> dict[str, object]:
        return {"nodes": {c: n for c, n in self.counts.items() if n > 0}, "predicted_items_per_s": self.items_per_s,
                "items_per_s_range": list(self.items_per_s_range), "predicted_hours": self.hours,
                "hours_range": list(self.hours_range()), "price_per_hour": self.price_per_hour, "cost": self.cost,
                "cost_range": list(self.cost_range()), "items_per_s_regime_blocks": self.blocks_items_per_s,
                "simulated_items_per_s": self.simulated_items_per_s, "checked_cost": self.checked_cost,
                "bottlenecks": list(self.bottlenecks)}


@dataclass(frozen=True)
class ClusterPlan:
    workload: PlanWorkload
    catalogue: Catalogue
    goal: Goal
    recommended: ClusterOption
    runner_ups: tuple[ClusterOption, ...]
    candidates: tuple[ClusterOption, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)

    def options(self) -> list[ClusterOption]:
        """Every checked cluster, the recommendation and runner-ups with their simulator figures."""
        shown = {o.key(): o for o in (self.recommended,) + self.runner_ups}
        return [shown.get(c.key(), c) for c in self.candidates]

    def pareto(self) -> list[ClusterOption]:
        """Options no other is both cheaper and faster than (checked figures: the lower of predicted and simulated rate), by duration."""
        every = self.options()
        front = [c for c in every if not any(o.checked_cost <= c.checked_cost and o.checked_hours <= c.checked_hours
                                             and (o.checked_cost < c.checked_cost or o.checked_hours < c.checked_hours) for o in every)]
        return sorted(front, key=lambda c: c.checked_hours)


class PlacementChecker:
    """Node counts per class checked by the placement MILP on their node-by-node cluster.

    Contract:
    - ``checker(counts)`` is the ``ClusterOption`` of that cluster (classes with a count of 0 dropped): its
      throughput and plan are the placement's (``_solve``: every operator on one device kind), its price the
      catalogue's, its job ``items`` input items; None when no placement exists. Each distinct cluster is
      solved once (``seen`` keeps every answer).
    - ``cheapest(target, fixed)`` is the checked cluster of least hourly price whose throughput reaches
      ``target`` (``fixed`` pins some classes' counts); ``least_cost(target)`` the one of least job cost (see
      ``plan_cluster``, step 1). Both are None when none is found: the node-count MILP finds no counts,
      or its answers still fall short after ``MAX_RAISES`` raises of its target.
    """

    def __init__(self, demands: Sequence[OperatorDemand], catalogue: Catalogue, items: int) -> None:
        self.demands, self.catalogue, self.items = demands, catalogue, items
        self.seen: dict[tuple[tuple[str, int], ...], ClusterOption | None] = {}

    def __call__(self, counts: Mapping[str, int]) -> ClusterOption | None:
        counts = {c: n for c, n in counts.items() if n > 0}
        key = tuple(sorted(counts.items()))
        if key not in self.seen:
            try:
                result = self._solve(counts)
            except PlacementError:
                self.seen[key] = None
            else:
                ordered = {c: counts[c] for c in self.catalogue.names if c in counts}
                self.seen[key] = ClusterOption(ordered, result.throughput, result.plan, self.catalogue.hourly_price(counts), self.items,
                                               bottlenecks=result.bottlenecks, startup_h=self.catalogue.startup_minutes / 60)
        return self.seen[key]

    def _solve(self, counts: Mapping[str, int]) -> PlacementResult:
        """The placement, with every operator on one device kind: an operator whose replicas the MILP splits
        between CPU and GPU is given the device that carries most of its capacity and the placement re-solved
        (measured in the simulator, documents short:500,scans:500 on 3x c64 + 2x g1: with embed replicas on
        both CPUs and GPUs the pipeline sustained 0.67x its predicted rate, with embed on the GPUs only 0.83x)."""
        cluster = self.catalogue.cluster_spec(counts)
        result = solve_placement(self.demands, cluster, time_limit_s=PLACEMENT_LIMIT_S)
        demands = list(self.demands)
        for i, (d, op) in enumerate(zip(self.demands, result.plan.operators)):
            by_device: dict[str, float] = {}
            for g in op.groups:
                k = d.option_index(g.config)
                by_device[g.config.device] = by_device.get(g.config.device, 0.0) + d.options[k].rate_at(g.replicas)
            if len(by_device) > 1:
                device = max(by_device, key=by_device.get)
                demands[i] = replace(d, options=tuple(o for o in d.options if o.config.device == device))
        if demands == list(self.demands):
            return result
        return solve_placement(demands, cluster, time_limit_s=PLACEMENT_LIMIT_S)

    def cheapest(self, target: float, fixed: Mapping[str, int] | None = None) -> ClusterOption | None:
        """The cluster of least hourly price whose checked throughput reaches ``target``; ``fixed`` pins class counts."""
        goal = target
        for _ in range(MAX_RAISES):
            counts = cheapest_counts(self.demands, self.catalogue, goal, fixed)
            if counts is None:
                return None
            option = self(counts)
            if option is not None and option.items_per_s >= target * (1 - 1e-6):
                return option
            reached = option.items_per_s if option is not None else 0.0
            goal = goal * (target / reached if reached > 0 else 1.1) * 1.001  # packing lost capacity: ask the MILP for more
        return None

    def least_cost(self, target: float) -> ClusterOption | None:
        """The checked cluster of least job cost whose throughput reaches ``target`` (see ``plan_cluster``, step 1).

        A job costs ``P * (startup + items / T)``. For one hourly price ``P`` the fastest cluster is
        the cheapest job, so the search walks up the price levels: the cheapest price reaching
        ``T``, the fastest cluster at that price, then ``T`` just above it. It stops when even the
        best price per item/s of any cluster (``rho``, a lower bound) and this price's start-up cost
        together exceed the best job found: a dearer cluster cannot be cheaper.
        """
        efficient = most_efficient_counts(self.demands, self.catalogue, target)
        if efficient is None:
            return None
        rho = self.catalogue.hourly_price(efficient) / resource_prices(self.demands, self.catalogue, efficient).throughput
        startup_h = self.catalogue.startup_minutes / 60
        best: ClusterOption | None = None
        t = target
        for _ in range(MAX_PRICE_LEVELS):
            counts = cheapest_counts(self.demands, self.catalogue, t)
            if counts is None:
                break
            price = self.catalogue.hourly_price(counts)
            if best is not None and price * startup_h + self.items * rho / 3600 >= best.cost:
                break
            fastest = fastest_within(self.demands, self.catalogue, price)
            for option in (self(counts), self(fastest[0]) if fastest else None):
                if option is not None and option.items_per_s >= target * (1 - 1e-6) and (best is None or option.cost < best.cost):
                    best = option
            t = max(t, fastest[1] if fastest else t) * (1 + 1e-6)
        if best is None:  # node-by-node packing lost what the aggregate model counted: raise the target
            best = self.cheapest(target)
        return best


def _regime_blocks(workload: PlanWorkload, option: ClusterOption, catalogue: Catalogue, max_gpu_memory: int) -> float:
    """Input items/s of ``option``'s placement when each regime arrives in its own block."""
    cluster = catalogue.cluster_spec(option.counts)
    total = sum(workload.weights.values())
    seconds = 0.0
    for regime, weight in workload.weights.items():
        demands = operator_demands(workload.profile, workload.regime_features(regime), workload.worst_features(), max_gpu_memory)
        keyed: dict[Key, int] = {}
        for op, d in zip(option.plan.operators, demands):
            for g in op.groups:
                key = Key(d.name, d.option_index(g.config), g.node_class or "")
                keyed[key] = keyed.get(key, 0) + g.replicas
        seconds += weight / total / throughput_of(demands, cluster, keyed)
    return 1.0 / seconds


def plan_cluster(workload: PlanWorkload, catalogue: Catalogue, goal: Goal, *, simulate_top: int = 3, runner_ups: int = 3) -> ClusterPlan:
    """The recommended cluster for ``goal``, its runner-ups and the Pareto candidates.

    1. The recommendation: ``PlacementChecker.least_cost`` walks the node-count MILP (``sizing``) up the price
       levels from the throughput the goal needs, each answer checked by the placement MILP on its node-by-node
       cluster (``placement.milp.solve_placement``, whose throughput is the prediction); when packing costs
       capacity the target is raised and the MILP re-solved (at most ``MAX_RAISES`` times).
    2. Other options, for the runner-ups and the Pareto front of cost and duration: the cheapest hourly price at
       a sweep of throughputs around the goal's, and the cheapest cluster without each class used and with each
       class unused; runner-ups are the other options meeting the goal, by cost.
    3. For the ``simulate_top`` best options, the simulator's steady throughput (``simcheck``); these are ranked
       again by their job at the lower of the predicted and the simulated rate (``checked_cost``; for a
       deadline, those the simulator says miss it last), so a cluster whose prediction the simulator does not
       confirm loses to one it does. Each option's range is the lowest and highest of the prediction (for the
       mix's mean item) and the simulator's figure, widened by ``MODEL_ERROR``; hours and cost ranges follow.
       Also reported, outside the range: the throughput if every regime arrived in one long block (each at the
       placement's rate for it), the worst case of a corpus sorted by kind."""
    max_gpu_memory = max((n.gpu_memory_bytes for n in catalogue.nodes), default=0)
    try:
        demands = operator_demands(workload.profile, workload.mean_features(), workload.worst_features(), max_gpu_memory)
    except ValueError as exc:
        raise PlanningError(str(exc)) from None
    check = PlacementChecker(demands, catalogue, goal.items)
    everything = {n.name: n.max_count for n in catalogue.nodes}
    fastest = resource_prices(demands, catalogue, everything).throughput  # LP bound: no catalogue cluster is faster
    notes = []
    if catalogue.placeholder_prices:
        notes.append("prices are the default catalogue's PLACEHOLDERS: pass --catalogue with your provider's prices")
    startup_h = catalogue.startup_minutes / 60
    if goal.deadline_h is not None:
        hours_fastest = startup_h + goal.items / fastest / 3600
        if goal.deadline_h <= startup_h:
            raise PlanningError(f"--deadline-h {goal.deadline_h:g} is within the nodes' start-up ({catalogue.startup_minutes:g} minutes, "
                                "catalogue startup_minutes): give a later deadline")
        target = goal.items / ((goal.deadline_h - startup_h) * 3600)
        best = check.least_cost(target) if target < fastest else None
        if best is None:
            raise PlanningError(f"no cluster from the catalogue ({catalogue.source}) processes {goal.items} items in {goal.deadline_h:g} h: "
                                f"even {' + '.join(f'{n}x {c}' for c, n in everything.items())} would need at least {hours_fastest:.3g} h; "
                                f"raise --deadline-h to at least {math.ceil(hours_fastest * 10) / 10:g}, lower --items, "
                                "or raise max_count in the catalogue")
    else:
        best = check.least_cost(1e-9)
        target = 1e-9
    for factor in SWEEP:  # other options for the runner-ups and the Pareto plot: the cheapest price at other speeds
        if target * factor < fastest:
            check.cheapest(target * factor if goal.deadline_h is not None else best.items_per_s * factor)
    used = [c for c, n in best.counts.items() if n > 0]
    for name in catalogue.names:  # the cheapest alternatives without each class used, and with each class unused
        check.cheapest(max(target, 1e-9), {name: 0} if name in used else {name: 1})
    candidates = [c for c in check.seen.values() if c is not None]
    if goal.deadline_h is not None:
        others = sorted((c for c in candidates if c.hours <= goal.deadline_h * (1 + 1e-9) and c is not best), key=lambda c: (c.cost, c.hours))
    else:
        if best.cost > goal.budget * (1 + 1e-9):
            raise PlanningError(f"no cluster from the catalogue processes {goal.items} items within {goal.budget:g} {catalogue.currency}: "
                                f"the cheapest ({best.label()}) costs {best.cost:.4g} {catalogue.currency}; "
                                f"raise --budget to at least {math.ceil(best.cost)} or lower --items")
        others = sorted((c for c in candidates if c.cost <= goal.budget * (1 + 1e-9) and c is not best), key=lambda c: (c.cost, c.hours))
    ranked = [best] + others
    checked = []
    for option in ranked[:simulate_top]:
        items = int(min(SIM_ITEMS_MAX, max(SIM_ITEMS_MIN, option.items_per_s * SIM_SECONDS)))
        checked.append(replace(option, simulated_items_per_s=simulate_plan(workload, catalogue, option.counts, option.plan, items).items_per_s))
    # the simulator's check can change the choice: the simulated options ranked by their job at the lower of the two rates
    checked.sort(key=lambda o: (goal.deadline_h is not None and o.checked_hours > goal.deadline_h, o.checked_cost))
    chosen = (checked + ranked[simulate_top:])[:1 + runner_ups]
    finished = [replace(o, blocks_items_per_s=_regime_blocks(workload, o, catalogue, max_gpu_memory)) for o in chosen]
    notes.append(f"items/s predicted by the placement MILP on the cost models for the mix's mean item; the range spans it and "
                 f"the simulator's steady rate, widened by {MODEL_ERROR:.1%} (the simulator's worst error against live runs)")
    if simulate_top:
        notes.append(f"the {min(simulate_top, len(ranked))} options checked in the simulator are ranked by their cost at the lower "
                     "of the predicted and the simulated items/s")
    return ClusterPlan(workload, catalogue, goal, finished[0], tuple(finished[1:]), tuple(candidates), tuple(notes))
