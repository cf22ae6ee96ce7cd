"""Per-operator models of sustainable throughput and peak memory.

Contract:
- ``OperatorModel(operator).fit(samples)`` fits on a window of ``BatchSample``s and returns a
  ``FitReport`` listing every sample left out with its reason; too little data gives
  ``status="no_model"`` (predictions then raise ``NoModelError``). Parts: ``sample_windows``,
  ``model_inputs``, ``throughput_gp``, ``memory_model``.
- ``throughput(config, replicas, features) -> Prediction``: the operator's sustainable items/s
  (``capacity_curve``, ``predict_many``); ``capacity_lower``: the evidence gate's curve;
  ``memory(config, features)``: one replica's peak bytes. ``features=None`` is the current workload.
- An unseen device or categorical value has no prediction (``NoModelError``); replica counts are
  interpolated only, and the per-replica rate never rises with the count (isotonic).
- ``calibrate(span)`` scales throughput predictions by measured / predicted when an
  ``occupancy.SaturatedSpan`` differs by more than ``calibration_tolerance``, until it ages out
  (``calibration_max_age_s``) or ``forget_calibration()``; ``log_residual`` stays on busy time.
"""

from __future__ import annotations

import math
import time
import warnings
from collections import Counter
from copy import copy
from dataclasses import replace
from typing import Mapping, Sequence

import numpy as np
from scipy.optimize import isotonic_regression
from sklearn.exceptions import ConvergenceWarning
from sklearn.gaussian_process.kernels import Kernel

from trident_flows.core.types import BatchSample, OpConfig, Outcome
from trident_flows.scheduler.anomaly import Filtered, Reason, count_reasons, loo_outliers, validate_sample
from trident_flows.scheduler.blas import one_blas_thread
from trident_flows.scheduler.memory_model import MemoryFit, fit_memory, predict_memory
from trident_flows.scheduler.model_inputs import ModelInputs, feature_matrix, work_weights
from trident_flows.scheduler.model_values import Calibration, FitReport, HeldOut, NoModelError, Prediction
from trident_flows.scheduler.occupancy import SaturatedSpan
from trident_flows.scheduler.sample_windows import Window, drop_spikes, invalidate, make_windows, quick_valid, screen, subsample
from trident_flows.scheduler.throughput_gp import ThroughputFit, fit_gp, lognormal, standardised, start_kernel

_UNSEEN_COUNT_WEIGHT = 1e-3   # a replica count no training window ran with follows the counts that did (``_never_faster_with_more``)


