"""Scale decisions: how many autoscaled worker nodes of each class a running job should hold for its goal (pure).

Contract:
- ``RunGoal``: ``deadline_at`` (epoch seconds: the least cost finishing by then) or ``budget`` (the
  least cost per item, never more than the budget). ``parse_deadline(text, now)`` reads seconds from
  now (``5400``, ``90m``, ``1.5h``) or an ISO 8601 time; anything else, or a past time, is refused.
- ``NodePool``: the worker classes of a ``Catalogue`` trident may ask Ray's autoscaler for (each
  class's name is its Ray node type and a custom resource its nodes carry; CPUs, GPUs, price,
  ``max_count``, ``startup_minutes``) and the price of the base cluster; ``bundles(counts)`` is the
  ``request_resources`` request (one bundle per node, with its class marker).
- ``decide_scale(...)`` returns a ``ScaleDecision``: worker counts per class to request, why, and
  its predicted effect (items/s, seconds to the last item, cost of the remaining work with start-up).
- Plain data and the planning MILPs: no Ray (``control.elastic`` acts on the decisions).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any, Mapping, Sequence

from trident_flows.planning.catalogue import Catalogue, NodeType, PlanningError
from trident_flows.planning.planner import MAX_RAISES, PlacementChecker
from trident_flows.planning.sizing import most_efficient_counts
from trident_flows.scheduler.placement.types import OperatorDemand

BASE = "base"  # the nodes trident does not manage (the head), one class of the MILP pinned at one node
HEAD_PRICE_CLASS = "head"  # a catalogue class of this name prices the base cluster
DEADLINE_MARGIN = 0.10  # a cluster must finish this share of the time left before the deadline
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*$")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_deadline(text: str, now: float) -> float:
    """The epoch seconds ``text`` names: seconds from ``now`` (``5400``, ``90m``, ``1.5h``) or an ISO 8601 time."""
    match = _DURATION.match(text)
    if match:
        at = now + float(match.group(1)) * _UNIT_S[match.group(2)]
    else:
        try:
            at = datetime.fromisoformat(text.strip()).timestamp()
        except ValueError:
            raise PlanningError(f"--deadline {text!r}: give seconds from now (5400, 90m, 1.5h) or an ISO 8601 time "
                                "(2026-12-05T06:00, 2026-12-05T06:00+01:00)") from None
    if not at > now:
        raise PlanningError(f"--deadline {text!r} is not in the future; give a later time or a positive duration")
    return at


@dataclass(frozen=True)
class RunGoal:
    """A deadline (epoch seconds) or a budget (currency) for a whole job; exactly one."""

    deadline_at: float | None = None
    budget: float | None = None

    def __post_init__(self) -> None:
        if (self.deadline_at is None) == (self.budget is None):
            raise PlanningError("give one goal: --deadline (least cost finishing by then) or --budget (least cost per item within it)")
        if self.budget is not None and not (self.budget > 0 and math.isfinite(self.budget)):
            raise PlanningError(f"--budget {self.budget}: give an amount > 0")

    def to_dict(self) -> dict[str, Any]:
        return {"deadline_at": self.deadline_at, "budget": self.budget}


@dataclass(frozen=True)
class NodePool:
    """The worker classes trident may request and the base cluster's price (see the module docstring)."""

    classes: Catalogue
    base_price_per_hour: float = 0.0

    @classmethod
    def from_catalogue(cls, catalogue: Catalogue) -> "NodePool":
        workers = tuple(n for n in catalogue.nodes if n.name != HEAD_PRICE_CLASS)
        if not workers:
            raise PlanningError(f"catalogue {catalogue.source}: no worker class besides {HEAD_PRICE_CLASS!r}; add the node types "
                                "the autoscaler may start, each named as its Ray node type")
        head = next((n.price_per_hour for n in catalogue.nodes if n.name == HEAD_PRICE_CLASS), 0.0)
        return cls(Catalogue(workers, catalogue.currency, catalogue.source, catalogue.placeholder_prices, catalogue.startup_minutes), head)

    @property
    def startup_s(self) -> float:
        return self.classes.startup_minutes * 60.0

    def bundles(self, counts: Mapping[str, int]) -> list[dict[str, float]]:
        """The ``request_resources(bundles=...)`` of ``counts``: each node whole, with its class marker."""
        out = []
        for name, n in counts.items():
            node = self.classes.node(name)
            shape = {"CPU": float(node.cpus), name: 1.0, **({"GPU": float(node.gpus)} if node.gpus else {})}
            out += [dict(shape) for _ in range(n)]
        return out

    def hourly_price(self, counts: Mapping[str, int]) -> float:
        return self.base_price_per_hour + self.classes.hourly_price(counts)

    def base_node(self, cpus: float, gpus: int = 0, gpu_memory_bytes: int = 0) -> NodeType:
        """The base cluster (the nodes trident does not manage) as one node at the base price."""
        return NodeType(BASE, cpus, self.base_price_per_hour, gpus, gpu_memory_bytes, 1)


