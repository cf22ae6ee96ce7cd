"""An upper bound on the placement MILP's throughput that sees integer replicas
(used by ``placement.milp.solve_placement``).

Contract:
- ``rounding_bound(demands, prices, budget, eligible, t_lo, t_hi)`` returns ``U <= t_hi`` with
  ``T <= U`` for every integer placement whose resource use satisfies the surrogate row
  ``sum_key price(key) * replicas(key) + sum_options bw_price(option) * items_per_s(option)
  <= budget``. Every feasible placement does when ``prices``/``budget`` are a non-negative
  combination of the MILP's class resource rows, so ``U`` is valid for any non-negative
  multipliers; the LP relaxation's row duals make it tight.
- It buys whole replicas (where the LP relaxation buys fractional ones), with relaxations that
  keep it valid. Pure numpy, no solver.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

from trident_flows.scheduler.placement.model import Key
from trident_flows.scheduler.placement.types import OperatorDemand

_REL = 1e-7  # slack on budget comparisons, so rounding errors can only loosen the bound


class _TooLarge(Exception):
    """The enumeration would exceed ``MAX_PAIRS``; the operator is priced by ``_Fractional``."""


GRID = 1e-4  # relative resolution of capacities (see _Frontier)
MAX_PAIRS = 50_000  # (frontier point, replica count) pairs per option: bounds time and memory


class _Frontier:
    """Least cost (over whole replicas of an operator's options) of at least ``c`` items/s
    for ``cap_lo <= c <= cap_hi``: Pareto points (capacity ascending, cost ascending).
    Partial mixes that cannot reach ``cap_lo`` within the least cost of reaching ``cap_hi``
    found so far are pruned (the rest is priced at the best first-replica cost per item/s
    of the options still to come, a lower bound as curves are concave). Rates are rounded
    up to a grid of ``GRID * cap_hi / options`` (optimistic, so the bound stays valid and
    loosens by at most ``GRID``), which keeps the frontier small."""

    def __init__(self, options: Sequence[tuple[float, np.ndarray]], cap_lo: float, cap_hi: float) -> None:
        options = sorted(options, key=lambda o: o[0] / o[1][1] if len(o[1]) > 1 and o[1][1] > 0 else math.inf)
        step = GRID * cap_hi / max(1, len(options))
        cost_cap = self._greedy_cost(options, cap_hi)
        per_item = [price / rates[1] if len(rates) > 1 and rates[1] > 0 else math.inf for price, rates in options]
        caps, costs = np.zeros(1), np.zeros(1)
        for j, (price, rates) in enumerate(options):  # rates[n] = items/s of n replicas
            if math.isfinite(cost_cap) and price > 0:
                rates = rates[: int(cost_cap * (1 + _REL) / price) + 1]
            if len(caps) * len(rates) > MAX_PAIRS:
                raise _TooLarge
            rest = min(per_item[j + 1:], default=math.inf)
            c = np.minimum(caps[:, None] + np.ceil(rates / step)[None, :] * step, cap_hi).ravel()
            k = (costs[:, None] + price * np.arange(len(rates))[None, :]).ravel()
            short = np.maximum(cap_lo - c, 0.0)
            keep = k + np.where(short > 0, short * rest if math.isfinite(rest) else math.inf, 0.0) <= cost_cap * (1 + _REL) + 1e-12
            caps, costs = self._pareto(c[keep], k[keep])
            if caps[-1] >= cap_hi:
                cost_cap = min(cost_cap, float(costs[-1]))
        self.caps, self.costs = caps, costs

    @staticmethod
    def _greedy_cost(options: Sequence[tuple[float, np.ndarray]], cap_hi: float) -> float:
        """Cost of reaching ``cap_hi`` by adding replicas in order of items/s per price (marginal
        gains fall along each concave curve, so one sort gives that order): an upper bound
        on the least cost of any capacity up to ``cap_hi``."""
        gains = [np.diff(rates) for _, rates in options]
        prices = [np.full(len(g), price) for (price, _), g in zip(options, gains)]
        gain, price = np.concatenate(gains), np.concatenate(prices)
        with np.errstate(divide="ignore", invalid="ignore"):
            order = np.argsort(-np.where(price > 0, gain / price, math.inf), kind="stable")
        reached = np.nonzero(np.cumsum(gain[order]) >= cap_hi * (1 - _REL))[0]
        return float(np.cumsum(price[order])[reached[0]]) if len(reached) else math.inf

    @staticmethod
    def _pareto(caps: np.ndarray, costs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        order = np.lexsort((costs, -caps))  # capacity descending, then cost ascending
        caps, costs = caps[order], costs[order]
        best_above = np.minimum.accumulate(costs)
        keep = np.ones(len(costs), dtype=bool)
        keep[1:] = costs[1:] < best_above[:-1]
        return caps[keep][::-1], costs[keep][::-1]

    def min_cost(self, need: float) -> float:
        """Least cost of at least ``need`` items/s (``inf`` beyond the frontier)."""
        j = int(np.searchsorted(self.caps, need * (1 - _REL), side="left"))
        return float(self.costs[j]) if j < len(self.caps) else math.inf


class _Fractional:
    """Least cost of ``c`` items/s when replicas may be fractional: marginal replicas in order
    of items/s per price (the continuous relaxation of ``_Frontier``, convex in ``c``; used
    for operators whose enumeration is too large)."""

    def __init__(self, options: Sequence[tuple[float, np.ndarray]]) -> None:
        gain = np.concatenate([np.diff(rates) for _, rates in options])
        price = np.concatenate([np.full(len(rates) - 1, p) for p, rates in options])
        with np.errstate(divide="ignore", invalid="ignore"):
            order = np.argsort(-np.where(price > 0, gain / price, math.inf), kind="stable")
        self.gain, self.price = gain[order], price[order]
        self.caps = np.concatenate([[0.0], np.cumsum(self.gain)])
        self.costs = np.concatenate([[0.0], np.cumsum(self.price)])

    def min_cost(self, need: float) -> float:
        """Least cost of ``need`` items/s with fractional replicas (``inf`` beyond the limits)."""
        j = int(np.searchsorted(self.caps, need * (1 - _REL), side="left"))
        if j == 0:
            return 0.0
        if j >= len(self.caps):
            return math.inf
        g = self.gain[j - 1]
        part = (need * (1 - _REL) - self.caps[j - 1]) / g if g > 0 else 0.0
        return float(self.costs[j - 1] + max(part, 0.0) * self.price[j - 1])


def rounding_bound(demands: Sequence[OperatorDemand], prices: Mapping[Key, tuple[float, float]], budget: float,
                   eligible: Mapping[Key, int], t_lo: float, t_hi: float) -> float:
    """``U <= t_hi`` with ``T <= U`` for every integer placement satisfying the surrogate row (module docstring).

    Why it is stronger than the LP relaxation: the LP buys fractional replicas, the surrogate buys whole ones,
    per operator at least ``work_per_item * T`` items/s at least cost (``min_cost``), over every mix of its
    options (exact, by a Pareto frontier of (capacity, cost) over whole replica counts of each option,
    ``_Frontier``). The pipeline bound is the largest ``T`` whose summed least costs fit ``budget`` (bisection:
    the summed cost rises with ``T``). Relaxations, each keeping the bound valid: an option's replicas are
    priced on its cheapest eligible class; per-class replica limits, ``max_replicas`` and node packing are
    dropped (only each option's total replicas are capped by the sum of its classes' limits); bandwidth is
    priced at the operator's cheapest per-item bandwidth price; capacities are rounded up to a grid (``GRID``).

    ``prices[key]`` = (price of one replica, price of
    one item/s of its bandwidth) of an eligible (operator, option, class); ``eligible[key]``
    its replica limit; ``t_lo`` a throughput known to be reachable (a feasible plan's),
    ``t_hi`` a known upper bound on T (the LP relaxation's). An operator whose enumeration
    would exceed ``MAX_PAIRS`` (hundreds of replicas per option, where rounding matters
    least) is priced with fractional replicas instead (``_Fractional``)."""
    if not (0 <= t_lo < t_hi and math.isfinite(t_hi)) or not budget >= 0:
        return t_hi
    parts: list[tuple[float, _Frontier | _Fractional]] = []
    linear = 0.0  # bandwidth: price per unit of T
    for d in demands:
        cap_hi = d.work_per_item * t_hi
        options, bw_price = [], math.inf
        for k, opt in enumerate(d.options):
            keys = [key for key in eligible if key.operator == d.name and key.option == k]
            if not keys:
                continue
            price = min(prices[key][0] for key in keys)
            bw_price = min([bw_price] + [prices[key][1] for key in keys])
            most = sum(eligible[key] for key in keys)
            n_hi = 1
            while n_hi < most and opt.rate_at(n_hi) < cap_hi:
                n_hi = min(2 * n_hi, most)
            n = np.arange(n_hi + 1, dtype=float)
            rates = np.min([a + slope * n for a, slope in opt.segments()], axis=0)
            rates[0] = 0.0
            options.append((max(price, 0.0), rates))
        linear += d.work_per_item * (max(bw_price, 0.0) if math.isfinite(bw_price) else 0.0)
        try:
            parts.append((d.work_per_item, _Frontier(options, d.work_per_item * t_lo * (1 - 10 * _REL), cap_hi)))
        except _TooLarge:
            parts.append((d.work_per_item, _Fractional(options)))
    limit = budget * (1 + _REL) + 1e-12

    def fits(t: float) -> bool:
        total = linear * t
        for w, part in parts:
            total += part.min_cost(w * t)
            if total > limit:
                return False
        return True

    # The least total cost rises with T, so the T that fit form [0, U]: bisect for U (``hi``
    # stays above it). T >= t_lo is reachable; if rounding says otherwise, keep the LP bound.
    lo, hi = t_lo * (1 - 10 * _REL), t_hi
    if fits(hi) or not fits(lo):
        return t_hi
    while hi - lo > _REL * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return hi