class OperatorModel:
    """Anomaly-filtered GP models of one operator (see the module docstring and the modules it names)."""

    def __init__(self, operator: str, *, max_gp_points: int = 100, holdout_every: int = 5,
                 max_epoch_age: int = 3, stale_noise: float = 0.25, spike_k: float = 4.0, residual_k: float = 3.5,
                 current_windows: int = 5, optimise_points: int = 50, cold_iterations: int = 60, warm_iterations: int = 12,
                 memory_extrapolation: float = 0.25, max_memory_samples: int = 600, calibration_tolerance: float = 1.15,
                 calibration_max_age_s: float = 60.0, min_window_busy_s: float = 0.25) -> None:
        if not operator:
            raise ValueError("operator name must be a non-empty string")
        if calibration_tolerance < 1 or calibration_max_age_s <= 0:
            raise ValueError(f"operator {operator!r}: calibration_tolerance must be >= 1 and calibration_max_age_s > 0, "
                             f"got {calibration_tolerance!r}, {calibration_max_age_s!r}")
        self.operator = operator
        self.max_gp_points = max_gp_points
        self.holdout_every = holdout_every
        self.max_epoch_age = max_epoch_age
        self.stale_noise = stale_noise
        self.spike_k = spike_k
        self.residual_k = residual_k
        self.current_windows = current_windows
        self.optimise_points = optimise_points
        self.cold_iterations = cold_iterations
        self.warm_iterations = warm_iterations
        self.memory_extrapolation = memory_extrapolation
        self.max_memory_samples = max_memory_samples
        self.min_window_busy_s = min_window_busy_s
        self.calibration_tolerance = calibration_tolerance
        self.calibration_max_age_s = calibration_max_age_s
        self.calibration: Calibration | None = None
        self._span: SaturatedSpan | None = None
        self._finished: tuple[BatchSample, ...] = ()   # the last fit's ok samples, spikes and stale epochs included (``span_features``)
        self.report: FitReport | None = None
        self._tp: ThroughputFit | None = None
        self._mem: dict[str, MemoryFit] = {}
        self._kernel: Kernel | None = None

    # ----------------------------------------------------------------- state
    @property
    def ready(self) -> bool:
        """True once a throughput model exists."""
        return self._tp is not None

    @property
    def fitted_on(self) -> tuple[int, ...]:
        return self.report.fitted_on if self.report else ()

    @property
    def mape(self) -> float | None:
        return self.report.mape if self.report else None

    @property
    def current_features(self) -> dict[str, float]:
        return dict(self.report.current_features) if self.report else {}

    @property
    def feature_names(self) -> tuple[str, ...]:
        return self._tp.encoder.features if self._tp else ()

    @property
    def devices(self) -> tuple[str, ...]:
        return self._tp.encoder.devices if self._tp else ()

    def snapshot(self) -> "OperatorModel":
        """A copy sharing the (immutable) fitted state; later fits of ``self`` do not change it."""
        return copy(self)

    # ------------------------------------------------------------------- fit
    def fit(self, samples: Sequence[BatchSample], current_epoch: int | None = None) -> FitReport:
        """Fit both models on ``samples`` (one operator's sliding window, any order).

        ``current_epoch`` is the operator's config epoch now (default: the newest in the window).
        BLAS runs single-threaded here: the matrices are small, and the scheduler shares its
        cores with the pipeline.
        """
        with one_blas_thread():
            return self._fit(samples, current_epoch)

    def _fit(self, samples: Sequence[BatchSample], current_epoch: int | None) -> FitReport:
        """Screen the samples, fit the memory model, drop stale epochs and transient spikes, bin the rest into
        windows, fit the throughput GP on them (less held-out windows and residual outliers), and report."""
        t0 = time.perf_counter()
        filtered, ok, mem_ok, ooms = screen(self.operator, samples)
        self._finished = tuple(samples[i] for i in ok)
        epoch = max((samples[i].config_epoch for i in ok), default=0) if current_epoch is None else current_epoch

        self._mem = fit_memory(samples, mem_ok, self.max_memory_samples)
        ok, age = invalidate(samples, ok, epoch, filtered, self.max_epoch_age)
        common = dict(operator=self.operator, n_samples=len(samples), memory_samples=len(mem_ok), current_epoch=epoch,
                      ooms=tuple(sorted(ooms, key=OpConfig.label)))
        if not ok:
            return self._no_model(common, filtered, "no usable ok samples in the window", t0)

        feature_names = tuple(sorted({f for i in ok for f in samples[i].features}))
        latest_end = max(samples[i].end for i in ok)
        sums = np.array([[samples[i].features.get(f, 0.0) for f in feature_names] for i in ok], dtype=float).reshape(len(ok), len(feature_names))
        ok, groups, sums = drop_spikes(samples, ok, sums, filtered, self.spike_k)
        windows, bin_size = make_windows(samples, ok, groups, sums, feature_names, filtered, holdout_every=self.holdout_every,
                                          max_gp_points=self.max_gp_points, min_window_busy_s=self.min_window_busy_s)
        if len(windows) < 2:
            return self._no_model(common, filtered, f"{len(ok)} usable sample(s) make {len(windows)} window(s); need >= 2", t0)

        windows.sort(key=lambda w: w.end)
        hold = len(windows) >= 2 * self.holdout_every
        held = [w for k, w in enumerate(windows) if hold and k % self.holdout_every == 2]
        train = [w for k, w in enumerate(windows) if not (hold and k % self.holdout_every == 2)]
        train, dropped = subsample(train, self.max_gp_points)
        encoder = replace(ModelInputs.build([w.config for w in windows], feature_names), work=work_weights(train, feature_names))
        fit, train = self._fit_throughput(encoder, train, [age[(w.config, w.epoch)] for w in train], feature_names, filtered)
        self._tp = fit
        self._kernel = fit.gp.kernel_

        held_out = self._held_out(held, feature_names)
        mape = float(np.mean([h.ape for h in held_out])) if held_out else None
        recent = sorted(windows, key=lambda w: w.start)[-self.current_windows:]   # begun last: not a straggler of an earlier workload
        tot = sum(w.items for w in recent)
        current = {f: sum(w.features[f] * w.items for w in recent) / tot for f in feature_names}
        report = FitReport(status="fitted", reason=f"{len(train)} training windows of {bin_size} batches", fitted_on=tuple(sorted(i for w in train for i in w.indices)),
                           filtered=tuple(filtered), filtered_counts=count_reasons(filtered), downweighted=sum(len(w.indices) for w in train if age[(w.config, w.epoch)] > 0),
                           windows=len(train), bin_size=bin_size, subsampled=tuple(sorted(i for w in dropped for i in w.indices)), held_out=held_out, mape=mape, current_features=current,
                           kernel=str(fit.gp.kernel_), fit_ms=(time.perf_counter() - t0) * 1e3, **common)
        self.report = report
        if self._span is not None and float(latest_end) - self._span.end > self.calibration_max_age_s:
            self._span = None
        self._derive_calibration()
        return report

    def _fit_throughput(self, encoder: ModelInputs, train: list[Window], ages: Sequence[float], feature_names: tuple[str, ...],
                        filtered: list[Filtered]) -> tuple[ThroughputFit, list[Window]]:
        """The GP of log per-replica rate on the training windows; windows that are leave-one-out outliers against
        it are filtered and the GP refitted without them (kernel kept). Returns the fit and the windows it used."""
        X = encoder.encode([w.config for w in train], np.array([w.replicas for w in train], float), feature_matrix(train, feature_names))
        y = np.log([w.per_replica_rate for w in train])
        ages = np.array(ages, dtype=float)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            warnings.simplefilter("ignore", RuntimeWarning)
            kernel = start_kernel(self._kernel, X.shape[1])
            iterations = self.warm_iterations if kernel is self._kernel else self.cold_iterations
            fit = fit_gp(encoder, X, y, ages, kernel, stale_noise=self.stale_noise, iterations=iterations,
                         optimise_points=self.optimise_points)
            outliers = loo_outliers(fit.gp.L_, fit.gp.alpha_, float(np.atleast_1d(fit.gp._y_train_std)[0]), k=self.residual_k)
            if outliers.any() and (~outliers).sum() >= 2:
                for w in (train[j] for j in np.flatnonzero(outliers)):
                    filtered += [Filtered(i, Reason.RESIDUAL, f"window ending {w.end:.3f} is an outlier against the first fit") for i in w.indices]
                keep = ~outliers
                train = [w for w, k in zip(train, keep) if k]
                fit = fit_gp(encoder, X[keep], y[keep], ages[keep], fit.gp.kernel_, stale_noise=self.stale_noise, iterations=None,
                             optimise_points=self.optimise_points)
        per_count = Counter(float(w.replicas) for w in train)
        counts = sorted(per_count)
        return replace(fit, counts_seen=tuple(counts), count_windows=tuple(per_count[c] for c in counts)), train

    def _held_out(self, held: list[Window], feature_names: tuple[str, ...]) -> tuple[HeldOut, ...]:
        """The fitted model's predictions for the held-out windows, against what they measured."""
        if not held:
            return ()
        mean, std = self._predict_log([w.config for w in held], np.array([w.replicas for w in held], float), feature_matrix(held, feature_names))
        return tuple(HeldOut(w, *lognormal(m, s, w.replicas)) for w, m, s in zip(held, mean, std))

    def _no_model(self, common: dict, filtered: list[Filtered], reason: str, t0: float) -> FitReport:
        self._tp = None
        self.calibration = None
        self.report = FitReport(status="no_model", reason=reason, fitted_on=(), filtered=tuple(filtered), filtered_counts=count_reasons(filtered),
                                downweighted=0, windows=0, bin_size=0, subsampled=(), held_out=(), mape=None, current_features={}, kernel="",
                                fit_ms=(time.perf_counter() - t0) * 1e3, **common)
        return self.report

    # ----------------------------------------------------------- calibration
    def calibrate(self, span: SaturatedSpan | None) -> Calibration | None:
        """Take a saturated span of this operator as evidence of its capacity (see the module docstring);
        ``None`` keeps the last span. Returns the calibration in force (None: predictions unscaled)."""
        if span is not None:
            if span.operator != self.operator:
                raise ValueError(f"span of operator {span.operator!r} given to the model of {self.operator!r}")
            self._span = span
        self._derive_calibration()
        return self.calibration

    def forget_calibration(self) -> None:
        """Drop the span and its correction (the workload changed: the span measured another one)."""
        self._span = None
        self.calibration = None

    def _derive_calibration(self) -> None:
        self.calibration = None
        span = self._span
        if span is None or self._tp is None:
            return
        try:
            features = self.span_features(span)
            predicted = sum(float(self._predict_raw([c], n, features)[0][0]) for c, n in span.configs)
        except (NoModelError, ValueError):
            return
        if predicted <= 0:
            return
        ratio = span.measured / predicted
        if ratio * self.calibration_tolerance >= 1 and (span.bound or ratio <= self.calibration_tolerance):
            return
        self.calibration = Calibration(ratio, span.measured, predicted, span)

    def span_features(self, span: SaturatedSpan) -> dict[str, float] | None:
        """The per-item features of the work the operator finished during ``span`` (every ok sample of the last
        fit's window that ended in it, transient spikes included: a straggler of a heavier workload is work the
        span's replicas did), so a span is set against the model's prediction for the work it measured; None
        (the current workload) when no sample ended in it."""
        inside = [s for s in self._finished if span.start < s.end <= span.end]
        items = sum(s.items_in for s in inside)
        if not items:
            return None
        return {f: sum(s.features.get(f, 0.0) for s in inside) / items for f in self.feature_names}

    # --------------------------------------------------------------- predict
    def _check_features(self, features: Mapping[str, float] | None, names: Sequence[str]) -> dict[str, float]:
        if features is None:
            return self.current_features
        missing = [f for f in names if f not in features]
        if missing:
            raise ValueError(f"operator {self.operator!r}: features lack {missing}; pass per-item values for {list(names)} (or None for the current workload)")
        out = {}
        for f in names:
            v = features[f]
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"operator {self.operator!r}: features[{f!r}]={v!r} must be a finite number >= 0")
            out[f] = float(v)
        return out

    def _require(self, configs: Sequence[OpConfig]) -> ThroughputFit:
        if self._tp is None:
            why = self.report.reason if self.report else "fit() was never called"
            raise NoModelError(f"operator {self.operator!r} has no throughput model yet ({why})")
        for c in configs:
            if c.device not in self._tp.encoder.devices:
                raise NoModelError(f"operator {self.operator!r} has no throughput samples on device {c.device!r} "
                                   f"(seen: {list(self._tp.encoder.devices)}); run a canary replica on it first")
            for name, choices in self._tp.encoder.categorical_knobs:
                if str(c.knob(name)) not in choices:
                    raise NoModelError(f"operator {self.operator!r} has no throughput samples with knob {name}={c.knob(name)!r} "
                                       f"(seen: {list(choices)}); run a canary replica with it first")
        return self._tp

    def _predict_log(self, configs: Sequence[OpConfig], replicas: np.ndarray, feats: np.ndarray,
                     return_std: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
        fit = self._require(configs)
        Z = standardised(fit, configs, replicas, feats)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if not return_std:
                return Z @ fit.coef + fit.intercept + fit.gp.predict(Z), None
            mu, std = fit.gp.predict(Z, return_std=True)
        return Z @ fit.coef + fit.intercept + mu, std

    def predict_many(self, configs: Sequence[OpConfig], replicas: Sequence[int] | int = 1,
                     features: Mapping[str, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Vectorised ``throughput``: arrays of mean and std (items/s, whole operator), one per config,
        scaled by the calibration in force."""
        mean, std = self._predict_raw(configs, replicas, features)
        factor = self.calibration.factor if self.calibration is not None else 1.0
        return mean * factor, std * factor

    def _predict_raw(self, configs: Sequence[OpConfig], replicas: Sequence[int] | int = 1,
                     features: Mapping[str, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The busy-time model's prediction, without calibration. Each distinct (config, replica count
        clipped to the counts seen) is predicted once: a 256-node capacity curve asks for every count up
        to thousands, nearly all beyond the counts seen, where the per-replica rate is the same."""
        reps = np.broadcast_to(np.asarray(replicas, dtype=float), (len(configs),)).copy()
        if (reps < 1).any():
            raise ValueError(f"operator {self.operator!r}: replicas must be >= 1, got {replicas!r}")
        objects: dict[int, int] = {}   # id -> index into ``uniq`` (a curve repeats one config object thousands of times)
        uniq: list[OpConfig] = []
        codes = np.empty(len(configs), dtype=np.intp)
        for k, c in enumerate(configs):
            j = objects.get(id(c))
            if j is None:
                j = objects[id(c)] = len(uniq)
                uniq.append(c)
            codes[k] = j
        fit = self._require(uniq)
        f = self._check_features(features, fit.encoder.features)
        # each distinct (config object, clipped count) once, in order of first appearance
        keys = np.column_stack([codes.astype(float), np.clip(reps, *fit.replicas_seen)])
        distinct, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")
        rank = np.empty(len(order), dtype=np.intp)
        rank[order] = np.arange(len(order))
        rows = rank[inverse.reshape(-1)]
        distinct = distinct[order]
        feats = np.tile([f[n] for n in fit.encoder.features], (len(distinct), 1)).reshape(len(distinct), len(fit.encoder.features))
        mu, s = self._predict_log([uniq[int(j)] for j in distinct[:, 0]], distinct[:, 1].copy(), feats)
        mu, s = self._never_faster_with_more(fit, uniq, distinct, mu, s, feats[:1])
        mean, std = lognormal(mu[rows], s[rows], reps)
        return np.asarray(mean), np.asarray(std)

    def _never_faster_with_more(self, fit: ThroughputFit, uniq: Sequence[OpConfig], distinct: np.ndarray, mu: np.ndarray,
                                s: np.ndarray, feats: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per config, the per-replica log rate (``mu``; ``s`` kept) at ``distinct``'s (config code, count) rows made
        non-increasing in the count: a replica never runs faster because more replicas run beside it, so a lower rate
        at fewer replicas is the load of the moment the fewer ran in (a start-up window of 5 warming replicas beside
        7 later ones made the live document trace's embed predict 1.3 items/s per replica at 5 and 2.3 at 7), not
        their number. The fit is a weighted isotonic regression over the counts seen (each weighted by its training
        windows) and the counts asked, so a count with little evidence moves to the rest rather than the rest to it
        (raising every count to the highest rate at any larger one overstated capacity: the maximum of noisy rates)."""
        seen = dict(zip(fit.counts_seen, fit.count_windows))
        if len(seen) < 2:
            return mu, s
        out = mu.copy()
        for j in np.unique(distinct[:, 0]):
            rows = np.flatnonzero(distinct[:, 0] == j)
            queried = distinct[rows, 1]
            extra = np.array([c for c in seen if c not in queried])
            counts, values = queried, mu[rows]
            if extra.size:
                more, _ = self._predict_log([uniq[int(j)]] * extra.size, extra.copy(), np.repeat(feats, extra.size, axis=0), return_std=False)
                counts, values = np.r_[queried, extra], np.r_[values, more]
            order = np.argsort(counts, kind="stable")
            weights = np.array([seen.get(float(c), _UNSEEN_COUNT_WEIGHT) for c in counts[order]])
            fitted = np.empty(len(counts))
            fitted[order] = isotonic_regression(values[order], weights=weights, increasing=False).x
            out[rows] = fitted[:len(rows)]
        return out, s

    def throughput(self, config: OpConfig, replicas: int = 1, features: Mapping[str, float] | None = None) -> Prediction:
        """Sustainable throughput of ``replicas`` replicas of ``config`` together, items/s."""
        mean, std = self.predict_many([config], replicas, features)
        return Prediction(float(mean[0]), float(std[0]))

    def per_replica(self, config: OpConfig, replicas: int = 1, features: Mapping[str, float] | None = None) -> Prediction:
        """Throughput of one replica when ``replicas`` run together, items/s."""
        t = self.throughput(config, replicas, features)
        return Prediction(t.mean / replicas, t.std / replicas)

    def capacity_curve(self, config: OpConfig, max_replicas: int, features: Mapping[str, float] | None = None) -> tuple[Prediction, ...]:
        """``throughput(config, r)`` for r = 1..max_replicas (the MILP's piecewise-linear capacity)."""
        if max_replicas < 1:
            raise ValueError(f"max_replicas must be >= 1, got {max_replicas}")
        mean, std = self.predict_many([config] * max_replicas, np.arange(1, max_replicas + 1), features)
        return tuple(Prediction(float(m), float(s)) for m, s in zip(mean, std))

    def capacity_lower(self, config: OpConfig, max_replicas: int, serving: int, z: float,
                       features: Mapping[str, float] | None = None) -> np.ndarray:
        """Throughput of r = 1..max_replicas replicas of ``config`` (items/s, calibrated), as
        the evidence gate counts it: the median up to the ``serving`` replicas that run now and, beyond them, ``z``
        standard deviations below it in the rate of a replica at r against its rate at ``serving`` (the deviation of
        the GP's difference of the two log rates; of the rate itself when none serves). What the counts share (the
        level of a workload far from the evidence, where the deviation is in the thousands) is being measured by the
        running replicas; only what more replicas add is in doubt."""
        counts = np.arange(1, max_replicas + 1)
        mean, _ = self.predict_many([config] * max_replicas, counts, features)
        if z == 0 or serving >= max_replicas:
            return mean
        fit = self._require([config])
        beyond = counts > serving
        asked = np.clip(counts[beyond], *fit.replicas_seen).astype(float)
        distinct = np.unique(asked)
        points = distinct if serving < 1 else np.r_[np.clip(float(serving), *fit.replicas_seen), distinct]
        f = self._check_features(features, fit.encoder.features)
        feats = np.tile([f[n] for n in fit.encoder.features], (len(points), 1)).reshape(len(points), len(fit.encoder.features))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _, cov = fit.gp.predict(standardised(fit, [config] * len(points), points, feats), return_cov=True)
        var = np.diag(cov)
        if serving >= 1:
            var = var[1:] + var[0] - 2.0 * cov[0, 1:]
        sd = np.sqrt(np.maximum(var, 0.0))
        lower = mean.copy()
        lower[beyond] *= np.exp(-z * sd[np.searchsorted(distinct, asked)])
        return lower

    def memory(self, config: OpConfig, features: Mapping[str, float] | None = None) -> Prediction:
        """Peak memory of one replica of ``config`` in bytes (host for cpu, device otherwise)."""
        fit = self._mem.get(config.device)
        if fit is None:
            why = "fit() was never called" if self.report is None else f"no ok samples with memory on device {config.device!r} (seen: {sorted(self._mem)})"
            raise NoModelError(f"operator {self.operator!r} has no memory model for device {config.device!r}: {why}")
        f = self._check_features(features, fit.features) if features is not None else {n: self.current_features.get(n, 0.0) for n in fit.features}
        return predict_memory(fit, config, f, self.memory_extrapolation)

    def memory_upper(self, config: OpConfig, k: float = 2.0, features: Mapping[str, float] | None = None) -> float:
        """``mean + k * std`` of the peak memory of one replica, bytes (the optimiser's OOM guard)."""
        return self.memory(config, features).upper(k)

    def log_residual(self, sample: BatchSample, replicas: int) -> float:
        """log(observed rate of one batch) - log(predicted per-replica rate), for change-point tests."""
        problem = validate_sample(sample)
        if problem is not None:
            raise ValueError(f"operator {self.operator!r}: sample from {sample.replica_id!r} is invalid: {problem}")
        fit = self._require([sample.config])
        feats = np.array([[sample.features.get(f, 0.0) / sample.items_in for f in fit.encoder.features]]).reshape(1, -1)
        mu, _ = self._predict_log([sample.config], np.array([float(replicas)]), feats)
        return math.log(sample.items_in / sample.busy_s) - float(mu[0])

    def log_residuals(self, samples: Sequence[BatchSample], replicas: Sequence[int]) -> list[float | None]:
        """``log_residual`` of many samples in one GP prediction (the regime detector re-bases on up to
        100 of them after each refit: one prediction each made its step the tick's largest cost).
        None where a sample has no residual: an error or OOM batch, an invalid sample, a device or
        knob the model has not seen."""
        out: list[float | None] = [None] * len(samples)
        keep = []
        surely_valid = quick_valid(samples)
        known: dict[OpConfig, bool] = {}   # configs the model can predict (a tick's samples share a few)
        for k, s in enumerate(samples):
            if s.outcome != Outcome.OK or (not surely_valid[k] and validate_sample(s) is not None):
                continue
            if s.config not in known:
                try:
                    self._require([s.config])
                    known[s.config] = True
                except NoModelError:
                    known[s.config] = False
            if known[s.config]:
                keep.append(k)
        if not keep:
            return out
        features = self._tp.encoder.features
        feats = np.array([[samples[k].features.get(f, 0.0) / samples[k].items_in for f in features] for k in keep]).reshape(len(keep), -1)
        # the mean only: the GP's std over a tick's samples (O(n_train^2) each) was most of this call at 256 nodes
        mu, _ = self._predict_log([samples[k].config for k in keep], np.array([float(replicas[k]) for k in keep]), feats, return_std=False)
        for j, k in enumerate(keep):
            out[k] = math.log(samples[k].items_in / samples[k].busy_s) - float(mu[j])
        return out