class ScaleAction(str, Enum):
    ADD = "add"              # request more nodes than held
    GIVE_BACK = "give_back"  # request fewer nodes than held
    KEEP = "keep"            # the request stands
    WAIT = "wait"            # no measured rates yet: the request stands

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class ScaleDecision:
    """Worker counts to request and why, with the predicted effect (see the module docstring)."""

    action: ScaleAction
    counts: Mapping[str, int]
    reason: str
    predicted_items_per_s: float = 0.0
    predicted_finish_s: float = math.inf
    predicted_cost: float = 0.0
    at: float = 0.0
    measured_items_per_s: float | None = field(default=None, compare=False)  # filled in by whoever measures it afterwards

    @property
    def nodes(self) -> int:
        return sum(self.counts.values())

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action.value, "nodes": dict(self.counts), "reason": self.reason,
                "predicted_items_per_s": self.predicted_items_per_s,
                "predicted_finish_s": self.predicted_finish_s if math.isfinite(self.predicted_finish_s) else None,
                "predicted_cost": self.predicted_cost, "at": self.at, "measured_items_per_s": self.measured_items_per_s}


def _label(counts: Mapping[str, int]) -> str:
    return " + ".join(f"{n}x {c}" for c, n in counts.items() if n > 0) or "no worker node"


class _Cluster:
    """The base node and the pool's classes as one catalogue; clusters rated with whole replicas (the planner's check)."""

    def __init__(self, demands: Sequence[OperatorDemand], pool: NodePool, base: NodeType, running: Mapping[str, int],
                 measured_items_per_s: float | None) -> None:
        self.demands, self.pool, self.base = demands, pool, base
        self.check = PlacementChecker(demands, self.catalogue(), 1)
        checked_now = self.checked(running) if measured_items_per_s else 0.0
        # the check is an upper bound (measured service rates, no overheads): calibrated down, never up
        self.factor = min(1.0, measured_items_per_s / checked_now) if measured_items_per_s and checked_now > 0 else 1.0

    def catalogue(self, most: Mapping[str, int] | None = None) -> Catalogue:
        """The model's classes; ``most`` caps some classes' counts."""
        workers = tuple(NodeType(n.name, n.cpus, n.price_per_hour, n.gpus, n.gpu_memory_bytes,
                                 min(n.max_count, (most or {}).get(n.name, n.max_count))) for n in self.pool.classes.nodes)
        return Catalogue((self.base,) + workers, self.pool.classes.currency, self.pool.classes.source)

    def checked(self, counts: Mapping[str, int]) -> float:
        option = self.check({BASE: 1, **counts})
        return option.items_per_s if option is not None else 0.0

    def rate(self, counts: Mapping[str, int]) -> float:
        """Items/s on the base node plus ``counts``: the check calibrated to the running nodes' measured rate."""
        return self.checked(counts) * self.factor

    def efficient(self, target: float, at_least: Mapping[str, int] | None = None, most: Mapping[str, int] | None = None) -> dict[str, int] | None:
        """The least cost per item reaching ``target`` by the whole-replica check (the MILP's target raised when packing loses)."""
        goal = target
        for _ in range(MAX_RAISES):
            counts = most_efficient_counts(self.demands, self.catalogue(most), goal / self.factor, fixed={BASE: 1}, at_least=at_least)
            if counts is None:
                return None
            counts = {c: n for c, n in counts.items() if c != BASE and n > 0}
            reached = self.rate(counts)
            if reached >= target * (1 - 1e-6):
                return counts
            goal = goal * (target / reached if reached > 0 else 1.1) * 1.001
        return None


def _finish_s(items_left: float, rate_now: float, rate_later: float, startup_s: float) -> float:
    """Seconds to the last item at ``rate_now`` for ``startup_s``, then ``rate_later``."""
    if rate_now > 0 and items_left <= rate_now * startup_s:
        return items_left / rate_now
    rest = items_left - rate_now * startup_s
    return startup_s + rest / rate_later if rate_later > 0 else math.inf


def _cost(pool: NodePool, counts: Mapping[str, int], held: Mapping[str, int], finish_s: float) -> float:
    """The remaining work's cost on ``counts``: every node until the end, new ones from their start-up."""
    if not math.isfinite(finish_s):
        return math.inf
    new = {c: max(0, n - held.get(c, 0)) for c, n in counts.items()}
    return pool.hourly_price(counts) * finish_s / 3600 + pool.classes.hourly_price(new) * pool.startup_s / 3600


