"""What the regime detector reports and keeps: a change of regime, its kind, and a regime.

Contract:
- ``RegimeChange``: one detected change of one operator: old and new regime id (``old == new`` for a
  residual change), ``ChangeKind``, whether the new regime was seen before (``recurring``), the sample
  it was detected at and the estimated change point (both count samples given to the detector,
  0-based), the evidence and a reason.
- ``ChangeKind.FEATURES``: the workload moved to another (or a new) feature regime;
  ``ChangeKind.RESIDUAL``: same features, the operator's throughput shifted.
- ``Regime``: one workload regime, its centroid in the detector's feature space and how many samples
  built it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Mapping

import numpy as np


class ChangeKind(str, Enum):
    FEATURES = "features"    # the workload moved to another (or a new) feature regime
    RESIDUAL = "residual"    # same workload features, the operator's throughput shifted


@dataclass(frozen=True)
class RegimeChange:
    """A detected regime change of one operator; ``at_sample`` and ``change_point`` count
    samples given to ``update`` (0-based)."""

    operator: str
    old: int | None
    new: int
    kind: ChangeKind
    recurring: bool
    at_sample: int
    change_point: int
    evidence: Mapping[str, float]
    reason: str


@dataclass
class Regime:
    """One workload regime: its centroid in the detector's feature space and how many samples built it."""

    id: int
    centroid: np.ndarray
    count: int = 0
    first_seen: int = 0
    last_seen: int = 0
