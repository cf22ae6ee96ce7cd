"""When a ``TickLoop`` ticks, and what its ticks are timed in.

Contract: a clock has ``now()`` (the time a decision is recorded at), ``wait()`` (returns once the
next tick is due: True to tick, False to stop) and ``charge(cpu_s, wall_s)`` (told what deciding
took: a simulated clock advances by it, a wall clock has already spent it). ``WallClock(tick_s)``
is wall time: ``wait()`` sleeps ``tick_s`` seconds and returns False once ``stop()`` was called (at
once, when called during the wait). The simulator's clock is ``sim.tick_clock.SimClock``; the
Prefect sidecar calls ``TickLoop.tick()`` once per flow tick and uses a ``WallClock`` for its time.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...

    def wait(self) -> bool: ...

    def charge(self, cpu_s: float, wall_s: float) -> None: ...


class WallClock:
    """Wall time, a tick every ``tick_s`` seconds until ``stop()`` (see the module docstring)."""

    def __init__(self, tick_s: float = 2.0) -> None:
        if tick_s <= 0:
            raise ValueError(f"tick_s must be > 0, got {tick_s}")
        self.tick_s = tick_s
        self._stop = threading.Event()

    def now(self) -> float:
        return time.time()

    def wait(self) -> bool:
        return not self._stop.wait(self.tick_s)

    def charge(self, cpu_s: float, wall_s: float) -> None:
        """Nothing to do: the decision already took its time."""

    def stop(self) -> None:
        self._stop.set()