def decide_scale(demands: Sequence[OperatorDemand], pool: NodePool, base: NodeType, running: Mapping[str, int], requested: Mapping[str, int],
                 items_left: float, now: float, goal: RunGoal, spent: float = 0.0, margin: float = DEADLINE_MARGIN,
                 measured_items_per_s: float | None = None) -> ScaleDecision:
    """The worker counts to request for ``goal``. ``running``: live nodes per class;
    ``requested``: what trident asks for now; ``spent``: what the job's nodes cost so far; ``measured_items_per_s``:
    the input items/s measured on the running nodes (None: not measured on them).

    ``demands`` are the operators' measured rates (``advice.measured_demands``); ``base`` is the nodes trident does
    not manage as one node (``NodePool.base_node``). A cluster's rate (the base node plus the counts) is the
    planner's whole-replica check (``planner.PlacementChecker``: the placement MILP node by node, every operator at
    least one whole replica), never the LP relaxation, which overstates a small cluster where light operators each
    hold a whole CPU many times over. With ``measured_items_per_s`` every cluster's check is scaled by the measured
    share of the running cluster's check (at most 1: the check is an upper bound). Candidate counts come from the
    node-count MILP (``sizing``, whole replicas per class) and are checked the same way, the target raised when
    packing loses capacity. With no work left every node is given back.

    Deadline: the held nodes are kept while they are needed; when the cluster of least cost per item among those
    holding at most them still finishes twice ``margin`` early (a band against adding them again), the rest are
    given back; when the held nodes would miss the deadline, the least cost per item among clusters keeping them
    and, counting that new nodes work only after start-up, finishing ``margin`` early is requested (every node when
    none would; nothing new when start-up alone outlasts the deadline). Budget: the cluster of least cost per item
    reaching the held rate, if the remaining work on it is cheaper than on the held one and within what is left of
    the budget."""
    held = {c: n for c, n in requested.items() if n > 0}
    if items_left <= 0:
        action = ScaleAction.GIVE_BACK if held else ScaleAction.KEEP
        return ScaleDecision(action, {}, "no work left: every node given back", at=now)
    model = _Cluster(demands, pool, base, running, measured_items_per_s)
    rate_now, rate_held = model.rate(running), model.rate(held)
    pending = any(held.get(c, 0) > running.get(c, 0) for c in held)
    finish_held = _finish_s(items_left, rate_now, rate_held, pool.startup_s if pending else 0.0)

    def decision(counts: dict[str, int], why: str) -> ScaleDecision:
        new = any(counts.get(c, 0) > held.get(c, 0) for c in counts)
        finish = _finish_s(items_left, rate_now, model.rate(counts), pool.startup_s if new or pending else 0.0)
        action = (ScaleAction.ADD if new else ScaleAction.GIVE_BACK if counts != held else ScaleAction.KEEP)
        return ScaleDecision(action, counts, why, model.rate(counts), finish, _cost(pool, counts, running, finish), now)

    if goal.budget is not None:
        left = goal.budget - spent
        cheapest = model.efficient(max(rate_held, 1e-9))
        held_cost = _cost(pool, held, running, finish_held)
        if cheapest is not None and cheapest != held:
            option = decision(cheapest, "")
            if option.predicted_cost < held_cost and option.predicted_cost <= left:
                return decision(cheapest, f"{_label(cheapest)}: least cost per item, {option.predicted_cost:.3g} "
                                          f"{pool.classes.currency} for the remaining {items_left:g} items ({left:.3g} of the budget left)")
        return decision(held, f"{_label(held)}: no cluster does the remaining work cheaper within the budget "
                              f"({held_cost:.3g} {pool.classes.currency}, {left:.3g} left)")

    seconds_left = float(goal.deadline_at) - now  # type: ignore[arg-type]
    in_time = seconds_left * (1 - margin)
    if finish_held <= in_time:
        # nodes go back only when the rest finish twice the margin early: a band, so that the next decision does not add them again
        keep_need = items_left / (seconds_left * (1 - 2 * margin)) if margin < 0.5 else math.inf
        fewer = model.efficient(keep_need, most=held) if held and math.isfinite(keep_need) else None
        if fewer is not None and pool.classes.hourly_price(fewer) < pool.classes.hourly_price(held):
            return decision(fewer, f"{_label(fewer)} still finish {margin:.0%} before the deadline "
                                   f"({items_left:g} items in {seconds_left:.0f} s): {_label({c: held[c] - fewer.get(c, 0) for c in held})} given back")
        return decision(held, f"{_label(held)} finish in {finish_held:.0f} s, {seconds_left:.0f} s before the deadline: nothing to add")
    after_start = in_time - pool.startup_s
    if after_start <= 0:
        return decision(held, f"a new node would work only after {pool.startup_s:.0f} s of start-up, past the deadline "
                              f"({seconds_left:.0f} s left): the deadline will be missed by ~{finish_held - seconds_left:.0f} s")
    target = max(items_left - rate_now * pool.startup_s, 0.0) / after_start
    more = model.efficient(target, at_least=held)
    if more is None:
        every = {n.name: n.max_count for n in pool.classes.nodes}
        return decision(every, f"no cluster finishes {items_left:g} items in {seconds_left:.0f} s; every node the pool has "
                               f"({_label(every)}) finishes soonest")
    return decision(more, f"{_label(held)} would finish in {finish_held:.0f} s, past the deadline in {seconds_left:.0f} s: "
                          f"{_label(more)} is the least cost per item finishing {margin:.0%} early, start-up "
                          f"{pool.startup_s:.0f} s included")
