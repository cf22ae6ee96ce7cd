"""Models of the Trident policy: each operator's samples into its window, its model refitted and calibrated.

Contract:
- ``observe(state, samples, tick)`` keeps the samples of the operators the runner names, by
  operator (adding an ``Operator`` for each), feeds their sliding windows and refits: at once after
  ``refit_min_samples`` new samples when the config epoch changed, the window was cut or the
  workload moved; else on a schedule (``refit_fraction``, ``refit_ticks``) spread over ticks. A
  failed fit keeps the previous one and raises ``RuntimeError`` naming the operators.
- ``calibrate(state, samples)``: an operator saturated for ``saturation_s`` calibrates its model
  with what it took then (``OccupancyTracker``), so reported capacities are measurable.
- ``fit_all(state, tick)`` refits every operator with new samples now (the run ended); returns the
  failures. ``is_stale(name)``: the calibration says the model over-predicts by more than
  ``stale_ratio``. ``calibration_step(model)``: the calibration in 10% (log) steps, or None.
"""

from __future__ import annotations

import math
from typing import Sequence

from trident_flows.core.state import RunnerState
from trident_flows.core.types import BatchSample
from trident_flows.scheduler.occupancy import OccupancyTracker
from trident_flows.scheduler.operator_model import OperatorModel
from trident_flows.scheduler.trident.operators import Operator, Operators
from trident_flows.scheduler.trident_settings import ModelSettings


class Models:
    """Sample windows, refits and calibrations of every operator's model (see the module docstring)."""

    def __init__(self, settings: ModelSettings, ops: Operators) -> None:
        self.settings = settings
        self.ops = ops
        self._occupancy = OccupancyTracker(settings.saturation_s)
        self._clock_origin: float | None = None  # the runner's wall_s = 0 on the samples' clock

    def observe(self, state: RunnerState, samples: Sequence[BatchSample], tick: int) -> dict[str, list[BatchSample]]:
        known = {op.name for op in state.operators}
        new: dict[str, list[BatchSample]] = {}
        for s in samples:
            if isinstance(s, BatchSample) and s.operator in known and s.items_in >= 1:
                new.setdefault(s.operator, []).append(s)
        for op_state in state.operators:  # in pipeline order: the parts iterate the operators in this order
            self.ops.ensure(op_state.name)
        failed = []
        routine = []   # refits of unchanged workloads (module docstring)
        for name, batch in new.items():
            op = self.ops[name]
            # op.fed = the sample's index in the regime detector; only the batch's last samples stay in the
            # bounded window, so only they are added (a 256-node tick brings thousands per operator)
            kept = batch[-op.window.maxlen:] if op.window.maxlen is not None else batch
            first = op.fed + len(batch) - len(kept)
            op.window.extend(zip(range(first, first + len(kept)), kept))
            op.fed += len(batch)
            op.unfitted += len(batch)
            if op.restored:
                op.restored = False  # the remembered model serves this tick; refit from the next one
                continue
            epoch = state.operator(name).config_epoch
            due = not op.model.ready or op.fitted_epoch != epoch or op.workload_moved
            need = self.settings.refit_min_samples if due else max(self.settings.refit_min_samples, math.ceil(self.settings.refit_fraction * op.fitted_on))
            if op.unfitted < need or (not due and tick - op.fitted_tick < self.settings.refit_ticks):
                continue
            if due:
                self._refit(op, epoch, tick, failed)
            else:
                routine.append((op.fitted_tick, name, epoch))
        for _, name, epoch in sorted(routine)[:math.ceil(len(self.ops) / self.settings.refit_ticks)]:
            self._refit(self.ops[name], epoch, tick, failed)
        if failed:
            raise RuntimeError("model fit failed for " + "; ".join(failed))
        return new

    def fit_all(self, state: RunnerState, tick: int) -> list[str]:
        failed: list[str] = []
        for op_state in state.operators:
            op = self.ops.get(op_state.name)
            if op is not None and op.window and (op.unfitted > 0 or not op.model.ready):
                self._refit(op, op_state.config_epoch, tick, failed)
        return failed

    def _refit(self, op: Operator, epoch: int, tick: int, failed: list[str]) -> None:
        try:
            op.model.fit([s for _, s in op.window], current_epoch=epoch)
            op.unfitted, op.fitted_epoch, op.fitted_on, op.workload_moved = 0, epoch, len(op.window), False
            op.fitted_tick = tick
            op.model_version += 1
        except Exception as exc:  # noqa: BLE001 - keep the previous fit of this operator
            failed.append(f"{op.name}: {type(exc).__name__}: {exc}")

    def calibrate(self, state: RunnerState, samples: Sequence[BatchSample]) -> None:
        ends = [s.end for s in samples if isinstance(s, BatchSample)]
        if ends:  # a sample ended before the snapshot was taken: the origin is at least this
            origin = max(ends) - state.wall_s
            self._clock_origin = origin if self._clock_origin is None else max(self._clock_origin, origin)
        if self._clock_origin is None:
            return
        for name, span in self._occupancy.update(state, state.wall_s + self._clock_origin).items():
            if name in self.ops:
                self.ops[name].model.calibrate(span)

    def is_stale(self, name: str) -> bool:
        calibration = self.ops[name].model.calibration
        return calibration is not None and calibration.factor * self.settings.stale_ratio < 1.0


def calibration_step(model: OperatorModel) -> int | None:
    return None if model.calibration is None else round(math.log(model.calibration.factor) / math.log(1.1))
