"""Per-operator models of sustainable throughput and peak memory.

Contract:
- ``OperatorModel(operator).fit(samples)`` fits on a window of that operator's
  ``BatchSample`` values and returns a ``FitReport``; every sample left out is listed in it
  with its reason (``anomaly.Filtered``), none is silently lost. Bad input never crashes
  inside scikit-learn: invalid samples are set aside with a message naming the field, and
  too little data gives ``status="no_model"`` (predictions then raise ``NoModelError``).
- ``throughput(config, replicas, features) -> Prediction(mean, std)`` is the sustainable
  throughput of the whole operator (all ``replicas`` replicas with ``config``) in items/s;
  ``per_replica`` is the same divided by ``replicas``; ``capacity_curve`` lists the
  prediction for 1..n replicas (concave when replicas contend, for the placement MILP).
  ``memory(config, features) -> Prediction`` is the peak memory of one replica in bytes
  (host memory for ``device="cpu"``, device memory otherwise); ``memory_upper(config, k)``
  is ``mean + k*std`` for the OOM guard of the optimiser. ``features`` are per-item
  workload features (e.g. pages per item); ``None`` means the current workload
  (``current_features``: the item-weighted mean of the windows begun last, so a straggler of an
  earlier workload, finishing late, does not stand for the work arriving now).
- A device (or a value of a categorical knob) no sample of the window ran with has no
  throughput prediction: ``NoModelError`` (a model of "cpu" cannot guess "gpu"; the optimiser
  must canary it). Numeric knobs and batch sizes are inter/extrapolated, with the uncertainty
  growing away from the data. Replica counts are interpolated only: outside the range of counts
  the training windows ran with, the per-replica rate is that of the nearest count seen, so
  throughput scales linearly in replicas beyond the evidence. A trend fitted over a narrow range
  is mostly the machine's load between ticks, and extrapolated it is wild: in the live video
  trace under ds2, safety fitted on 7-9 replicas predicted 1.0 items/s per replica at 4 (it did
  8.5) and 368 items/s for a single replica. Within the counts seen, the per-replica rate never
  rises with the count: a replica does not run faster because more run beside it, so a lower
  rate at fewer replicas is taken as the load of the moment they ran in (a weighted isotonic
  regression over the counts, each weighted by its training windows). ``capacity_lower`` is the
  capacity curve the placement's evidence gate uses: beyond the replicas running, a lower bound of
  the rate more replicas add relative to the running ones.

How throughput is measured ("sustainable", not the burst of one batch):
  samples of one (config, config_epoch) group are cut, in completion order, into windows
  of ``bin_size`` batches and at least ``min_window_busy_s`` of busy time (or a sixteenth of the
  group's busy time while it has less; 0.25 s: batches of a
  few milliseconds are timed to within the scheduler's wake-up jitter, which on a loaded machine
  is tens of milliseconds; in live traces 4-batch windows of 3 ms batches were off by up to 30x). A replica's busy interval for a batch is ``[end - busy_s, end]``;
  the union of those intervals per replica is the time the replica was really busy, so
  batches in flight at once (``inflight`` > 1, overlapping intervals) are not double
  counted and idle gaps (a starved replica) do not lower the figure. Per-replica rate =
  items / union busy seconds, summed over the window's replicas; replicas = distinct
  replicas of the group active during the window. Operator throughput = replicas x rate.

Model (deliberate design, to keep fit + predict of a 2,000-sample window well under 100 ms):
- Aggregation: windows of ``bin_size = max(4, ceil(n * (1 - 1/holdout_every) / max_gp_points))``
  batches, so every batch counts and about ``max_gp_points`` windows train the GP (2,000
  samples -> windows of 16). Every ``holdout_every``-th window (time order) is held out when
  there are >= 2 * holdout_every, and its mean absolute percentage error is the reported
  ``mape``. Should many small config groups still make more than ``max_gp_points`` training
  windows, the recent half and a stride sample of older ones are kept and the rest listed
  in ``FitReport.subsampled`` (so no sample goes unaccounted). Kernel
  hyperparameters are tuned by L-BFGS-B (bounded iterations: ``cold_iterations``, or
  ``warm_iterations`` when starting from the previous fit's optimum) on an evenly spaced
  subset of ``optimise_points`` windows; the GP is then conditioned exactly on all of them.
- Inputs (standardised): device one-hot (when several devices), log2 batch size,
  log1p cpus/gpus per replica, log2 replicas, numeric knobs (log2 when positive),
  categorical knobs one-hot, and the workload as log(work per item): a non-negative linear fit of seconds per
  item on the per-item features (``_work_weights``), so items mix as their costs add up.
- Target: log per-replica rate (positive, multiplicative noise). A weighted ridge
  regression on the inputs is the GP's prior mean (so extrapolation in batch size and features
  follows a log-linear trend; within the replica counts seen, with no evidence of contention
  throughput scales linearly in replicas; its replica-count slope is penalised 100x the others', so
  a workload that changed with the count is not taken for contention); a GaussianProcessRegressor with Constant*Matern(2.5, ARD)
  + WhiteKernel (bounded hyperparameters, normalised target) models the residual. The
  optimiser starts from the previous fit's hyperparameters (warm start).
- ``Prediction.mean`` is the log-normal median ``exp(mu)``, ``std`` the log-normal std.
- Memory: scikit-learn ``BayesianRidge`` per device on the physical basis of the cost
  model (peak = resident + a*items + sum_f b_f*feature_sum_f + knob terms), fitted on the ok
  batches (memory outliers are real risk, so they are not filtered; above
  ``max_memory_samples`` an even stride plus the 20 highest peaks); its predictive std
  includes parameter uncertainty, and a batch size outside the observed range widens it by
  ``memory_extrapolation * mean * |log(batch / nearest observed batch)|`` (no OOM-safety
  claim beyond the evidence).

Queue and in-flight awareness (``calibrate``): a batch's ``busy_s`` times it inside the
replica, so the busy-time rate is what the replicas could do if no time were lost between
batches and the workload of the finished batches lasted. ``calibrate(span)`` takes a
``occupancy.SaturatedSpan`` (the operator had work waiting and every serving replica held a
batch for seconds on end, so what it took is what it can do) and, when the measurement and the
model's prediction for those configs and for the work the span finished (the features of every
ok batch that ended in it, spikes included) disagree by more than ``calibration_tolerance`` (either
way; only downwards when the span finished nothing and its figure is an upper bound), scales
every throughput prediction (``throughput``, ``per_replica``, ``capacity_curve``,
``predict_many``) by measured / predicted: the capacity the model reports is what the operator
could do, for every consumer. A blocked or starved operator gives no span (idle replicas say
only that it could do more). Each refit re-derives the factor from the same span against the
new fit (a model that caught up with a new workload loses the correction, a systematic loss
between batches keeps it) while the span is at most ``calibration_max_age_s`` older than the
newest sample; ``forget_calibration()`` drops it (a regime change). ``log_residual`` stays on
the busy-time basis (the regime detector compares batches, not spans).

Anomalies (``scheduler.anomaly``): stage 1 drops transient spikes per (config, epoch)
group before windowing (rolling median/MAD of log seconds per item over the seconds per item
the batch's content explains, a non-negative linear fit on the batches' per-item features: a
batch of long documents is work, not a spike; the content-blind filter dropped the live
cpu-only trace's embed batches of 52 chunks per item, against 7.9 on average, and with them the
cost of long documents); stage 2 drops training
windows whose leave-one-out residual under the first GP fit is an outlier, then conditions
the GP again (same hyperparameters) without them. Both are listed in ``FitReport.filtered``.

Sample invalidation after a configuration change (``config_epoch``): samples are
*dropped* when the operator has re-measured the same OpConfig with the same number of
replicas in the current epoch (``Reason.SUPERSEDED``: fresh evidence of a point replaces
stale evidence of it) or when they are more than ``max_epoch_age`` epochs old
(``Reason.STALE_EPOCH``); otherwise samples of older epochs are *down-weighted*: their
windows carry extra noise variance ``stale_noise * age`` (in units of the normalised
target's variance) in the GP and weight ``1 / (1 + age)`` in the prior mean. Why: a
change alters the conditions an operator runs in (co-located replicas, caches, memory
pressure), so old figures must not steer predictions where fresh ones exist; but they are
still the only evidence about configs (and replica counts) not run since, which the
optimiser and the placement MILP's capacity curves need.
Memory samples are not invalidated (peak memory is a property of the config itself).
"""

