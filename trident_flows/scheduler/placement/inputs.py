"""From fitted operator models and the running state to the placement MILP's inputs.

Contract (pure functions):
- ``concave_curve(totals)`` turns predicted totals for 1..n replicas into ``PlacementOption``
  breakpoints (1, 2, 4, ..., n): per-replica gains are clipped so they never grow (concave) and
  never go below 0 (non-decreasing); the result under-estimates rather than over-promises.
- ``work_per_item(state, history)`` is, per operator, the items it receives per pipeline input
  item: the product, over the operators before it, of each one's rows forwarded per item taken
  (its own splits and filters). Each factor comes from one operator's own counters, so pipeline
  lag (items still queued between operators) cannot distort it; it is taken over the most recent
  interval of ``history`` (earlier states, oldest first) in which that operator took at least
  ``min_items`` items, else since the start, and is 1.0 before anything was measured. Comparing
  two operators' ``items_in`` instead swung the estimate several-fold from tick to tick.
- ``current_placement(state)`` is what serves now (canaries excluded) as a ``CurrentPlacement``;
  where the state lists live nodes, one group per config and node class the replicas run on.
"""

from __future__ import annotations

from typing import Sequence

from trident_flows.core.state import RunnerState
from trident_flows.core.types import ReplicaGroup
from trident_flows.scheduler.placement.types import CurrentPlacement
from trident_flows.scheduler.replicas import serving_groups

_MIN_WORK = 1e-3


def concave_curve(totals: Sequence[float]) -> tuple[tuple[int, float], ...]:
    """Concave, non-decreasing breakpoints of ``totals[r-1]`` = items/s of r replicas (see module docstring)."""
    if not totals or not totals[0] > 0:
        raise ValueError(f"concave_curve needs a positive throughput for 1 replica, got {list(totals)[:1]}")
    fixed, prev, slope = [], 0.0, float("inf")
    for t in totals:
        slope = max(0.0, min(slope, float(t) - prev))
        if slope == 0.0:  # a gain of 0 stays 0: every further replica adds nothing (a 256-node curve has thousands)
            break
        prev += slope
        fixed.append(prev)
    n = len(totals)
    points, r = [], 1
    while r < n:
        points.append((r, fixed[r - 1] if r <= len(fixed) else prev))
        r *= 2
    points.append((n, fixed[n - 1] if n <= len(fixed) else prev))
    return tuple(points)


def work_per_item(state: RunnerState, history: Sequence[RunnerState] = (), min_items: int = 20) -> dict[str, float]:
    """Items each operator receives per pipeline input item (see the module docstring)."""
    out, work = {}, 1.0
    for k, op in enumerate(state.operators):
        out[op.name] = max(_MIN_WORK, work)
        taken, forwarded = op.items_in, op.items_forwarded
        for old in reversed(history):
            if len(old.operators) != len(state.operators):
                continue
            before = old.operators[k]
            if op.items_in - before.items_in >= min_items:
                taken, forwarded = op.items_in - before.items_in, op.items_forwarded - before.items_forwarded
                break
        if taken > 0:
            work *= forwarded / taken
    return out


def current_placement(state: RunnerState) -> CurrentPlacement:
    """The serving replicas of every operator (canaries excluded)."""
    if not getattr(state, "nodes", ()):
        return CurrentPlacement(tuple((op.name, serving_groups(op)) for op in state.operators))
    live = {n.node_class for n in state.nodes}
    out = []
    for op in state.operators:
        counts: dict[tuple, int] = {}
        for r in op.active:
            if not r.canary:
                key = (r.config, r.node_class if r.node_class in live else None)
                counts[key] = counts.get(key, 0) + 1
        out.append((op.name, tuple(ReplicaGroup(c, n, where) for (c, where), n in sorted(counts.items(), key=lambda kv: (kv[0][0].label(), kv[0][1] or "")))))
    return CurrentPlacement(tuple(out))
