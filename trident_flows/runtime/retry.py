"""Retrying a failed batch: split it to isolate bad items, give an item up after its attempts.

Contract (pure: no Ray, no I/O; the runner re-queues what comes back and dead-letters the rest):
- ``after_failure(unit, max_attempts)``: the operator raised, ran out of memory or returned a
  malformed batch. A batch of several items is retried as its two halves (``split_in_halves``),
  so a bad item ends up alone; a single item counts an attempt and is retried whole until it has
  failed ``max_attempts`` times, then it is given up.
- ``after_death(unit, max_attempts)``: the replica died with the batch in flight (counted in
  ``unit.deaths``). The batch is retried whole (the death may be the node's fault, not the
  items'); one in flight at two deaths is split in halves; a single item is given up after
  ``max_attempts`` attempts.
- Retried units go back ahead of new items (``work_queue.Queue.push_unit``); a unit is never merged.
"""

from __future__ import annotations

from dataclasses import dataclass

from trident_flows.runtime.work_queue import Item, Unit


@dataclass(frozen=True)
class Retry:
    """What to do with a failed unit: the units to queue again, or the item given up."""

    requeue: tuple[Unit, ...] = ()
    give_up: Item | None = None


def split_in_halves(unit: Unit) -> list[Unit]:
    """The two halves (first half rounded down) a failing batch is retried as."""
    mid = len(unit.items) // 2
    return [Unit(unit.items[:mid]), Unit(unit.items[mid:])]


def _single(unit: Unit, max_attempts: int) -> Retry:
    item = unit.items[0]
    item.attempts += 1
    if item.attempts >= max_attempts:
        return Retry(give_up=item)
    return Retry(requeue=(unit,))


def after_failure(unit: Unit, max_attempts: int) -> Retry:
    """A batch the operator failed on (see the module docstring)."""
    if len(unit.items) > 1:
        return Retry(requeue=tuple(split_in_halves(unit)))
    return _single(unit, max_attempts)


def after_death(unit: Unit, max_attempts: int) -> Retry:
    """A batch in flight when its replica died; counts the death on ``unit`` (see the module docstring)."""
    unit.deaths += 1
    if len(unit.items) == 1:
        return _single(unit, max_attempts)
    if unit.deaths >= 2:
        return Retry(requeue=tuple(split_in_halves(unit)))
    return Retry(requeue=(unit,))
