"""The simulated clock: a time-ordered event queue.

Contract: ``EventQueue.at(t, fn, *args)`` schedules ``fn(*args)`` at simulated second ``t``
(never before ``now``); ``run_until(t)`` runs every event due at or before ``t`` in time
order (ties in scheduling order) and leaves ``now == t``; ``step()`` runs the next event.
An event may schedule others. Nothing here knows about pipelines.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any, Callable


class EventQueue:
    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., Any], tuple[Any, ...]]] = []
        self._seq = itertools.count()
        self.events_run = 0

    def at(self, t: float, fn: Callable[..., Any], *args: Any) -> None:
        heapq.heappush(self._heap, (max(t, self.now), next(self._seq), fn, args))

    def after(self, delay_s: float, fn: Callable[..., Any], *args: Any) -> None:
        self.at(self.now + max(0.0, delay_s), fn, *args)

    def next_time(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def step(self) -> bool:
        """Run the next event; False when none is left."""
        if not self._heap:
            return False
        t, _, fn, args = heapq.heappop(self._heap)
        self.now = t
        self.events_run += 1
        fn(*args)
        return True

    def run_until(self, t: float, stop: Callable[[], bool] | None = None) -> None:
        """Run events due by ``t`` (or until ``stop()`` is true after an event), then set ``now = t``
        unless stopped early."""
        heap = self._heap
        if stop is not None and stop():
            return
        pop = heapq.heappop
        while heap and heap[0][0] <= t:  # step() inlined: this loop runs millions of times in an hours-long run
            when, _, fn, args = pop(heap)
            self.now = when
            self.events_run += 1
            fn(*args)
            if stop is not None and stop():
                return
        self.now = max(self.now, t)
