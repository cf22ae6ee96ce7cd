"""What an operator's models report and predict.

Contract:
- ``Prediction(mean, std)``: a prediction with its uncertainty; ``upper(k)`` is ``mean + k * std``.
- ``FitReport``: what one ``OperatorModel.fit`` did; ``fitted_on``, ``filtered``, ``held_out`` and
  ``subsampled`` partition the samples it was given (nothing is silently lost).
- ``HeldOut``: a window kept out of the fit, with the model's prediction for it (``ape``).
- ``Calibration``: throughput predictions scaled by measured / predicted over a saturated span.
- ``NoModelError``: a prediction asked of a model with no data for it (not fitted, unseen device
  or categorical knob value).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, NamedTuple

from trident_flows.core.types import OpConfig
from trident_flows.scheduler.anomaly import Filtered
from trident_flows.scheduler.occupancy import SaturatedSpan
from trident_flows.scheduler.sample_windows import Window


class NoModelError(RuntimeError):
    """A prediction was asked of a model that has no data for it (not fitted, unseen device)."""


class Prediction(NamedTuple):
    """A prediction with its uncertainty; ``upper(k)`` is ``mean + k * std``."""

    mean: float
    std: float

    def upper(self, k: float = 2.0) -> float:
        return self.mean + k * self.std


@dataclass(frozen=True)
class HeldOut:
    """A window kept out of the fit, with the model's prediction for it."""

    window: Window
    predicted: float
    std: float

    @property
    def ape(self) -> float:
        return abs(self.predicted - self.window.throughput) / self.window.throughput


@dataclass(frozen=True)
class FitReport:
    """What one ``fit`` did. ``fitted_on``: indices (into the list passed to ``fit``) of the
    samples that steer the throughput model; ``filtered``: every sample set aside and why;
    ``held_out``: the windows kept out to measure ``mape``; ``subsampled``: samples of
    training windows beyond the GP's point cap. These four partition the input."""

    operator: str
    status: str                      # "fitted" | "no_model"
    reason: str
    n_samples: int
    fitted_on: tuple[int, ...]
    filtered: tuple[Filtered, ...]
    filtered_counts: Mapping[str, int]
    downweighted: int
    windows: int
    bin_size: int
    subsampled: tuple[int, ...]
    held_out: tuple[HeldOut, ...]
    mape: float | None
    memory_samples: int
    current_epoch: int
    current_features: Mapping[str, float]
    ooms: tuple[OpConfig, ...]
    kernel: str
    fit_ms: float

    @property
    def fitted(self) -> bool:
        return self.status == "fitted"


@dataclass(frozen=True)
class Calibration:
    """Throughput predictions scaled by ``factor`` = measured / predicted over a saturated ``span``."""

    factor: float
    measured: float
    predicted: float
    span: SaturatedSpan

    def describe(self) -> str:
        return (f"{self.span.operator}: {self.span.describe()} where its busy-time model predicts {self.predicted:.3g}: "
                f"capacities scaled by {self.factor:.2f}")
