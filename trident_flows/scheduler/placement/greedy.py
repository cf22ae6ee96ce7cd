"""Greedy integer replica counts: the MILP's start, its repair and often its answer.

Contract:
- ``Greedy(demands, cluster, eligible, reductions, counts).run()`` reaches every operator's minimum
  replicas (cheapest first; False when they do not fit), then alternately raises the bottleneck
  operator one replica at a time (most items/s per resource share, or a swap retiring replicas of an
  operator with headroom in the same class) and re-provisions operators with headroom as their
  cheapest single (option, class) group. It works on aggregate class resources (CPUs, GPUs, host
  memory, host<->device bandwidth), not the network rows, so ``throughput_of`` prices its plans.
- ``heuristic_start(prob, x, ...)`` solves the LP relaxation and returns (its objective, a bound; the
  better greedy plan from the LP rounded down and from the current placement, which wins ties).
"""

from __future__ import annotations

import math
from typing import Sequence

import pulp

from trident_flows.core.types import ClusterSpec
from trident_flows.scheduler.placement.model import Key, class_capacity, throughput_of, usage_vector
from trident_flows.scheduler.placement.types import OperatorDemand


def heuristic_start(prob: pulp.LpProblem, x: dict[Key, pulp.LpVariable], demands: Sequence[OperatorDemand],
                     cluster: ClusterSpec, eligible: dict[Key, int], reductions: dict[str, list[float]],
                     cur: dict[Key, int]) -> tuple[float | None, dict[Key, int]]:
    """A MIP start: solve the LP relaxation, round replicas down, then raise the bottleneck
    operator one replica at a time, taking room from operators with headroom when its class
    is full (``Greedy``). The same greedy also starts from the current placement (when it
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
        greedy = Greedy(demands, cluster, eligible, reductions, counts)
        if any(f < -1e-9 for free in greedy.free.values() for f in free) or not greedy.run():
            continue  # the current placement does not fit this model (or min replicas cannot be reached)
        placed = {key: n for key, n in greedy.counts.items() if n > 0}
        t = throughput_of(demands, cluster, placed)
        if t > best_t * (1 + 1e-9):
            best, best_t = dict(greedy.counts), t
    return bound, best


class Greedy:
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
