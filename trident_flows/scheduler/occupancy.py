"""Queue and in-flight awareness: whether an operator ran at its capacity, from runner snapshots.

Contract:
- ``classify(op) -> Occupancy`` for one ``OperatorState``, from its input queue and the batches
  its serving replicas (not draining, not canaries) hold: ``SATURATED`` (work waiting, every
  serving replica holding a batch: at capacity), ``BLOCKED`` (work waiting, a replica idle: held
  back by a full downstream queue), ``STARVED`` (nothing waiting, a replica idle) or ``BUSY``
  (nothing waiting, every replica holding a batch). Only ``SATURATED`` time says what the operator
  can do; the rest says it can do at least what it did.
- ``OccupancyTracker(saturation_s).update(state, at) -> {operator: SaturatedSpan}``: operators
  saturated throughout the last ``saturation_s`` with unchanged configs, with what they measurably
  took (``measured`` items/s; ``bound=True`` when an upper bound). ``OperatorModel.calibrate``
  turns a span into the capacity the model reports.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from enum import Enum
from typing import Any

from trident_flows.core.types import OpConfig


class Occupancy(str, Enum):
    SATURATED = "saturated"
    BLOCKED = "blocked"
    STARVED = "starved"
    BUSY = "busy"


def serving(op: Any) -> list[Any]:
    """Replicas that take batches for the current placement (not draining, not canaries)."""
    return [r for r in op.replicas if not r.draining and not r.canary]


def classify(op: Any) -> Occupancy:
    """The occupancy of one ``OperatorState`` snapshot (see the module docstring)."""
    reps = serving(op)
    all_hold = bool(reps) and all(r.inflight > 0 for r in reps)
    if op.queue_items > 0:
        return Occupancy.SATURATED if all_hold else Occupancy.BLOCKED
    return Occupancy.BUSY if all_hold else Occupancy.STARVED


def serving_configs(op: Any) -> tuple[tuple[OpConfig, int], ...]:
    """(config, replicas) of the serving replicas, sorted by label (a hashable placement of one operator)."""
    counts: dict[OpConfig, int] = {}
    for r in serving(op):
        counts[r.config] = counts.get(r.config, 0) + 1
    return tuple(sorted(counts.items(), key=lambda kv: kv[0].label()))


@dataclass(frozen=True)
class SaturatedSpan:
    """An operator that ran at capacity from ``start`` to ``end`` (wall-clock seconds) with ``configs``."""

    operator: str
    start: float
    end: float
    configs: tuple[tuple[OpConfig, int], ...]
    items: int
    measured: float          # items/s taken over the span
    bound: bool              # True: it finished nothing; ``measured`` is an upper bound

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def replicas(self) -> int:
        return sum(n for _, n in self.configs)

    def describe(self) -> str:
        what = f"at most {self.measured:.3g}" if self.bound else f"{self.measured:.3g}"
        return f"saturated for {self.seconds:.0f} s, it took {what} items/s on {self.replicas} replica(s)"


class OccupancyTracker:
    """Per operator, the current run of saturated snapshots.

    ``update(state, at)`` reports each operator that stayed ``SATURATED`` in every snapshot of the last
    ``saturation_s`` seconds or more with unchanged serving configs, with what it measurably took in that span
    (``measured`` items/s), the span reaching back (while saturated) until it took a batch per replica and each
    replica finished at least one batch. When it took less, ``measured`` is what it finished plus the items its
    replicas hold, over the span: an upper bound (``bound=True``). When it took more but a replica finished
    nothing (a straggler: a batch of a heavier workload, started before the span, holding its replica
    throughout), no span: the others' pace is not the operator's, and the straggler's cost shows only once it
    finishes.

    Why here and not in the samples: a ``BatchSample`` times the batch inside the replica; the time a saturated
    operator's replicas lose between batches (result hand-off, dispatch on a loaded runner) and a workload that
    changed under batches not finished yet show only in what the operator took while it never lacked work."""

    def __init__(self, saturation_s: float = 8.0, history: int = 256) -> None:
        if saturation_s <= 0:
            raise ValueError(f"OccupancyTracker: saturation_s must be > 0, got {saturation_s!r}")
        self.saturation_s = saturation_s
        self._history: deque[tuple[float, Any]] = deque(maxlen=history)

    def update(self, state: Any, at: float | None = None) -> dict[str, SaturatedSpan]:
        """Add a snapshot (taken at ``at``, default now) and return the operators saturated over the last ``saturation_s``."""
        at = time.time() if at is None else float(at)
        if self._history and [o.name for o in self._history[-1][1].operators] != [o.name for o in state.operators]:
            self._history.clear()   # another pipeline
        self._history.append((at, state))
        spans = {}
        for op in state.operators:
            span = self._span(op.name)
            if span is not None:
                spans[op.name] = span
        return spans

    def occupancy(self, operator: str) -> Occupancy | None:
        """The operator's occupancy in the newest snapshot (None before any)."""
        return classify(self._history[-1][1].operator(operator)) if self._history else None

    def _span(self, name: str) -> SaturatedSpan | None:
        at_end, newest = self._history[-1]
        op_end = newest.operator(name)
        if classify(op_end) is not Occupancy.SATURATED:
            return None
        configs = serving_configs(op_end)
        per_round = sum(c.batch_size * n for c, n in configs)   # one batch per replica
        finished = {r.replica_id: r.batches for r in serving(op_end)}
        start = None
        for at, state in reversed(self._history):
            op = state.operator(name)
            if classify(op) is not Occupancy.SATURATED or serving_configs(op) != configs:
                break
            start = (at, op)
            if at_end - at >= self.saturation_s and op_end.items_in - op.items_in >= per_round and _each_finished_since(op, finished):
                break
        if start is None or at_end - start[0] < self.saturation_s:
            return None
        dt = at_end - start[0]
        taken = op_end.items_in - start[1].items_in
        if taken >= per_round:
            if not _each_finished_since(start[1], finished):
                return None   # a straggler held a replica throughout (``OccupancyTracker``)
            return SaturatedSpan(name, start[0], at_end, configs, taken, taken / dt, False)
        # fewer than a batch per replica finished: a rate from a handful of batches is noise, but the
        # operator can have done no more than what it finished plus what it holds now
        held = sum(r.inflight * r.config.batch_size for r in serving(op_end))
        return SaturatedSpan(name, start[0], at_end, configs, taken, (taken + held) / dt, True)


def _each_finished_since(op: Any, finished: dict[str, int]) -> bool:
    """True when every replica of ``finished`` (replica id -> batches finished, now) finished a batch since ``op``."""
    before = {r.replica_id: r.batches for r in op.replicas}
    return all(n > before.get(rid, 0) for rid, n in finished.items())
