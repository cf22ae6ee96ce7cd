"""The pipeline's sustainable end-to-end throughput, from two runner snapshots.

Contract (every figure in input items):
- ``stream_positions(state) -> {operator: input items}``: how far each operator has got in the
  input stream (queues are FIFO; filtered rows never hold a position back, split rows count as
  the input item they came from).
- ``completed_input_items(state)``: the last operator's position; items queued or in flight are
  not counted, so queues filling or draining do not count as throughput.
- ``remaining_input_items(state, total) -> float | None``: input items the run has still to finish.
- ``sustainable_throughput(before, after) -> float``: completed input items per second between two
  snapshots of one run (``wall_s`` the clock); ``ValueError`` for different pipelines or out of order.
- ``placement_settled(state, operators) -> bool``: the named operators run only their current
  placement, so a throughput measured now is the new placement's.
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
    """Input items not yet read (``total`` less the runner's ``items_in``) plus those read and not yet completed
    (queued or in flight anywhere, counted by stream position, not as rows: a video split into clips is still one
    input item); None when ``total`` is unknown."""
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
    """True when ``operators`` run only their current placement: no replica draining, every other one warm and
    with a finished batch. A throughput measured before that is the old placement's: a new replica's first batch
    completes a batch time after it is warm (tens of seconds for slow batches), and a draining one still adds the
    old replicas' output."""
    for name in operators:
        op = state.operator(name)
        if any(r.draining or not r.warm or r.batches < 1 for r in op.replicas):
            return False
    return True
