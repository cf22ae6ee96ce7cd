"""Batch size as in-flight depth: an operator's batch raised while a stretch of its expensive items holds the
replicas its cheap items need.

A stretch of E items that are expensive for an operator makes E/B batches at batch size B. Once those outnumber
the replicas the other items leave free, the stretch holds them, the items behind it (cheap here) wait, and the
operators after it starve. A per-replica cost model cannot see this: per item, batch 8 and batch 32 cost an
operator the same. A larger batch puts the same stretch on fewer replicas.

Contract:
- ``observe(state, samples)``: per operator, an ok batch whose seconds per item exceed ``EXPENSIVE`` x the median of
  its last ``WINDOW`` batches (before the tick) is expensive. For each expensive batch, the expensive batches of its
  batch size running when it started (itself included) are counted; ``peak(name, batch_size)`` is the most counted
  over the last ``PEAK_S`` seconds among those that started while the operators after it starved (no item queued
  at any of them at the tick before: a stretch that keeps them busy too blocks nothing).
- ``cheap_replicas(state, name)``: the replicas its other batches need at the pipeline's input rate (their mean
  seconds per item x items per second reaching the operator).
- ``batch(state, name, config)``: ``config``'s batch doubled when, at that batch, expensive batches held every
  replica the cheap items leave (``peak`` >= the operator's running replicas less ``cheap_replicas``), the double
  is within its config space and memory-safe; else its own batch (and at least ``floor``). Only on the CPU (on an
  accelerator the batch sets the cost per item and the memory: the optimiser's choice), with at least
  ``MIN_REPLICAS`` replicas, and where the cheap items leave ``MIN_FREE_SHARE`` of them free (an operator with
  less is a bottleneck, not a blockage: the placement's to grow).
- ``plan(state)``: a ``BATCH_DEPTH`` rollout that resizes the running groups ``batch`` raises (no replica starts or
  stops); None when none. Each batch it issues becomes the operator's ``floor``; it never lowers a batch, but
  once the input is closed (the source read every item) it resizes each raised group back to the batch it had
  before, once, and raises nothing more: the items left then spread over every replica instead of waiting in a
  few large batches at the run's end.
- ``too_small(name, config)``: a CPU config below the operator's floor; the placement, the regime plans and
  pre-positioning offer no such config but a running one, so no plan moves an operator back below its depth.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

from trident_flows.core.state import RunnerState
from trident_flows.core.types import CPU, BatchSample, ConfigSpace, OpConfig, OperatorPlan, Outcome, Plan, PlanKind, Rationale
from trident_flows.scheduler.replicas import replica_groups

EXPENSIVE = 4.0  # a batch is expensive at this many times the median seconds per item
WINDOW = 4096  # batches the median and the cheap batches' mean are taken over
MIN_BATCHES = 64  # batches seen before any is judged expensive
PEAK_S = 600.0  # seconds over which the most expensive batches running at once is kept
MIN_REPLICAS = 16  # replicas an operator runs before its batch is raised
MIN_FREE_SHARE = 0.5  # share of its replicas an operator's cheap items must leave free before its batch is raised


@dataclass
class _Expensive:
    """An expensive batch's run time, its batch size and the expensive batches of that size running when it started."""

    start: float
    end: float
    size: int
    starved: bool  # whether the operators after this one had nothing queued when it started
    at_start: int = 1


