"""Regimes of the Trident policy: each operator's regime detector, the regime memory and the regime clock.

Contract:
- ``observe(state, new, events)`` feeds each operator's detector its new samples' residuals (at
  most ``detector_samples`` a tick) and reports each change as an event. Every change drops the
  model's calibration; a features change re-arms the evidence gate, makes the model due a refit
  and restarts the regime clock; a residual change cuts the window at the change point; a change to
  a regime seen before serves its remembered model (``RegimeMemory``) at once. Regimes the detector
  merges (a mixed workload) are reported as a note, and change nothing else. Every fit is
  remembered under its regime with the optimiser's best config.
- ``expected_s(state, throughput)``: seconds a change made now can pay off: the current regime's
  expected remaining time (from the past regimes that outlasted it so far, never falling to 0
  while it goes on; before any ended, ``regime_duration_s`` or as long again as it has lasted),
  capped by the time the input items left take at ``throughput``.
- State: ``memory``, ``started`` (runner ``wall_s``), ``lengths`` and ``ends``.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from trident_flows.core.state import RunnerState
from trident_flows.core.types import BatchSample
from trident_flows.scheduler.decision_log import EventKind, TickEvent
from trident_flows.scheduler.regime_change import ChangeKind
from trident_flows.scheduler.regime_memory import RegimeMemory
from trident_flows.scheduler.throughput_measure import remaining_input_items
from trident_flows.scheduler.trident.context import Context
from trident_flows.scheduler.trident.gate import EvidenceGate
from trident_flows.scheduler.trident.operators import Operator, Operators
from trident_flows.scheduler.trident.search import ConfigSearch
from trident_flows.scheduler.trident_settings import RegimeSettings


class Regimes:
    """Regime detection, memory and clock (see the module docstring)."""

    def __init__(self, settings: RegimeSettings, ctx: Context, ops: Operators, gate: EvidenceGate, search: ConfigSearch) -> None:
        self.settings = settings
        self.ctx = ctx
        self.ops = ops
        self.gate = gate
        self.search = search
        self.memory = RegimeMemory()
        self.started: dict[str, float] = {}
        self.lengths: list[float] = []  # every operator's ended regimes, so one pipeline change is there once per operator
        self.ends = 0  # ticks in which one or more operators' regimes ended

    def observe(self, state: RunnerState, new: dict[str, list[BatchSample]], events: list[TickEvent]) -> None:
        ended = len(self.lengths)
        for name, batch in new.items():
            op = self.ops[name]
            replicas = max(1, sum(state.operator(name).configs().values()))
            # the detector scores residuals under a snapshot of the model that it swaps only while the
            # test is calm: residuals of a model refitted every tick would jump between fits.
            picked = evenly(len(batch), self.settings.detector_samples)
            op.read.extend(op.fed - len(batch) + i for i in picked)
            merged = len(op.detector.merges)
            changes = op.detector.observe_many([batch[i] for i in picked], op.model, replicas)
            for part, whole in op.detector.merges[merged:]:
                events.append(TickEvent(EventKind.NOTE, name, f"regimes {part} and {whole} kept ending within {op.detector.flap_samples} "
                                        f"samples or {op.detector.flap_s:g} s: one mixed workload, regime {whole}, from now on"))
            for change in changes:
                if change is None:
                    if op.detector.current is not None and name not in self.started:
                        self.started[name] = state.wall_s
                    continue
                kind = EventKind.REGIME_CHANGE if change.kind == ChangeKind.FEATURES else EventKind.RESIDUAL_CHANGE
                op.model.forget_calibration()  # a saturated span of the old regime measured another workload
                if change.kind == ChangeKind.FEATURES:  # the evidence gate re-arms here and downstream
                    self.gate.rearm_from(state, name, first_new_sample=window_seq(op, change.change_point))
                    op.workload_moved = True  # the others refit when their own detectors see the new items
                events.append(TickEvent(kind, name, f"regime {change.old} -> {change.new} ({change.kind.value}): {change.reason}"))
                if change.kind == ChangeKind.FEATURES:
                    # a residual shift keeps the workload, so the regime's clock runs on
                    started = self.started.get(name)
                    if started is not None:
                        self.lengths.append(max(0.0, state.wall_s - started))
                    self.started[name] = state.wall_s
                if change.kind == ChangeKind.RESIDUAL:
                    # same workload, new behaviour: only samples since the change point describe it
                    first = window_seq(op, change.change_point)
                    keep = [(seq, x) for seq, x in op.window if seq >= first]
                    op.window = deque(keep, maxlen=self.ops.window_size)
                    op.fitted_epoch = None  # refit on the kept samples at the next ones
                    events.append(TickEvent(EventKind.NOTE, name, f"dropped samples before the change point; refit on {len(keep)}"))
                    continue
                record = self.memory.visit(change.new, name) if change.recurring else None
                if record is not None and record.model is not None:
                    op.model = record.model.snapshot()
                    op.model.forget_calibration()
                    op.restored = True
                    op.model_version += 1
                    events.append(TickEvent(EventKind.REMEMBERED_REGIME, name, f"regime {change.new} seen before: serving its remembered model"
                                  + (f" and best config {record.best_config.label()}" if record.best_config else "")))
        self.ends += int(len(self.lengths) > ended)
        for name, op in self.ops.items():
            # once per fit and regime: the optimiser's best() refits its memory model after new
            # measurements (~20 ms), and calling it for every operator on every tick cost more than the fits
            if op.model.ready and op.detector.current is not None and not _same_fit(op.remembered, op.detector.current, op.model.report):
                best = self.search.optimizer(name).best() if self.search.space(name) is not None else None
                self.memory.remember(op.detector.current, name, model=op.model, best_config=best)
                op.remembered = (op.detector.current, op.model.report)

    def expected_s(self, state: RunnerState, throughput: float) -> float:
        started = [t for t in self.started.values()]
        elapsed = max(0.0, state.wall_s - max(started)) if started else state.wall_s
        if self.lengths:
            longer = [x - elapsed for x in self.lengths if x > elapsed]
            per_regime = len(self.lengths) / max(1, self.ends)  # operators that recorded each regime's end
            counted = (sum(longer) + per_regime * max(elapsed, 1.0)) / (len(longer) + per_regime)
            expected = max(sum(longer) / len(longer), counted) if longer else counted
        else:
            prior = self.settings.duration_s - elapsed if self.settings.duration_s is not None else 0.0
            expected = max(prior, elapsed, 1.0)
        left = remaining_input_items(state, getattr(self.ctx.spec, "items", None))
        if left is not None and throughput > 0:
            expected = min(expected, left / throughput)
        return max(expected, 0.0)


def evenly(n: int, most: int) -> list[int]:
    """Indices of at most ``most`` of ``n`` items, evenly spaced, the first and the last among them."""
    if n <= most:
        return list(range(n))
    step = (n - 1) / (most - 1)   # > 1, so the rounded indices are distinct
    return [round(k * step) for k in range(most)]


def window_seq(op: Operator, detector_sample: int) -> int:
    """The window sequence number of the ``detector_sample``-th sample given to ``op``'s detector (the
    oldest one remembered when it lies further back than ``DETECTOR_LOOKBACK``)."""
    first = op.detector.n - len(op.read)
    return op.read[min(len(op.read) - 1, max(0, detector_sample - first))] if op.read else op.fed


def _same_fit(remembered: tuple | None, regime: int, report: Any) -> bool:
    return remembered is not None and remembered[0] == regime and remembered[1] is report
