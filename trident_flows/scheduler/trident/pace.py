"""The measured pace of the pipeline, tick by tick: what each operator and the whole pipeline got through.

Contract:
- ``Pace(spec)`` keeps the runner states of the last ticks (``history``, oldest first), the
  end-to-end throughputs of the last ticks (``recent``: input items the whole pipeline finished per
  second, ``throughput_measure.sustainable_throughput``; the verifier's baseline) and the input items/s
  the first operator took over them (the intake).
- A tick calls ``start_tick(state)`` first: it returns each operator's items in per second since the
  last tick (since the start on the first) and the end-to-end throughput since the last tick (0.0 on
  the first), and counts the intake. ``count(throughput)`` adds the end-to-end throughput to
  ``recent`` once the verifier has compared with the ticks before; ``forget_baseline()`` empties
  ``recent`` (the throughput before a regime change is no baseline for a plan made after it);
  ``end_tick(state)`` keeps the state as the last tick's.
- ``completion_rate()``: items/s the pipeline gets through, the larger of the median intake and the
  median end-to-end throughput (once the input is all read the intake is 0); 0.0 before either.
  ``run_left_s(state)``: seconds the input items not yet completed take at that rate; None for an
  input of unknown size or before any rate is measured.
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
