"""Rows of a document-pipeline batch: the marks every operator respects, and the columns it needs.

Contract:
- ``OPERATOR_NAMES``: the operators in pipeline order. ``with_marks(batch)`` is a shallow copy with
  ``_drop`` and ``_error`` columns ("" = unmarked); ``live_rows(batch)`` the indices no earlier
  operator marked; ``live_sum(batch, column)`` a column summed over them (a workload feature).
- ``require_columns(batch, operator, *columns)`` raises ``ValueError`` naming the missing columns and
  the pipeline order. ``objects(values)`` is a 1-D object array holding ``values`` as they are.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trident_flows.runtime.spec import DROP, ERROR, Batch, batch_len

OPERATOR_NAMES = ("parse", "ocr", "langid", "quality", "dedup", "embed")


def objects(values: list[Any]) -> np.ndarray:
    """A 1-D object array holding ``values`` as they are (lists stay lists)."""
    arr = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        arr[i] = v
    return arr


def with_marks(batch: Batch) -> Batch:
    """A shallow copy of ``batch`` with ``_drop`` and ``_error`` columns ("" = unmarked)."""
    out = dict(batch)
    n = batch_len(batch)
    for mark in (DROP, ERROR):
        column = out.get(mark)
        out[mark] = objects(["" if column is None or not column[i] else str(column[i]) for i in range(n)])
    return out


def live_rows(batch: Batch) -> list[int]:
    """Indices of rows no earlier operator has marked."""
    return [i for i in range(batch_len(batch)) if not batch[DROP][i] and not batch[ERROR][i]]


def require_columns(batch: Batch, operator: str, *columns: str) -> None:
    missing = [c for c in columns if c not in batch]
    if missing:
        raise ValueError(f"operator {operator!r} needs batch columns {missing}; run the operators that produce them first "
                         f"(pipeline order: {', '.join(OPERATOR_NAMES)})")


def live_sum(batch: Batch, column: str) -> float:
    if column not in batch:
        return 0.0
    rows = live_rows(with_marks(batch))
    return float(sum(float(batch[column][i]) for i in rows))
