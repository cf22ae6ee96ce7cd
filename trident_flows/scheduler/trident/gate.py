"""The evidence gate of the Trident policy: no placement before every operator has measured the workload.

Contract:
- ``passed(state)``: every operator has a fitted model, ``min_samples`` samples and
  ``min_config_samples`` since its workload last changed (``SLOW_EVIDENCE_SAMPLES`` once
  ``evidence_max_s`` passed); an operator with no work left does not hold it once fitted.
  ``short_of_evidence(state)`` / ``waiting_reason(state)`` name the operators it waits for.
- ``rearm_from(state, name, first_new_sample=None)`` re-arms the gate at ``name`` and every
  operator downstream (the new items reach those next); with ``first_new_sample`` (``name``'s own
  detector found it) the samples from there count as evidence.
- ``arm_on_stale(state, events)``: a stale model (``Models.is_stale``) re-arms the gate as a regime
  change would and is due a refit; ``stale`` names them.
- ``changed_wall(name)``: the runner's ``wall_s`` at the operator's last workload change (-inf: none).
"""

from __future__ import annotations

import math

from trident_flows.core.state import RunnerState
from trident_flows.scheduler.decision_log import EventKind, TickEvent
from trident_flows.scheduler.trident.models import Models
from trident_flows.scheduler.trident.operators import Operators
from trident_flows.scheduler.trident_settings import GateSettings

# Samples since a workload change that the evidence gate takes once ``evidence_max_s`` has passed.
SLOW_EVIDENCE_SAMPLES = 2


class EvidenceGate:
    """Per operator, the samples and the time since its workload last changed (see the module docstring)."""

    def __init__(self, settings: GateSettings, ops: Operators, models: Models) -> None:
        self.settings = settings
        self.ops = ops
        self.models = models
        self._changed_at: dict[str, int] = {}  # each operator's sample count at the last workload change
        self._changed_wall: dict[str, float] = {}  # the runner's wall_s at each operator's last workload change
        self._announced: set[str] = set()  # operators re-armed by a change upstream that their own detector has not seen yet
        self.stale: set[str] = set()  # operators whose model is stale (``arm_on_stale``)

    def passed(self, state: RunnerState) -> bool:
        return bool(self.ops) and not self.short_of_evidence(state)

    def short_of_evidence(self, state: RunnerState) -> list[str]:
        short = []
        done = done_operators(state)
        for name, o in sorted(self.ops.items()):
            if name in done and o.model.ready:
                continue
            since = o.fed - self._changed_at.get(name, 0)
            waited = state.wall_s - self._changed_wall.get(name, -math.inf)
            enough = since >= self.settings.min_config_samples or (since >= SLOW_EVIDENCE_SAMPLES and waited >= self.settings.evidence_max_s)
            if not o.model.ready or len(o.window) < self.settings.min_samples or not enough:
                short.append(f"{name} ({len(o.window)}, {since} since the change)")
        return short

    def waiting_reason(self, state: RunnerState) -> str:
        return (f"waiting for samples: the evidence gate needs a fitted model and {self.settings.min_samples} samples per operator, "
                f"{self.settings.min_config_samples} of them since the workload last changed; short: {', '.join(self.short_of_evidence(state)) or 'every operator'}")

    def changed_wall(self, name: str) -> float:
        return self._changed_wall.get(name, -math.inf)

    def arm_on_stale(self, state: RunnerState, events: list[TickEvent]) -> None:
        for op_state in state.operators:
            op = self.ops.get(op_state.name)
            if op is None or not op.model.ready:
                continue
            stale = self.models.is_stale(op_state.name)
            if stale and op_state.name not in self.stale:
                self.rearm_from(state, op_state.name)
                op.workload_moved = True
                events.append(TickEvent(EventKind.NOTE, op_state.name, "model stale (saturated, capacity under its prediction): "
                                        "the evidence gate waits for samples of the new workload"))
                self.stale.add(op_state.name)
            elif not stale:
                self.stale.discard(op_state.name)

    def rearm_from(self, state: RunnerState, name: str, first_new_sample: int | None = None) -> None:
        names = [op.name for op in state.operators]
        start = names.index(name) if name in names else 0
        for n in names[start:]:
            if n not in self.ops:
                continue
            if n == name and first_new_sample is not None:
                self._changed_at[n] = min(first_new_sample, self.ops[n].fed)
                if n not in self._announced:
                    self._changed_wall[n] = state.wall_s
                self._announced.discard(n)
                continue
            self._changed_at[n] = self.ops[n].fed
            if n != name and n in self._announced:
                continue  # the workload's first announcement here starts the clock
            self._changed_wall[n] = state.wall_s
            if n != name:
                self._announced.add(n)
            else:
                self._announced.discard(n)


def done_operators(state: RunnerState) -> frozenset[str]:
    """Operators that will receive no more work: the input is closed and nothing is queued or in
    flight at them or at any operator upstream."""
    if not state.input_closed:
        return frozenset()
    done: list[str] = []
    for op in state.operators:
        if op.queue_items > 0 or any(r.inflight > 0 for r in op.replicas):
            break
        done.append(op.name)
    return frozenset(done)