class _Operator:
    """One operator's recent batches: seconds per item, and the expensive ones running at once."""

    def __init__(self) -> None:
        self.per_item: deque[tuple[float, int, bool]] = deque(maxlen=WINDOW)  # (seconds per item, items, expensive)
        self.running: list[_Expensive] = []  # expensive batches that may still overlap ones not seen yet
        self.counts: deque[_Expensive] = deque()  # the expensive batches of the last PEAK_S seconds, oldest first
        self.ticks: list[float] = []  # the batch clock at each recent tick, and whether the operators after it starved then
        self.starved: list[bool] = []

    def tick(self, now: float, starved: bool) -> None:
        """The tick at ``now`` on the batch clock; ticks no batch still to come can start at are dropped."""
        self.ticks.append(now)
        self.starved.append(starved)
        longest = max((e.end - e.start for e in self.running), default=0.0)
        old = bisect.bisect_right(self.ticks, now - PEAK_S - longest) - 1
        if old > 0:
            del self.ticks[:old], self.starved[:old]

    def observe(self, batches: Sequence[BatchSample]) -> None:
        """One tick's batches, judged against the median before them."""
        median = statistics.median(c for c, _, _ in self.per_item) if len(self.per_item) >= MIN_BATCHES else None
        for batch in sorted(batches, key=lambda b: b.start):
            cost = max(0.0, batch.busy_s) / batch.items_in
            expensive = median is not None and cost > EXPENSIVE * median
            self.per_item.append((cost, batch.items_in, expensive))
            if expensive:
                self._count(_Expensive(batch.start, batch.end, batch.config.batch_size, self._starved_at(batch.start)))
        latest = max((b.start for b in batches), default=-math.inf)
        longest = max((e.end - e.start for e in self.running), default=0.0)
        self.running = [e for e in self.running if e.end > latest - longest]
        while self.counts and self.counts[0].start < latest - PEAK_S:
            self.counts.popleft()

    def _starved_at(self, t: float) -> bool:
        """Whether the operators after this one starved at the last tick at or before ``t`` (False before any)."""
        k = bisect.bisect_right(self.ticks, t) - 1
        return k >= 0 and self.starved[k]

    def _count(self, new: _Expensive) -> None:
        """Each batch counts the batches of its size running when it started, whichever arrived first."""
        for old in self.running:
            if old.size == new.size:
                if old.start <= new.start < old.end:
                    new.at_start += 1
                if new.start <= old.start < new.end:
                    old.at_start += 1
        self.running.append(new)
        self.counts.append(new)

    def peak(self, batch_size: int) -> int:
        return max((e.at_start for e in self.counts if e.size == batch_size and e.starved), default=0)

    def cheap_s(self) -> float:
        """Mean seconds per item of the recent batches that were not expensive."""
        cheap = [(c, n) for c, n, expensive in self.per_item if not expensive]
        items = sum(n for _, n in cheap)
        return sum(c * n for c, n in cheap) / items if items else 0.0


