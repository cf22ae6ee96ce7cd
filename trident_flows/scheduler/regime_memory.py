"""Regime memory: what Trident learned per workload regime.

Contract:
- ``RegimeMemory.remember(regime, operator, ...)`` stores, per (regime id, operator), a
  snapshot of the fitted ``OperatorModel`` (``OperatorModel.snapshot()``: later fits of the
  live model do not change it) and the best configuration found for that regime with its
  predicted throughput; fields not given keep their stored value.
- ``recall(regime, operator)`` returns the stored ``RegimeRecord`` or ``None``. When a
  ``RegimeDetector`` reports a recurring regime (``RegimeChange.recurring``), the caller
  serves the recalled model and best config at once instead of re-learning them.
- Regime ids are those of one ``RegimeDetector`` (stable for its life); the memory holds
  plain data and snapshots, nothing that refers back to live state.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from trident_flows.core.types import OpConfig
from trident_flows.scheduler.operator_model import OperatorModel


@dataclass(frozen=True)
class RegimeRecord:
    """What is known about one operator in one regime."""

    regime: int
    operator: str
    model: OperatorModel | None = None
    best_config: OpConfig | None = None
    best_throughput: float | None = None
    updated_at: float = 0.0
    visits: int = 1


class RegimeMemory:
    """Models and best configurations per (regime, operator)."""

    def __init__(self) -> None:
        self._records: dict[tuple[int, str], RegimeRecord] = {}

    def remember(self, regime: int, operator: str, *, model: OperatorModel | None = None, best_config: OpConfig | None = None,
                 best_throughput: float | None = None) -> RegimeRecord:
        """Store (or update) the record of ``operator`` in ``regime``; a model is stored as a snapshot."""
        if model is not None and not model.ready:
            raise ValueError(f"operator {operator!r}, regime {regime}: the model has no fit to remember ({model.report.reason if model.report else 'never fitted'})")
        old = self._records.get((regime, operator))
        snap = model.snapshot() if model is not None else None
        if old is None:
            record = RegimeRecord(regime, operator, snap, best_config, best_throughput, time.time())
        else:
            record = replace(old, model=snap or old.model, best_config=best_config or old.best_config,
                             best_throughput=best_throughput if best_throughput is not None else old.best_throughput,
                             updated_at=time.time())
        self._records[(regime, operator)] = record
        return record

    def visit(self, regime: int, operator: str) -> RegimeRecord | None:
        """Count a return to ``regime`` and return its record (None if never remembered)."""
        record = self._records.get((regime, operator))
        if record is not None:
            record = replace(record, visits=record.visits + 1)
            self._records[(regime, operator)] = record
        return record

    def recall(self, regime: int, operator: str) -> RegimeRecord | None:
        return self._records.get((regime, operator))

    def regimes(self, operator: str | None = None) -> list[int]:
        return sorted({r for r, op in self._records if operator is None or op == operator})

    def __len__(self) -> int:
        return len(self._records)
