"""From fitted operator models and the running state to the placement MILP's inputs.

Contract (pure functions):
- ``concave_curve(totals)`` turns predicted totals for 1..n replicas into ``PlacementOption``
  breakpoints (1, 2, 4, ..., n): per-replica gains are clipped so they never grow (concave) and
  never go below 0 (non-decreasing); the result under-estimates rather than over-promises.
- ``work_per_item(state, previous)`` is, per operator, the items it receives per pipeline input
  item: the ratio of its completed input items to the first operator's, over the interval since
  ``previous`` when both moved, else since the start (1.0 before anything was measured).
- ``current_placement(state)`` is what serves now (canaries excluded) as a ``CurrentPlacement``.
"""

from __future__ import annotations

from typing import Sequence

from trident_flows.runtime.state import RunnerState
from trident_flows.scheduler.placement_types import CurrentPlacement
from trident_flows.scheduler.replicas import serving_groups

_MIN_WORK = 1e-3


def concave_curve(totals: Sequence[float]) -> tuple[tuple[int, float], ...]:
    """Concave, non-decreasing breakpoints of ``totals[r-1]`` = items/s of r replicas (see module docstring)."""
    if not totals or not totals[0] > 0:
        raise ValueError(f"concave_curve needs a positive throughput for 1 replica, got {list(totals)[:1]}")
    fixed, prev, slope = [], 0.0, float("inf")
    for t in totals:
        slope = max(0.0, min(slope, float(t) - prev))
        prev += slope
        fixed.append(prev)
    n = len(fixed)
    points, r = [], 1
    while r < n:
        points.append((r, fixed[r - 1]))
        r *= 2
    points.append((n, fixed[n - 1]))
    return tuple(points)


def work_per_item(state: RunnerState, previous: RunnerState | None = None) -> dict[str, float]:
    """Items each operator receives per pipeline input item (see the module docstring)."""
    ops = state.operators
    out = {}
    d0 = ops[0].items_in - (previous.operators[0].items_in if previous is not None else 0)
    for k, op in enumerate(ops):
        ratio = None
        if previous is not None and d0 > 0:
            d = op.items_in - previous.operators[k].items_in
            if d > 0:
                ratio = d / d0
        if ratio is None and ops[0].items_in > 0 and op.items_in > 0:
            ratio = op.items_in / ops[0].items_in
        out[op.name] = max(_MIN_WORK, ratio if ratio is not None else 1.0)
    return out


def current_placement(state: RunnerState) -> CurrentPlacement:
    """The serving replicas of every operator (canaries excluded)."""
    return CurrentPlacement(tuple((op.name, serving_groups(op)) for op in state.operators))
