"""A tick's steps, each run guarded.

Contract: ``GuardedSteps.run(name, fn)`` calls ``fn()`` and returns its result; an exception is
recorded in ``errors`` as "name: Type: message" and the step returns None (the caller keeps the
current plan); every step's milliseconds, failed or not, go to ``timings`` under ``name``. The
Trident policy makes one per tick and copies both into the tick's record.
"""

from __future__ import annotations

import time
from typing import Any, Callable


class GuardedSteps:
    """A tick's steps, each run guarded: an exception is recorded in ``errors`` and the step returns
    None (the current plan stays); each step's milliseconds go to ``timings``."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self.errors: list[str] = []

    def run(self, name: str, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - a failed step is recorded; the current plan stays
            self.errors.append(f"{name}: {type(exc).__name__}: {exc}")
            return None
        finally:
            self.timings[name] = (time.perf_counter() - t0) * 1e3
