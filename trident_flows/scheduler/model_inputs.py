"""The throughput model's numeric inputs.

Contract:
- ``ModelInputs.build(configs, features)`` learns the input layout from the configs of the windows:
  device one-hot (when several devices), log2 batch size, log1p cpus/gpus per replica, numeric knobs
  (log2 when all positive), categorical knobs one-hot (an unseen value has no input: ``NoModelError``
  upstream), then log2 replicas and the workload as log(work per item).
- ``encode(configs, replicas, feats)`` gives the rows (one per config; ``feats`` per-item features);
  a numeric knob given a non-number raises ``ValueError`` naming it.
- ``work_weights(windows, names)``: seconds per item as a non-negative linear function of the
  per-item features, so windows of mixed items run at the harmonic mean of their rates (a trend in
  log features cannot give that); ``feature_matrix`` is the windows' per-item features.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from trident_flows.core.types import OpConfig
from trident_flows.scheduler.anomaly import group_codes
from trident_flows.scheduler.item_work import nnls_work
from trident_flows.scheduler.sample_windows import Window

WORK_FLOOR = 1e-3   # the work input's floor, relative to the largest weight (features of 0 with no per-item intercept)


@dataclass(frozen=True)
class ModelInputs:
    """Turns (config, replicas, per-item features) into the model's numeric inputs."""

    devices: tuple[str, ...]
    numeric_knobs: tuple[tuple[str, bool], ...]          # (name, log2)
    categorical_knobs: tuple[tuple[str, tuple[str, ...]], ...]
    features: tuple[str, ...]
    work: tuple[float, ...] = ()     # seconds per item = work[0] + sum_f work[1 + f] * feature f per item (``work_weights``)

    @classmethod
    def build(cls, configs: Sequence[OpConfig], features: Sequence[str]) -> "ModelInputs":
        devices = tuple(sorted({c.device for c in configs}))
        values: dict[str, set] = {}
        for c in configs:
            for name, value in c.knobs:
                values.setdefault(name, set()).add(value)
        numeric, categorical = [], []
        for name in sorted(values):
            vals = values[name]
            if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
                numeric.append((name, all(v > 0 for v in vals)))
            else:
                seen = {str(v) for v in vals} | ({"None"} if any(name not in c.knob_dict for c in configs) else set())
                categorical.append((name, tuple(sorted(seen))))
        return cls(devices, tuple(numeric), tuple(categorical), tuple(features))

    def config_row(self, c: OpConfig) -> list[float]:
        row = [float(c.device == d) for d in self.devices] if len(self.devices) > 1 else []
        row += [math.log2(c.batch_size), math.log1p(c.cpus), math.log1p(c.gpus)]
        knobs = c.knob_dict
        for name, log in self.numeric_knobs:
            value = knobs.get(name, 0)
            if isinstance(value, str) or not math.isfinite(float(value)):
                raise ValueError(f"knob {name!r}={value!r}: the model learned it as a number; pass a finite number")
            row.append(math.log2(value) if log and value > 0 else float(value))
        for name, choices in self.categorical_knobs:
            row += [float(str(knobs.get(name)) == ch) for ch in choices]
        return row

    def encode(self, configs: Sequence[OpConfig], replicas: np.ndarray, feats: np.ndarray) -> np.ndarray:
        rows: dict[int, list[float]] = {}   # by object: placement encodes one config for each of up to thousands of replica counts
        for c in configs:
            if id(c) not in rows:
                rows[id(c)] = self.config_row(c)
        base = np.array([rows[id(c)] for c in configs], dtype=float).reshape(len(configs), -1)
        return np.column_stack([base, np.log2(np.maximum(replicas, 1.0)), self.work_column(feats)])

    @property
    def replicas_column(self) -> int:
        """Index of the log2 replicas input in ``encode``'s rows (before the workload input, if any)."""
        return -2 if self.features else -1

    def work_column(self, feats: np.ndarray) -> np.ndarray:
        """The workload input: log of the work per item the features imply (none without features)."""
        if not self.features:
            return np.zeros((feats.shape[0], 0))
        w = np.asarray(self.work)
        return np.log(np.maximum(w[0] + feats @ w[1:], WORK_FLOOR * max(w[0], float(w[1:].max(initial=0.0)), 1e-12)))[:, None]


def work_weights(windows: Sequence[Window], names: Sequence[str]) -> tuple[float, ...]:
    """Seconds per item as a non-negative linear function of the per-item features (``[intercept, weight per
    feature]``), fitted by NNLS in relative error on the training windows, with an intercept of each
    (config, replica count) of its own (a batch's fixed cost and the replicas' contention differ between
    them; the returned intercept is their median). The model's workload input is the log of that work, not
    each feature apart: a batch's time is a sum over its items, so a window of mixed items runs at the
    harmonic mean of their rates, which a trend in log features cannot give."""
    if not names or not windows:
        return ()
    spi = np.array([1.0 / w.per_replica_rate for w in windows])
    groups = group_codes([(w.config, w.replicas) for w in windows])
    intercepts, features = nnls_work(feature_matrix(windows, names), spi, groups)
    intercept = float(np.median(intercepts[groups]))
    if intercept <= 0 and not features.any():
        intercept = float(np.median(spi))
    return (intercept, *(float(x) for x in features))


def feature_matrix(windows: Sequence[Window], names: Sequence[str]) -> np.ndarray:
    return np.array([[w.features[f] for f in names] for w in windows], dtype=float).reshape(len(windows), len(names))
