"""Two-stage anomaly filtering of an operator's batch samples.

Contract:
- Nothing is silently lost: every sample kept out of a fit becomes a ``Filtered`` value (index
  into the caller's list, ``Reason``, detail); ``count_reasons`` tallies them for the ``FitReport``.
- ``validate_sample`` names a raw sample's bad field (non-finite times, ``busy_s`` <= 0 or longer
  than ``end - start`` beyond ``span_slack``, ``items_in`` < 1, non-finite features);
  ``Reason.INVALID`` samples never reach numpy or scikit-learn.
- Stage 1, ``robust_filter``: per configuration group, in time order, a batch's log time per item
  more than ``k`` scaled MADs from its neighbours' rolling median is a transient spike.
- Stage 2, ``loo_outliers``: after a first GP fit, points whose leave-one-out residual is an
  outlier (on the GP's std, or on a robust scale while still ``supported`` by the GP's) are
  residual outliers.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from enum import Enum
from typing import Iterable, Sequence

import numpy as np
from scipy.linalg import cho_solve

from trident_flows.core.types import BatchSample

MAD_TO_SIGMA = 1.4826


class Reason(str, Enum):
    """Why a sample was kept out of a fit."""

    INVALID = "invalid"            # a field is NaN/inf/negative/inconsistent
    OUTCOME = "outcome"            # the batch ended in error or OOM: no throughput to learn from
    SPIKE = "spike"                # stage 1: transient outlier against its neighbours
    RESIDUAL = "residual"          # stage 2: outlier against the first fit
    SUPERSEDED = "superseded"      # older config epoch; the same config and replica count were re-measured since
    STALE_EPOCH = "stale_epoch"    # taken too many config epochs ago


@dataclass(frozen=True)
class Filtered:
    """One sample set aside: its index in the list passed to ``fit``, the reason and a detail."""

    index: int
    reason: Reason
    detail: str = ""


def span_slack(span_s: float | np.ndarray, end: float | np.ndarray) -> float | np.ndarray:
    """How far ``end - start`` may fall short of ``busy_s`` (seconds; floats or numpy arrays): a relative
    1e-6 for clocks read apart, plus one float64 spacing of the ``end`` timestamp (its rounding).

    ``end`` is ``start + busy_s`` rounded to a float64 of seconds since the epoch (spacing about
    2.4e-7 s), so short batches (tens of ms) often come out a little short; without this slack they
    would be discarded as invalid."""
    return np.asarray(span_s) * 1e-6 + np.spacing(np.abs(end)) + 1e-9


def validate_sample(sample: BatchSample) -> str | None:
    """Return ``None`` for a usable sample, else a message naming the bad field."""
    for name in ("start", "end", "busy_s"):
        value = getattr(sample, name)
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            return f"{name}={value!r} is not a finite number"
    if sample.busy_s <= 0:
        return f"busy_s={sample.busy_s!r} must be > 0"
    if sample.end < sample.start:
        return f"end={sample.end!r} is before start={sample.start!r}"
    if sample.busy_s > sample.end - sample.start + span_slack(sample.end - sample.start, sample.end):
        return f"busy_s={sample.busy_s!r} exceeds end - start={sample.end - sample.start!r}"
    if not isinstance(sample.items_in, int) or sample.items_in < 1:
        return f"items_in={sample.items_in!r} must be an integer >= 1"
    for name, value in sample.features.items():
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            return f"features[{name!r}]={value!r} must be a finite number >= 0"
    for name in ("peak_host_mem_bytes", "peak_device_mem_bytes"):
        value = getattr(sample, name)
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            return f"{name}={value!r} must be a finite number >= 0"
    return None


def robust_filter(values: np.ndarray, groups: np.ndarray, order: np.ndarray, *, window: int = 21, k: float = 4.0,
                  min_mad: float = 0.02, min_group: int = 5) -> np.ndarray:
    """Stage 1: flag transient outliers of ``values`` (e.g. log seconds per item): GC pauses, a
    neighbour's burst, straggler batches. The rolling window keeps the test local, so a regime
    switch (which moves the median) is not mistaken for a run of spikes; the floor on the MAD
    keeps all-identical samples from flagging each other over rounding noise.

    ``groups`` labels each value's configuration group; ``order`` is a sort key (time).
    Within each group of at least ``min_group`` values, a value is flagged when it is more
    than ``k`` scaled MADs from the median of the centred rolling ``window`` around it
    (reflected at the ends). ``min_mad`` is the smallest MAD used (same unit as values).
    Returns a boolean mask, True = outlier.
    """
    values = np.asarray(values, dtype=float)
    flagged = np.zeros(values.shape[0], dtype=bool)
    half = max(1, window // 2)
    for group in np.unique(groups):
        idx = np.flatnonzero(groups == group)
        if idx.size < min_group:
            continue
        idx = idx[np.argsort(order[idx], kind="stable")]
        v = values[idx]
        h = min(half, v.size - 1)
        padded = np.pad(v, h, mode="reflect")
        windows = np.lib.stride_tricks.sliding_window_view(padded, 2 * h + 1)
        med = np.median(windows, axis=1)
        mad = np.median(np.abs(windows - med[:, None]), axis=1)
        scale = np.maximum(mad, min_mad) * MAD_TO_SIGMA
        flagged[idx] = np.abs(v - med) > k * scale
    return flagged


def loo_outliers(L: np.ndarray, alpha: np.ndarray, y_scale: float, *, k: float = 3.5, min_abs: float = math.log(1.05),
                 supported: float = 2.0) -> np.ndarray:
    """Stage 2: flag training points whose leave-one-out residual is an outlier.

    ``L`` is the lower Cholesky factor of the GP's training covariance and ``alpha`` its
    ``K^-1 y`` (scikit-learn's ``L_`` and ``alpha_``, in normalised target units);
    ``y_scale`` converts a normalised residual back to target units. A point is flagged
    when |LOO residual| > ``min_abs`` in target units and either > ``k`` LOO standard
    deviations, or > ``k`` robust standard deviations of all LOO residuals (about their
    median) and > ``supported`` LOO standard deviations.

    Leave-one-out matters: a flexible GP can bend through an outlier it was fitted on. The
    robust test is there because the GP's std is fitted on the outliers too: bursts that slow
    a tenth of the windows (a machine's load slowing short batches 2x for a second at a time)
    hide themselves, the fitted noise growing until none is ``k`` stds out. The robust scale
    (scaled MAD of all LOO residuals) unmasks them; requiring ``supported`` GP stds as well
    keeps what the GP explains as structure (the newest windows of a regime switch are many
    robust but few GP stds out; flagged on the robust scale alone they would be dropped and
    the predictions would lag).
    """
    n = L.shape[0]
    k_inv_diag = np.diag(cho_solve((L, True), np.eye(n)))
    a = np.asarray(alpha).reshape(n)
    residual = a / k_inv_diag
    z = np.abs(a / np.sqrt(k_inv_diag))
    centred = np.abs(residual - np.median(residual))
    robust = MAD_TO_SIGMA * float(np.median(centred))
    unmasked = (centred > k * robust) & (z > supported) if robust > 0 else np.zeros(n, dtype=bool)
    return ((z > k) | unmasked) & (np.abs(residual) * y_scale > min_abs)


def count_reasons(filtered: Iterable[Filtered]) -> dict[str, int]:
    """Number of filtered samples per reason, e.g. ``{"spike": 12, "invalid": 1}``."""
    return dict(Counter(f.reason.value for f in filtered))


def group_codes(keys: Sequence[object]) -> np.ndarray:
    """Integer code per key (equal keys share a code), in first-seen order."""
    table: dict[object, int] = {}
    return np.array([table.setdefault(key, len(table)) for key in keys], dtype=int)