from __future__ import annotations

import math
import time
import warnings
from collections import Counter
from copy import copy
from dataclasses import dataclass, replace
from typing import Mapping, NamedTuple, Sequence

import numpy as np
from scipy.optimize import isotonic_regression, minimize, nnls
from sklearn.exceptions import ConvergenceWarning
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import ConstantKernel, Kernel, Matern, WhiteKernel
from sklearn.linear_model import BayesianRidge

from trident_flows.scheduler.anomaly import (Filtered, Reason, count_reasons, group_codes, loo_outliers, robust_filter,
                                             span_slack, validate_sample)
from trident_flows.scheduler.blas import one_blas_thread
from trident_flows.scheduler.occupancy import SaturatedSpan
from trident_flows.core.types import CPU, BatchSample, OpConfig, Outcome


class NoModelError(RuntimeError):
    """A prediction was asked of a model that has no data for it (not fitted, unseen device)."""


class Prediction(NamedTuple):
    """A prediction with its uncertainty; ``upper(k)`` is ``mean + k * std``."""

    mean: float
    std: float

    def upper(self, k: float = 2.0) -> float:
        return self.mean + k * self.std


@dataclass(frozen=True)
class Window:
    """One aggregated window of batches of one (config, config_epoch) group."""

    indices: tuple[int, ...]
    config: OpConfig
    epoch: int
    replicas: int
    start: float
    end: float
    items: int
    busy_s: float
    per_replica_rate: float
    features: Mapping[str, float]
    utilisation: float

    @property
    def throughput(self) -> float:
        """Measured sustainable throughput of the operator in this window (items/s)."""
        return self.replicas * self.per_replica_rate


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


