"""Seconds per item as the batches' content explains it.

Contract:
- ``nnls_work(F, spi, groups)`` fits seconds per item ``spi`` as ``intercept[group] + F @ weights``
  (``F``: per-item features, a row per batch or window), every term non-negative, by NNLS in
  relative error; it returns (intercept per group code, weight per feature).
- ``content_work(F, spi, groups)`` is, per batch, the seconds per item that fit explains, floored at a
  thousandth of the median, so a batch of heavy items counts as work and not as a spike.
A batch's time is a sum over its items, so work adds up linearly in the per-item features.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import nnls


def nnls_work(F: np.ndarray, spi: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Seconds per item ``spi`` as ``intercept[group] + F @ weights`` (per-item features ``F``), every term
    non-negative, fitted by NNLS in relative error. Returns (intercept per group code, weight per feature)."""
    G = np.eye(int(groups.max()) + 1)[groups]
    A = np.column_stack([G, F]) / spi[:, None]
    scale = np.abs(A).max(axis=0)
    scale[scale == 0] = 1.0
    weights, _ = nnls(A / scale, np.ones(len(spi)))
    weights = weights / scale
    return weights[:G.shape[1]], weights[G.shape[1]:]


def content_work(F: np.ndarray, spi: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Per batch, the seconds per item its content explains (``nnls_work`` over the batches themselves),
    floored at a thousandth of the median seconds per item so a batch the fit gives no work stays finite."""
    intercepts, weights = nnls_work(F, spi, groups)
    return np.maximum(intercepts[groups] + F @ weights, 1e-3 * float(np.median(spi)))
