"""The simulator's clock for a ``loop.TickLoop``: ticks on simulated time, each decision charged to it.

Contract: ``SimClock(runner, tick_s, record_s, end, point, tick_charge_s=None, decide_s_per_cpu_s=1.0)``. ``wait()`` runs the
``SimRunner`` to the next tick, due ``tick_s`` simulated seconds after the previous one ended (after
its apply), appending ``point(last_done, last_t)`` to ``timeline`` every ``record_s`` seconds and
when the run finishes; it returns False once the run finished or reached ``end``. With ``tick_s``
None it never ticks: one ``wait()`` runs the simulation to its end. ``charge(cpu_s, wall_s)`` keeps
both in milliseconds (``tick_ms``, ``tick_wall_ms``) and runs the simulation on by the decision's CPU
seconds times ``decide_s_per_cpu_s`` (or the fixed ``tick_charge_s``): the pipeline streams on while the policy
decides. ``decide_s_per_cpu_s`` > 1 models a controller that shares its host's cores with the pipeline it drives.
``finish()`` appends the last point. ``now()`` is the runner's simulated time.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from trident_flows.sim.runner import SimRunner


class SimClock:
    """Simulated time for a ``TickLoop`` (see the module docstring)."""

    def __init__(self, runner: SimRunner, tick_s: float | None, record_s: float, end: float,
                 point: Callable[[SimRunner, int, float], dict[str, Any]], tick_charge_s: float | None = None,
                 decide_s_per_cpu_s: float = 1.0) -> None:
        self.runner = runner
        self.tick_s = tick_s
        self.record_s = record_s
        self.end = end
        self.point = point
        self.tick_charge_s = tick_charge_s
        self.decide_s_per_cpu_s = decide_s_per_cpu_s
        self.timeline: list[dict[str, Any]] = []
        self.tick_ms: list[float] = []
        self.tick_wall_ms: list[float] = []
        self._next_record = runner.now
        self._last_done, self._last_t = 0, runner.now

    def now(self) -> float:
        return self.runner.now

    def wait(self) -> bool:
        runner = self.runner
        next_tick = math.inf if self.tick_s is None else runner.now + self.tick_s
        while not runner.finished and runner.now < self.end:
            runner.run_until(min(self.end, next_tick, self._next_record))
            if runner.now >= self._next_record or runner.finished:
                self._record()
                self._next_record = runner.now + self.record_s
            if not runner.finished and runner.now >= next_tick:
                return True
        return False

    def charge(self, cpu_s: float, wall_s: float) -> None:
        self.tick_ms.append(cpu_s * 1e3)
        self.tick_wall_ms.append(wall_s * 1e3)
        charged = cpu_s * self.decide_s_per_cpu_s if self.tick_charge_s is None else self.tick_charge_s
        self.runner.run_until(self.runner.now + charged)

    def finish(self) -> None:
        self._record()

    def _record(self) -> None:
        self.timeline.append(self.point(self.runner, self._last_done, self._last_t))
        self._last_done, self._last_t = self.runner.inputs_done, self.runner.now
