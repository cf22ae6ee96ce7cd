"""The pipeline's sustainable end-to-end throughput, from two runner snapshots.

Contract:
- ``stream_positions(state) -> {operator: input items}``: how far each operator has got in the
  input stream, in input items: the head's items taken, then, for each later operator, the
  share of the rows delivered to it that it has taken, applied to the position of the operator
  before it (queues are FIFO; rows filtered upstream are never delivered, so they do not hold a
  position back, and rows split into several count as the input item they came from).
- ``completed_input_items(state)``: the last operator's position: input items the whole
  pipeline has finished. Items queued or in flight anywhere are not counted, so queues filling
  at start-up, or draining after a change, do not count as throughput.
- ``remaining_input_items(state, total) -> float | None``: input items the run has still to
  finish, in input items like every figure here: those not yet read from the source (``total``,
  the input's size, less the runner's ``items_in``) plus those read and not yet completed
  (queued or in flight anywhere, counted by stream position, not as rows: on the video pipeline
  one clip becomes about five rows after ``scenes``); None when ``total`` is unknown.
- ``sustainable_throughput(before, after) -> float``: completed input items per second between
  two snapshots of one run (``RunnerState.wall_s`` is the clock); ``ValueError`` for snapshots
  of different pipelines or out of order.
- ``placement_settled(state, operators) -> bool``: whether the named operators run only their
  current placement: no replica draining, every other one warm and with a finished batch. A
  throughput measured before that is the old placement's: a new replica's first batch completes
  a batch time after it is warm, and a draining one still adds the old replicas' output. In the
  live document trace under ds2, OCR batches of long documents took 15-25 s: a plan taking OCR
  from 2 to 6 replicas, measured for 9 s from the tick its replicas were warm, counted only the
  2 old replicas' output.
"""

from __future__ import annotations

from typing import Any, Iterable


def stream_positions(state: Any) -> dict[str, float]:
    """Each operator's position in the input stream, in input items (see the module docstring)."""
    out: dict[str, float] = {}
    position, delivered = 0.0, None
    for op in state.operators:
        if delivered is None:
            position = float(op.items_in)
        elif delivered > 0:
            position *= min(1.0, op.items_in / delivered)
        else:
            position = 0.0
        out[op.name] = position
        delivered = op.items_forwarded
    return out


def completed_input_items(state: Any) -> float:
    """Input items the whole pipeline has finished (the last operator's stream position)."""
    if not state.operators:
        return 0.0
    return stream_positions(state)[state.operators[-1].name]


def remaining_input_items(state: Any, total: int | None) -> float | None:
    """Input items not yet read plus those read and not yet completed (see the module docstring)."""
    if not total:
        return None
    return max(0.0, float(total) - state.items_in) + max(0.0, state.items_in - completed_input_items(state))


def sustainable_throughput(before: Any, after: Any) -> float:
    """Completed input items per second between two snapshots of one run."""
    if [o.name for o in before.operators] != [o.name for o in after.operators]:
        raise ValueError("sustainable_throughput: the snapshots are of different pipelines "
                         f"({[o.name for o in before.operators]} vs {[o.name for o in after.operators]})")
    dt = after.wall_s - before.wall_s
    if dt <= 0:
        raise ValueError(f"sustainable_throughput: snapshots out of order or equal (wall_s {before.wall_s} -> {after.wall_s}); "
                         "pass the earlier one first")
    return (completed_input_items(after) - completed_input_items(before)) / dt


def placement_settled(state: Any, operators: Iterable[str]) -> bool:
    """True when ``operators`` run only their current placement (see the module docstring)."""
    for name in operators:
        op = state.operator(name)
        if any(r.draining or not r.warm or r.batches < 1 for r in op.replicas):
            return False
    return True