@dataclass(frozen=True)
class _Encoder:
    """Turns (config, replicas, per-item features) into the model's numeric inputs."""

    devices: tuple[str, ...]
    numeric_knobs: tuple[tuple[str, bool], ...]          # (name, log2)
    categorical_knobs: tuple[tuple[str, tuple[str, ...]], ...]
    features: tuple[str, ...]
    work: tuple[float, ...] = ()     # seconds per item = work[0] + sum_f work[1 + f] * feature f per item (``_work_weights``)

    @classmethod
    def build(cls, configs: Sequence[OpConfig], features: Sequence[str]) -> "_Encoder":
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
        return np.log(np.maximum(w[0] + feats @ w[1:], _WORK_FLOOR * max(w[0], float(w[1:].max(initial=0.0)), 1e-12)))[:, None]


@dataclass(frozen=True)
class _ThroughputFit:
    encoder: _Encoder
    x_mean: np.ndarray
    x_scale: np.ndarray
    coef: np.ndarray
    intercept: float
    gp: GaussianProcessRegressor
    counts_seen: tuple[float, ...] = ()  # every replica count of the training windows, ascending (set once they are chosen)
    count_windows: tuple[int, ...] = ()  # training windows at each of ``counts_seen``

    @property
    def replicas_seen(self) -> tuple[float, float]:
        """Fewest and most replicas of the training windows (predictions clamp to it); no clamp before they are known."""
        return (self.counts_seen[0], self.counts_seen[-1]) if self.counts_seen else (1.0, math.inf)


@dataclass(frozen=True)
class _MemoryFit:
    model: BayesianRidge
    knobs: tuple[str, ...]
    features: tuple[str, ...]
    col_scale: np.ndarray
    batch_range: tuple[int, int]


_MIB = float(2**20)
# The prior mean's ridge penalty on the replica-count input (1 on the others): counts change when workloads do, so a
# slope shared by the two goes to the workload. Penalised like the rest, one OCR replica on short documents then two on
# long ones made one replica predicted 12x faster per replica than two on long documents (a capacity curve flat beyond
# one); the GP on the residual still learns the contention the windows show at one workload. The price: contention that
# arrives together with a heavier workload is first taken for the workload (an operator whose total falls beyond 2
# replicas, scaled to 6 as its items turned 3x heavier, was given a 7th, which verification rolled back).
_REPLICA_PENALTY = 100.0
_UNSEEN_COUNT_WEIGHT = 1e-3   # a replica count no training window ran with follows the counts that did (``_never_faster_with_more``)
_WORK_FLOOR = 1e-3   # the work input's floor, relative to the largest weight (features of 0 with no per-item intercept)


