"""The measured pace of the pipeline, tick by tick: what each operator and the whole pipeline got through.

Contract:
- ``Pace(spec)`` keeps the last ticks' runner states (``history``), end-to-end throughputs
  (``recent``: the verifier's baseline) and the first operator's intake.
- ``start_tick(state)`` (first in a tick) returns each operator's items in per second and the
  end-to-end throughput since the last tick (0.0 on the first); ``count(throughput)`` adds it to
  ``recent`` after verification; ``forget_baseline()`` empties ``recent`` (a regime change);
  ``end_tick(state)`` keeps the state.
- ``completion_rate()``: the larger of the median intake and median throughput (0.0 before
  either); ``run_left_s(state)``: seconds the items not yet completed take at it (None when the
  input's size or any rate is unknown).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from trident_flows.core.state import RunnerState
from trident_flows.scheduler.throughput_measure import remaining_input_items, sustainable_throughput
from trident_flows.scheduler.trident.operators import upper_median

HISTORY = 30   # runner states kept (the placement's work per item reads them)
RECENT = 8     # ticks of end-to-end throughput and intake kept


class Pace:
    """Per-operator and end-to-end rates of the last ticks (see the module docstring)."""

    def __init__(self, spec: Any | None) -> None:
        self.spec = spec
        self.history: deque[RunnerState] = deque(maxlen=HISTORY)  # earlier ticks' states, oldest first
        self.recent: deque[float] = deque(maxlen=RECENT)  # completed input items/s of the last ticks (verification's baseline)
        self.intake: deque[float] = deque(maxlen=RECENT)  # input items/s the first operator took over the last ticks

    def start_tick(self, state: RunnerState) -> tuple[dict[str, float], float]:
        measured = self.measure(state)
        prev = self.history[-1] if self.history else None
        pipeline_t = sustainable_throughput(prev, state) if prev is not None and state.wall_s > prev.wall_s else 0.0
        if prev is not None:
            self.intake.append(next(iter(measured.values()), 0.0))
        return measured, pipeline_t

    def count(self, pipeline_t: float) -> None:
        if self.history:  # not on the first tick: it measured no interval
            self.recent.append(pipeline_t)

    def forget_baseline(self) -> None:
        self.recent.clear()

    def end_tick(self, state: RunnerState) -> None:
        self.history.append(state)

    def measure(self, state: RunnerState) -> dict[str, float]:
        """Items/s each operator completed since the last tick (since the start on the first)."""
        prev = self.history[-1] if self.history else None
        out = {}
        for k, op in enumerate(state.operators):
            if prev is not None and len(prev.operators) == len(state.operators) and state.wall_s > prev.wall_s:
                out[op.name] = (op.items_in - prev.operators[k].items_in) / (state.wall_s - prev.wall_s)
            else:
                out[op.name] = op.items_in / state.wall_s if state.wall_s > 0 else 0.0
        return out

    def completion_rate(self) -> float:
        return max(upper_median(self.intake), upper_median(self.recent))

    def run_left_s(self, state: RunnerState) -> float | None:
        left = remaining_input_items(state, getattr(self.spec, "items", None))
        rate = self.completion_rate()
        return left / rate if left is not None and rate > 0 else None