class BatchDepth:
    """Each operator's expensive batches in flight and the batch they call for (see the module docstring)."""

    def __init__(self, space: Callable[[str], ConfigSpace | None], unsafe: Callable[[str, OpConfig], str | None],
                 rate: Callable[[], float], work: Callable[[RunnerState], dict[str, float]]) -> None:
        """``space``: an operator's config space; ``unsafe``: why a config is not memory-safe (None: safe); ``rate``: the
        pipeline's input items/s; ``work``: each operator's items per input item."""
        self._space = space
        self._unsafe = unsafe
        self._rate = rate
        self._work = work
        self._ops: dict[str, _Operator] = {}
        self.floor: dict[str, int] = {}
        self._before: dict[str, int] = {}  # each raised operator's batch before its first raise

    def observe(self, state: RunnerState, samples: Sequence[BatchSample]) -> None:
        by_operator: dict[str, list[BatchSample]] = {}
        for batch in samples:
            if batch.outcome == Outcome.OK and batch.items_in > 0:
                by_operator.setdefault(batch.operator, []).append(batch)
        for name, batches in by_operator.items():
            self._ops.setdefault(name, _Operator()).observe(batches)
        if samples:  # the tick's moment on the batches' clock: its newest batch's end
            now = max(b.end for b in samples)
            for k, op in enumerate(state.operators):
                if op.name in self._ops:
                    after = state.operators[k + 1:]
                    self._ops[op.name].tick(now, bool(after) and all(a.queue_items == 0 for a in after))

    def peak(self, name: str, batch_size: int) -> int:
        return self._ops[name].peak(batch_size) if name in self._ops else 0

    def cheap_replicas(self, state: RunnerState, name: str) -> int:
        if name not in self._ops:
            return 0
        return math.ceil(self._rate() * self._work(state).get(name, 1.0) * self._ops[name].cheap_s() - 1e-9)

    def batch(self, state: RunnerState, name: str, config: OpConfig) -> int:
        own = self._own(name, config)
        raised = self._raised(state, name, config)
        return max(own, raised[0]) if raised is not None else own

    def _own(self, name: str, config: OpConfig) -> int:
        """``config``'s batch, at least the operator's floor on the CPU."""
        return max(config.batch_size, self.floor.get(name, 1)) if config.device == CPU else config.batch_size

    def _raised(self, state: RunnerState, name: str, config: OpConfig) -> tuple[int, str] | None:
        """``config``'s batch doubled, and the figures that call for it, where ``batch`` (the module docstring) raises it;
        else None."""
        space = self._space(name)
        replicas = sum(state.operator(name).configs().values())
        if config.device != CPU or space is None or replicas < MIN_REPLICAS or state.input_closed:
            return None
        cheap, peak = self.cheap_replicas(state, name), self.peak(name, config.batch_size)
        free, double = replicas - cheap, config.batch_size * 2
        if free < MIN_FREE_SHARE * replicas or peak < free or double > space.batch_size_max or self._unsafe(name, config.with_changes(batch_size=double)):
            return None
        return double, f"{peak} of its batches held replicas at once, where its other items need {cheap} of {replicas}"

    def too_small(self, name: str, config: OpConfig) -> bool:
        return config.device == CPU and config.batch_size < self.floor.get(name, 1)

    def plan(self, state: RunnerState) -> Plan | None:
        if state.input_closed:
            return self._back(state)
        ops = []
        for op_state in state.operators:
            name, groups, moved = op_state.name, {}, []
            for config, n in op_state.configs().items():
                own = self._own(name, config)
                raised = self._raised(state, name, config)
                size = max(own, raised[0]) if raised is not None else own
                if size != config.batch_size:
                    moved.append(f"{config.label()} -> b{size}: {raised[1] if raised is not None else f'its depth is b{own}'}")
                    config = config.with_changes(batch_size=size)
                groups[config] = groups.get(config, 0) + n
            if not moved:
                continue
            self._before.setdefault(name, min(c.batch_size for c in op_state.configs() if c.device == CPU))
            self.floor[name] = max(c.batch_size for c in groups if c.device == CPU)
            ops.append(OperatorPlan(name, replica_groups(groups),
                                    f"{name}: a stretch of expensive items held the replicas its other items need ({'; '.join(moved)})"))
        if not ops:
            return None
        reason = "batch size as in-flight depth: " + "; ".join(o.reason for o in ops)
        return Plan(tuple(ops), 0.0, reason, Rationale(PlanKind.BATCH_DEPTH))

    def _back(self, state: RunnerState) -> Plan | None:
        """The raised operators' groups resized back to their batch before, once the input is closed."""
        ops = []
        for name, before in sorted(self._before.items()):
            configs = state.operator(name).configs()
            groups: dict[OpConfig, int] = {}
            for config, n in configs.items():
                back = config.with_changes(batch_size=before) if config.device == CPU and config.batch_size > before else config
                groups[back] = groups.get(back, 0) + n
            if groups != configs:
                ops.append(OperatorPlan(name, replica_groups(groups),
                                        f"{name}: back to batch {before}, so the items left spread over all its replicas"))
        self._before.clear()
        self.floor.clear()
        if not ops:
            return None
        return Plan(tuple(ops), 0.0, "batch size as in-flight depth: the source has read every item; " + "; ".join(o.reason for o in ops),
                    Rationale(PlanKind.BATCH_DEPTH))