class OperatorModel:
    """Anomaly-filtered GP models of one operator (see the module docstring)."""

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
        self._tp: _ThroughputFit | None = None
        self._mem: dict[str, _MemoryFit] = {}
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
        filtered, ok, mem_ok, ooms = self._screen(samples)
        self._finished = tuple(samples[i] for i in ok)
        epoch = max((samples[i].config_epoch for i in ok), default=0) if current_epoch is None else current_epoch

        self._mem = self._fit_memory(samples, mem_ok)
        ok, age = self._invalidate(samples, ok, epoch, filtered)
        common = dict(operator=self.operator, n_samples=len(samples), memory_samples=len(mem_ok), current_epoch=epoch,
                      ooms=tuple(sorted(ooms, key=OpConfig.label)))
        if not ok:
            return self._no_model(common, filtered, "no usable ok samples in the window", t0)

        feature_names = tuple(sorted({f for i in ok for f in samples[i].features}))
        latest_end = max(samples[i].end for i in ok)
        sums = np.array([[samples[i].features.get(f, 0.0) for f in feature_names] for i in ok], dtype=float).reshape(len(ok), len(feature_names))
        ok, groups, sums = self._drop_spikes(samples, ok, sums, filtered)
        windows, bin_size = self._windows(samples, ok, groups, sums, feature_names, filtered)
        if len(windows) < 2:
            return self._no_model(common, filtered, f"{len(ok)} usable sample(s) make {len(windows)} window(s); need >= 2", t0)

        windows.sort(key=lambda w: w.end)
        hold = len(windows) >= 2 * self.holdout_every
        held = [w for k, w in enumerate(windows) if hold and k % self.holdout_every == 2]
        train = [w for k, w in enumerate(windows) if not (hold and k % self.holdout_every == 2)]
        train, dropped = self._subsample(train)
        encoder = replace(_Encoder.build([w.config for w in windows], feature_names), work=_work_weights(train, feature_names))
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

    def _screen(self, samples: Sequence[BatchSample]) -> tuple[list[Filtered], list[int], list[int], set[OpConfig]]:
        """Sort the window's samples: (filtered with their reason, OK ones, OK ones with a memory peak, configs
        that ran out of memory). A sample that is not this operator's ``BatchSample`` raises."""
        for i, s in enumerate(samples):
            if not isinstance(s, BatchSample):
                raise TypeError(f"samples[{i}] is a {type(s).__name__}, expected BatchSample")
            if s.operator != self.operator:
                raise ValueError(f"samples[{i}] belongs to operator {s.operator!r}, this model is for {self.operator!r}")
        filtered: list[Filtered] = []
        ok: list[int] = []
        mem_ok: list[int] = []
        ooms: set[OpConfig] = set()
        valid = _quick_valid(samples)
        for i, s in enumerate(samples):
            problem = None if valid[i] else validate_sample(s)
            if problem is not None:
                filtered.append(Filtered(i, Reason.INVALID, problem))
            elif s.outcome != Outcome.OK:
                filtered.append(Filtered(i, Reason.OUTCOME, f"outcome={s.outcome.value}" + (f": {s.error}" if s.error else "")))
                if s.outcome == Outcome.OOM:
                    ooms.add(s.config)
            else:
                ok.append(i)
                if (s.peak_host_mem_bytes if s.config.device == CPU else s.peak_device_mem_bytes) > 0:
                    mem_ok.append(i)
        return filtered, ok, mem_ok, ooms

    def _drop_spikes(self, samples: Sequence[BatchSample], ok: list[int], sums: np.ndarray,
                     filtered: list[Filtered]) -> tuple[list[int], np.ndarray, np.ndarray]:
        """Drop transient outliers of busy time per item within each (config, epoch) group (``robust_filter``)
        after what each batch's content (``sums``: its feature sums, a row per index of ``ok``) explains
        (``_content_work``: a batch of heavy items is work, not a spike). Returns the kept indices, their group
        codes and their rows of ``sums``."""
        cfg_code: dict[OpConfig, int] = {}
        items = np.array([samples[i].items_in for i in ok], dtype=float)
        busy = np.array([samples[i].busy_s for i in ok], dtype=float)
        end = np.array([samples[i].end for i in ok], dtype=float)
        groups = group_codes([(cfg_code.setdefault(samples[i].config, len(cfg_code)), samples[i].config_epoch) for i in ok])
        per_item = busy / items
        if sums.shape[1]:
            per_item = per_item / _content_work(sums / items[:, None], per_item, groups)
        spikes = robust_filter(np.log(per_item), groups, end, k=self.spike_k)
        for j in np.flatnonzero(spikes):
            filtered.append(Filtered(ok[j], Reason.SPIKE, f"busy_s={busy[j]:.4g} for {int(items[j])} items is a transient outlier"))
        keep = np.flatnonzero(~spikes)
        return [ok[j] for j in keep], groups[keep], sums[keep]

    def _fit_throughput(self, encoder: _Encoder, train: list[Window], ages: Sequence[float], feature_names: tuple[str, ...],
                        filtered: list[Filtered]) -> tuple[_ThroughputFit, list[Window]]:
        """The GP of log per-replica rate on the training windows; windows that are leave-one-out outliers against
        it are filtered and the GP refitted without them (kernel kept). Returns the fit and the windows it used."""
        X = encoder.encode([w.config for w in train], np.array([w.replicas for w in train], float), _feature_matrix(train, feature_names))
        y = np.log([w.per_replica_rate for w in train])
        ages = np.array(ages, dtype=float)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            warnings.simplefilter("ignore", RuntimeWarning)
            fit = self._fit_gp(encoder, X, y, ages, self._start_kernel(X.shape[1]), optimise=True)
            outliers = loo_outliers(fit.gp.L_, fit.gp.alpha_, float(np.atleast_1d(fit.gp._y_train_std)[0]), k=self.residual_k)
            if outliers.any() and (~outliers).sum() >= 2:
                for w in (train[j] for j in np.flatnonzero(outliers)):
                    filtered += [Filtered(i, Reason.RESIDUAL, f"window ending {w.end:.3f} is an outlier against the first fit") for i in w.indices]
                keep = ~outliers
                train = [w for w, k in zip(train, keep) if k]
                fit = self._fit_gp(encoder, X[keep], y[keep], ages[keep], fit.gp.kernel_, optimise=False)
        per_count = Counter(float(w.replicas) for w in train)
        counts = sorted(per_count)
        return replace(fit, counts_seen=tuple(counts), count_windows=tuple(per_count[c] for c in counts)), train

    def _held_out(self, held: list[Window], feature_names: tuple[str, ...]) -> tuple[HeldOut, ...]:
        """The fitted model's predictions for the held-out windows, against what they measured."""
        if not held:
            return ()
        mean, std = self._predict_log([w.config for w in held], np.array([w.replicas for w in held], float), _feature_matrix(held, feature_names))
        return tuple(HeldOut(w, *_lognormal(m, s, w.replicas)) for w, m, s in zip(held, mean, std))

    def _no_model(self, common: dict, filtered: list[Filtered], reason: str, t0: float) -> FitReport:
        self._tp = None
        self.calibration = None
        self.report = FitReport(status="no_model", reason=reason, fitted_on=(), filtered=tuple(filtered), filtered_counts=count_reasons(filtered),
                                downweighted=0, windows=0, bin_size=0, subsampled=(), held_out=(), mape=None, current_features={}, kernel="",
                                fit_ms=(time.perf_counter() - t0) * 1e3, **common)
        return self.report

    def _invalidate(self, samples: Sequence[BatchSample], ok: list[int], epoch: int, filtered: list[Filtered]) -> tuple[list[int], dict]:
        """Apply the config-epoch rule; return the surviving indices and each (config, epoch) group's age."""
        replicas: dict[tuple[OpConfig, int], set[str]] = {}
        for i in ok:
            replicas.setdefault((samples[i].config, samples[i].config_epoch), set()).add(samples[i].replica_id)
        fresh = {(c, len(r)) for (c, e), r in replicas.items() if e >= epoch}
        kept, age = [], {}
        for i in ok:
            s = samples[i]
            a = max(0, epoch - s.config_epoch)
            n = len(replicas[(s.config, s.config_epoch)])
            if a > 0 and (s.config, n) in fresh:
                filtered.append(Filtered(i, Reason.SUPERSEDED, f"config_epoch {s.config_epoch} < {epoch} and {s.config.label()} x{n} was re-measured since"))
            elif a > self.max_epoch_age:
                filtered.append(Filtered(i, Reason.STALE_EPOCH, f"config_epoch {s.config_epoch} is {a} epochs old (max {self.max_epoch_age})"))
            else:
                kept.append(i)
                age[(s.config, s.config_epoch)] = a
        return kept, age

    def _windows(self, samples: Sequence[BatchSample], ok: list[int], groups: np.ndarray, feature_sums: np.ndarray,
                 feature_names: tuple[str, ...], filtered: list[Filtered]) -> tuple[list[Window], int]:
        n = len(ok)
        bin_size = max(4, math.ceil(n * (1 - 1 / self.holdout_every) / self.max_gp_points)) if n >= 16 else max(1, n // 4)
        end = np.array([samples[i].end for i in ok])
        busy = np.array([samples[i].busy_s for i in ok])
        first = end - busy
        replica = group_codes([samples[i].replica_id for i in ok])
        items_in = np.array([samples[i].items_in for i in ok], dtype=float)
        # busy time each batch adds to its replica's union of busy intervals, one (group, replica) run at a
        # time in start order (a 256-node window holds hundreds of replicas: masks per replica were most of a fit)
        contrib = np.zeros(n)
        order = np.lexsort((first, replica, groups))
        run_starts = np.flatnonzero(np.r_[True, (np.diff(groups[order]) != 0) | (np.diff(replica[order]) != 0)])
        spans: dict[int, tuple[list[float], list[float]]] = {}  # group -> its replicas' (first starts, last ends)
        for a, b in zip(run_starts, np.r_[run_starts[1:], n]):
            idx = order[a:b]
            prev_end = np.concatenate([[-np.inf], np.maximum.accumulate(end[idx])[:-1]])
            contrib[idx] = np.maximum(0.0, end[idx] - np.maximum(first[idx], prev_end))
            lo, hi = spans.setdefault(int(groups[idx[0]]), ([], []))
            lo.append(float(first[idx].min()))
            hi.append(float(end[idx].max()))
        windows = []
        for g in np.unique(groups):
            idx = np.flatnonzero(groups == g)
            idx = idx[np.argsort(end[idx], kind="stable")]
            span_lo, span_hi = (np.array(v) for v in spans[int(g)])
            cuts = self._cuts(contrib[idx], bin_size)
            for a, b in zip(cuts, cuts[1:] + [idx.size]):
                part = idx[a:b]
                busy_total = float(contrib[part].sum())
                items = int(items_in[part].sum())
                if busy_total <= 0:
                    filtered += [Filtered(ok[j], Reason.INVALID, "busy interval lies inside another batch's of the same replica") for j in part]
                    continue
                w0, w1 = float(first[part].min()), float(end[part].max())
                reps = int(np.count_nonzero((span_lo < w1) & (span_hi > w0))) or 1
                s0 = samples[ok[part[0]]]
                feats = dict(zip(feature_names, (feature_sums[part].sum(axis=0) / items).tolist()))
                windows.append(Window(tuple(ok[j] for j in part), s0.config, s0.config_epoch, reps, w0, w1, items, busy_total,
                                      items / busy_total, feats, min(1.0, busy_total / (reps * max(w1 - w0, 1e-9)))))
        return windows, bin_size

    def _cuts(self, busy: np.ndarray, bin_size: int) -> list[int]:
        """Window starts over one group's batches (completion order): ``bin_size`` batches and at least
        ``min_window_busy_s`` of busy time each (a sixteenth of the group's busy time while it has
        less than sixteen times that, so a new operator gets windows, if noisy ones, at once); a short tail
        joins the window before it."""
        least = min(self.min_window_busy_s, float(busy.sum()) / 16)
        cuts, count, acc = [0], 0, 0.0
        for k, b in enumerate(busy):
            count += 1
            acc += float(b)
            if count >= bin_size and acc >= least and k + 1 < busy.size:
                cuts.append(k + 1)
                count, acc = 0, 0.0
        if len(cuts) > 1 and (count < max(1, bin_size // 2) or acc < least / 2):
            cuts.pop()
        return cuts

    def _subsample(self, train: list[Window]) -> tuple[list[Window], list[Window]]:
        """At most ``max_gp_points`` windows: the recent half and a stride sample of older ones; and the rest."""
        if len(train) <= self.max_gp_points:
            return train, []
        recent = self.max_gp_points // 2
        old = train[:-recent]
        pick = set(np.linspace(0, len(old) - 1, self.max_gp_points - recent).round().astype(int).tolist())
        return [w for k, w in enumerate(old) if k in pick] + train[-recent:], [w for k, w in enumerate(old) if k not in pick]

    def _start_kernel(self, d: int) -> Kernel:
        """The previous fit's kernel when the inputs match (warm start), else a fresh bounded one."""
        if self._kernel is not None and _kernel_dims(self._kernel) == d:
            return self._kernel
        return (ConstantKernel(0.5, (1e-3, 1e2)) * Matern(length_scale=np.full(d, 2.0), length_scale_bounds=(5e-2, 1e3), nu=2.5)
                + WhiteKernel(0.05, (1e-5, 1.0)))

    def _fit_gp(self, encoder: _Encoder, X: np.ndarray, y: np.ndarray, ages: np.ndarray, kernel: Kernel, optimise: bool) -> _ThroughputFit:
        x_mean = X.mean(axis=0)
        x_scale = X.std(axis=0)
        x_scale[x_scale < 1e-9] = 1.0
        Z = (X - x_mean) / x_scale
        weights = 1.0 / (1.0 + ages)
        # weighted ridge prior mean (intercept unpenalised)
        wz_mean = np.average(Z, axis=0, weights=weights)
        wy_mean = float(np.average(y, weights=weights))
        Zc, yc = Z - wz_mean, y - wy_mean
        penalty = np.ones(Z.shape[1])
        penalty[encoder.replicas_column] = _REPLICA_PENALTY
        A = (Zc * weights[:, None]).T @ Zc + np.diag(penalty)
        coef = np.linalg.solve(A, (Zc * weights[:, None]).T @ yc)
        intercept = wy_mean - float(wz_mean @ coef)
        resid = y - (Z @ coef + intercept)
        alpha = 1e-8 + self.stale_noise * ages
        if optimise:
            # hyperparameters on an evenly spaced subset (O(n^2 d) per L-BFGS step), then one exact fit on all
            sub = np.unique(np.linspace(0, len(y) - 1, min(len(y), self.optimise_points)).round().astype(int))
            iterations = self.warm_iterations if kernel is self._kernel else self.cold_iterations
            tuned = GaussianProcessRegressor(kernel=kernel, alpha=alpha[sub], normalize_y=True, optimizer=_lbfgs(iterations))
            kernel = tuned.fit(Z[sub], resid[sub]).kernel_
        gp = GaussianProcessRegressor(kernel=kernel, alpha=alpha, normalize_y=True, optimizer=None)
        gp.fit(Z, resid)
        return _ThroughputFit(encoder, x_mean, x_scale, coef, intercept, gp)

    def _fit_memory(self, samples: Sequence[BatchSample], idx: list[int]) -> dict[str, _MemoryFit]:
        fits: dict[str, _MemoryFit] = {}
        by_device: dict[str, list[int]] = {}
        for i in idx:
            by_device.setdefault(samples[i].config.device, []).append(i)
        for device, ids in by_device.items():
            if len(ids) < 2:
                continue
            if len(ids) > self.max_memory_samples:
                # an even stride over the window plus its highest peaks (OOM safety leans on the peaks)
                peak = np.array([samples[i].peak_host_mem_bytes if device == CPU else samples[i].peak_device_mem_bytes for i in ids])
                pick = set(np.linspace(0, len(ids) - 1, self.max_memory_samples).round().astype(int)) | set(np.argsort(peak)[-20:])
                ids = [ids[k] for k in sorted(pick)]
            feats = tuple(sorted({f for i in ids for f in samples[i].features}))
            knobs = tuple(sorted({k for i in ids for k, v in samples[i].config.knobs if isinstance(v, (int, float))}))
            knob_rows = {c: _knob_values(c, knobs) for c in {samples[i].config for i in ids}}
            B = np.array([[float(samples[i].items_in)] + [samples[i].features.get(f, 0.0) for f in feats] + knob_rows[samples[i].config]
                          for i in ids], dtype=float)
            scale = np.abs(B).max(axis=0)
            scale[scale == 0] = 1.0
            y = np.array([(samples[i].peak_host_mem_bytes if device == CPU else samples[i].peak_device_mem_bytes) for i in ids], float) / _MIB
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = BayesianRidge(fit_intercept=True).fit(B / scale, y)
            sizes = [samples[i].config.batch_size for i in ids]
            fits[device] = _MemoryFit(model, knobs, feats, scale, (min(sizes), max(sizes)))
        return fits

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

    def _require(self, configs: Sequence[OpConfig]) -> _ThroughputFit:
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
        Z = _standardised(fit, configs, replicas, feats)
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
        mean, std = _lognormal(mu[rows], s[rows], reps)
        return np.asarray(mean), np.asarray(std)

    def _never_faster_with_more(self, fit: _ThroughputFit, uniq: Sequence[OpConfig], distinct: np.ndarray, mu: np.ndarray,
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
            _, cov = fit.gp.predict(_standardised(fit, [config] * len(points), points, feats), return_cov=True)
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
        row = np.array(_memory_row(config.batch_size, {n: v * config.batch_size for n, v in f.items()}, config, fit.features, fit.knobs)) / fit.col_scale
        m = fit.model   # BayesianRidge's predictive mean and std (as its predict(return_std=True)), without per-call validation
        mean = float(row @ m.coef_ + m.intercept_)
        centred = row - m.X_offset_
        std = math.sqrt(float(centred @ m.sigma_ @ centred) + 1.0 / m.alpha_)
        lo, hi = fit.batch_range
        outside = max(math.log(lo / config.batch_size), math.log(config.batch_size / hi), 0.0)
        std += abs(mean) * outside * self.memory_extrapolation
        return Prediction(max(mean, 0.0) * _MIB, std * _MIB)

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
        surely_valid = _quick_valid(samples)
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


def _quick_valid(samples: Sequence[BatchSample]) -> np.ndarray:
    """Vectorised version of ``validate_sample`` for the common case: True where the sample is surely valid
    (the rest go through ``validate_sample``, which names the bad field)."""
    try:
        a = np.array([(s.start, s.end, s.busy_s, s.items_in, s.peak_host_mem_bytes, s.peak_device_mem_bytes,
                       sum(s.features.values()) if s.features else 0.0, min(s.features.values(), default=0.0),
                       float(type(s.items_in) is int)) for s in samples], dtype=float).reshape(len(samples), 9)
    except (TypeError, ValueError):
        return np.zeros(len(samples), dtype=bool)
    with np.errstate(invalid="ignore"):
        return (np.isfinite(a).all(axis=1) & (a[:, 2] > 0) & (a[:, 1] >= a[:, 0]) & (a[:, 2] <= a[:, 1] - a[:, 0] + span_slack(a[:, 1] - a[:, 0], a[:, 1]))
                & (a[:, 3] >= 1) & (a[:, 4] >= 0) & (a[:, 5] >= 0) & (a[:, 7] >= 0) & (a[:, 8] == 1))


def _lbfgs(maxiter: int):
    """L-BFGS-B on the log marginal likelihood with a bounded number of iterations."""
    def optimise(obj_func, initial_theta, bounds):
        result = minimize(obj_func, initial_theta, method="L-BFGS-B", jac=True, bounds=bounds, options={"maxiter": maxiter})
        return result.x, result.fun
    return optimise


def _work_weights(windows: Sequence[Window], names: Sequence[str]) -> tuple[float, ...]:
    """Seconds per item as a non-negative linear function of the per-item features (``[intercept, weight per
    feature]``), fitted by NNLS in relative error on the training windows, with an intercept of each
    (config, replica count) of its own (a batch's fixed cost and the replicas' contention differ between
    them; the returned intercept is their median). The model's workload input is the log of that work, not
    each feature apart: a batch's time is a sum over its items, so a window of mixed items runs at the
    harmonic mean of their rates, which a trend in log features cannot give. On the live document trace an
    OCR window of five short-document batches and one of scans (0.14 scanned pages per item) took 49 items/s
    where the log-feature model, fitted on windows of either kind, predicted 354."""
    if not names or not windows:
        return ()
    spi = np.array([1.0 / w.per_replica_rate for w in windows])
    groups = group_codes([(w.config, w.replicas) for w in windows])
    intercepts, features = _nnls_work(_feature_matrix(windows, names), spi, groups)
    intercept = float(np.median(intercepts[groups]))
    if intercept <= 0 and not features.any():
        intercept = float(np.median(spi))
    return (intercept, *(float(x) for x in features))


def _nnls_work(F: np.ndarray, spi: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Seconds per item ``spi`` as ``intercept[group] + F @ weights`` (per-item features ``F``), every term
    non-negative, fitted by NNLS in relative error. Returns (intercept per group code, weight per feature)."""
    G = np.eye(int(groups.max()) + 1)[groups]
    A = np.column_stack([G, F]) / spi[:, None]
    scale = np.abs(A).max(axis=0)
    scale[scale == 0] = 1.0
    weights, _ = nnls(A / scale, np.ones(len(spi)))
    weights = weights / scale
    return weights[:G.shape[1]], weights[G.shape[1]:]


def _content_work(F: np.ndarray, spi: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Per batch, the seconds per item its content explains (``_nnls_work`` over the batches themselves),
    floored at a thousandth of the median seconds per item so a batch the fit gives no work stays finite."""
    intercepts, weights = _nnls_work(F, spi, groups)
    return np.maximum(intercepts[groups] + F @ weights, 1e-3 * float(np.median(spi)))


def _feature_matrix(windows: Sequence[Window], names: Sequence[str]) -> np.ndarray:
    return np.array([[w.features[f] for f in names] for w in windows], dtype=float).reshape(len(windows), len(names))


def _standardised(fit: _ThroughputFit, configs: Sequence[OpConfig], replicas: np.ndarray, feats: np.ndarray) -> np.ndarray:
    """The GP's standardised inputs for ``configs`` at ``replicas`` (clamped to the counts seen: the per-replica rate is
    flat beyond them, module docstring) and per-item features ``feats``."""
    replicas = np.clip(replicas, *fit.replicas_seen)
    return (fit.encoder.encode(configs, replicas, feats) - fit.x_mean) / fit.x_scale


def _lognormal(mu, s, replicas):
    """Median and std of ``replicas * exp(N(mu, s^2))``."""
    median = np.exp(mu) * replicas
    return median, median * np.sqrt(np.expm1(np.square(s)))


def _kernel_dims(kernel: Kernel) -> int:
    for value in kernel.get_params().values():
        if isinstance(value, Matern):
            return np.atleast_1d(value.length_scale).size
    return -1


def _knob_values(config: OpConfig, knobs: Sequence[str]) -> list[float]:
    values = config.knob_dict
    return [float(values.get(k, 0.0)) for k in knobs]


def _memory_row(items: float, feature_sums: Mapping[str, float], config: OpConfig, feats: Sequence[str], knobs: Sequence[str]) -> list[float]:
    return [float(items)] + [float(feature_sums.get(f, 0.0)) for f in feats] + _knob_values(config, knobs)
