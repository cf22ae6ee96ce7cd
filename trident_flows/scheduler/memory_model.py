"""An operator's model of peak memory per replica.

Contract:
- ``fit_memory(samples, idx, max_memory_samples)`` fits, per device, a scikit-learn ``BayesianRidge`` on
  the physical basis of the cost model (peak = resident + a*items + sum_f b_f*feature_sum_f + knob terms)
  over the ok batches ``idx`` with a memory peak (host memory for cpu, device memory otherwise); a
  device with fewer than two has no model. Memory outliers are real risk, so none is filtered; above
  ``max_memory_samples`` an even stride plus the 20 highest peaks are kept.
- ``predict_memory(fit, config, features, extrapolation)`` is one replica's peak in bytes: the
  predictive mean and std (parameter uncertainty included), the std widened by ``extrapolation * mean
  * |log(batch / nearest observed batch)|`` outside the observed batch sizes.
Memory samples are not invalidated by config epochs (peak memory is a property of the config itself).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
from sklearn.linear_model import BayesianRidge

from trident_flows.core.types import CPU, BatchSample, OpConfig
from trident_flows.scheduler.model_values import Prediction

MIB = float(2**20)


@dataclass(frozen=True)
class MemoryFit:
    """One device's memory model: the regression, its knob and feature columns, their scale, the batch sizes seen."""

    model: BayesianRidge
    knobs: tuple[str, ...]
    features: tuple[str, ...]
    col_scale: np.ndarray
    batch_range: tuple[int, int]


def fit_memory(samples: Sequence[BatchSample], idx: list[int], max_memory_samples: int) -> dict[str, MemoryFit]:
    """A memory model per device, on the samples ``idx`` (module docstring)."""
    fits: dict[str, MemoryFit] = {}
    by_device: dict[str, list[int]] = {}
    for i in idx:
        by_device.setdefault(samples[i].config.device, []).append(i)
    for device, ids in by_device.items():
        if len(ids) < 2:
            continue
        if len(ids) > max_memory_samples:
            # an even stride over the window plus its highest peaks (OOM safety leans on the peaks)
            peak = np.array([samples[i].peak_host_mem_bytes if device == CPU else samples[i].peak_device_mem_bytes for i in ids])
            pick = set(np.linspace(0, len(ids) - 1, max_memory_samples).round().astype(int)) | set(np.argsort(peak)[-20:])
            ids = [ids[k] for k in sorted(pick)]
        feats = tuple(sorted({f for i in ids for f in samples[i].features}))
        knobs = tuple(sorted({k for i in ids for k, v in samples[i].config.knobs if isinstance(v, (int, float))}))
        knob_rows = {c: knob_values(c, knobs) for c in {samples[i].config for i in ids}}
        B = np.array([[float(samples[i].items_in)] + [samples[i].features.get(f, 0.0) for f in feats] + knob_rows[samples[i].config]
                      for i in ids], dtype=float)
        scale = np.abs(B).max(axis=0)
        scale[scale == 0] = 1.0
        y = np.array([(samples[i].peak_host_mem_bytes if device == CPU else samples[i].peak_device_mem_bytes) for i in ids], float) / MIB
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = BayesianRidge(fit_intercept=True).fit(B / scale, y)
        sizes = [samples[i].config.batch_size for i in ids]
        fits[device] = MemoryFit(model, knobs, feats, scale, (min(sizes), max(sizes)))
    return fits


def predict_memory(fit: MemoryFit, config: OpConfig, f: Mapping[str, float], extrapolation: float) -> Prediction:
    """Peak memory of one replica of ``config`` in bytes, for per-item features ``f`` (module docstring)."""
    row = np.array(memory_row(config.batch_size, {n: v * config.batch_size for n, v in f.items()}, config, fit.features, fit.knobs)) / fit.col_scale
    m = fit.model   # BayesianRidge's predictive mean and std (as its predict(return_std=True)), without per-call validation
    mean = float(row @ m.coef_ + m.intercept_)
    centred = row - m.X_offset_
    std = math.sqrt(float(centred @ m.sigma_ @ centred) + 1.0 / m.alpha_)
    lo, hi = fit.batch_range
    outside = max(math.log(lo / config.batch_size), math.log(config.batch_size / hi), 0.0)
    std += abs(mean) * outside * extrapolation
    return Prediction(max(mean, 0.0) * MIB, std * MIB)


def knob_values(config: OpConfig, knobs: Sequence[str]) -> list[float]:
    values = config.knob_dict
    return [float(values.get(k, 0.0)) for k in knobs]


def memory_row(items: float, feature_sums: Mapping[str, float], config: OpConfig, feats: Sequence[str], knobs: Sequence[str]) -> list[float]:
    return [float(items)] + [float(feature_sums.get(f, 0.0)) for f in feats] + knob_values(config, knobs)
