"""The memory constraint of one operator: what its peak memory will be, and where it is safe.

Contract:
- ``MemoryBudget``: the bytes one replica may use (host memory for ``device="cpu"`` replicas,
  device memory for accelerator ones); ``limit(device, margin)`` is the budget shrunk by the
  safety margin, under which the optimiser keeps every proposal's memory upper bound.
- ``MemoryModel``: peak memory of one device's replicas as resident + working set (a GP of log
  working set whose prior mean scales with the batch's work, so it errs high far from data);
  ``predict``, ``upper`` (bytes, an upper bound at ``k`` std) and ``p_feasible`` under a limit.
- An OOM is a censored measurement ("memory >= budget"); ``OomRegion`` marks the OOM'd config and
  every larger batch with the same device and knobs unsafe (``blocked``).
- Features are PER ITEM (``per_item``: a batch's summed features over its items).
- ``FeatureWindow.worst(batch_size)``: the per-item workload the safety check assumes for a batch
  of that size (a quantile of a batch's per-item mean, tighter for larger batches).
Pure Python (numpy, scikit-learn); no Ray.
"""

from __future__ import annotations

import math
import warnings
from collections import deque
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence, Union

import numpy as np
from scipy.stats import norm
from sklearn.exceptions import ConvergenceWarning
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import ConstantKernel, Kernel, Matern, WhiteKernel

from trident_flows.core.types import CPU, ConfigSpace, KnobSpace, OpConfig


@dataclass(frozen=True)
class MemoryBudget:
    """Bytes one replica may use: ``cpu_bytes`` of host memory for CPU replicas, ``gpu_bytes``
    of device memory for accelerator replicas (``None``: that kind of replica is not allowed)."""

    cpu_bytes: int | None = None
    gpu_bytes: int | None = None

    def __post_init__(self) -> None:
        for name in ("cpu_bytes", "gpu_bytes"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"MemoryBudget.{name} must be a positive number of bytes or None, got {value!r}")

    def for_device(self, device: str) -> float:
        """The budget of a replica on ``device``; ``ValueError`` naming the field when unset."""
        field_name = "cpu_bytes" if device == CPU else "gpu_bytes"
        value = getattr(self, field_name)
        if value is None:
            raise ValueError(f"MemoryBudget has no {field_name}, but the config space includes device {device!r}: "
                             f"set MemoryBudget({field_name}=...) or remove {device!r} from ConfigSpace.devices")
        return float(value)

    def limit(self, device: str, margin: float) -> float:
        """The budget shrunk by the safety margin: ``budget * (1 - margin)``."""
        return self.for_device(device) * (1.0 - margin)


#: per-item features: one mapping for every config, or one per config
Features = Union[Mapping[str, float], Sequence[Mapping[str, float]]]


def per_item(features: Mapping[str, float], items: int) -> dict[str, float]:
    """A batch's summed features divided by its item count (the per-item features models use)."""
    n = max(int(items), 1)
    return {k: float(v) / n for k, v in features.items()}


class FeatureWindow:
    """The last ``size`` per-item feature vectors (with their item counts); ``worst(batch_size)``
    is the per-feature ``quantile`` of a batch's per-item mean: the per-item workload the safety
    check assumes for a batch of that size (memory grows with input size).

    A batch's memory follows the SUM of its items' features, so its per-item mean varies like
    ``sd / sqrt(batch_size)``: from rows with item counts the window estimates the per-item mean
    ``mu`` (item-weighted) and the per-item variance ``s2 = sum n_i (x_i - mu)^2 / (rows - 1)``
    (batch means of different sizes give it), and ``worst(b)`` is the ``quantile`` of a batch mean
    with mean ``c`` and variance ``s2 * (1/b + 1/N)``, taken from the lognormal with those moments
    (right-skewed like sizes; the normal when ``c <= 0``). The centre ``c`` is the larger of ``mu``
    and the item-weighted mean of the last ``RECENT`` rows, ``N`` the items behind it (its own
    uncertainty), so a workload whose items grow is checked at its recent level, and the drift also
    widens ``s2``. A large batch is thus checked against a tighter worst case than a small one.
    Rows without an item count (or all rows while fewer than 2 are counted) give no per-item
    spread: their ``quantile`` counts at face value for every batch size (no tightening), and
    ``worst`` is the larger of both."""

    #: rows whose mean is the centre when it is above the whole window's (a growing workload)
    RECENT = 8

    def __init__(self, quantile: float = 0.95, size: int = 256) -> None:
        if not 0.5 <= quantile < 1.0:
            raise ValueError(f"feature_quantile must be in [0.5, 1), got {quantile}")
        if size < 1:
            raise ValueError(f"feature window size must be >= 1, got {size}")
        self.quantile = quantile
        self._z = float(norm.ppf(quantile))
        self._rows: deque[tuple[dict[str, float], int | None]] = deque(maxlen=size)
        self._worst: dict[int, dict[str, float]] = {}  # batch size -> worst(); emptied by add()

    def add(self, features: Mapping[str, float], items: int | None = None) -> None:
        """Add per-item ``features`` averaged over ``items`` items (``None``: unknown)."""
        if items is not None and items < 1:
            raise ValueError(f"features must be averaged over >= 1 items, got items={items!r}")
        if features:
            self._rows.append(({k: float(v) for k, v in features.items()}, None if items is None else int(items)))
            self._worst.clear()

    def add_batches(self, batches: Sequence[tuple[Mapping[str, float], int]]) -> None:
        """``add(per_item(features, items), items)`` of each batch's (summed features, items), in order. Only
        the batches that end in the window (its last ``size`` with features) are converted and added: a
        tick of an 8-node run brings thousands per operator, and adding each was most of the optimiser's step."""
        small = [items for _, items in batches if items < 1]
        if small:
            raise ValueError(f"features must be averaged over >= 1 items, got items={small[0]!r}")
        tail: list[tuple[Mapping[str, float], int]] = []
        for features, items in reversed(batches):
            if len(tail) == self._rows.maxlen:
                break
            if features:
                tail.append((features, items))
        for features, items in reversed(tail):
            self.add(per_item(features, items), items)

    def worst(self, batch_size: int = 1) -> dict[str, float]:
        """Per feature, the ``quantile`` of the per-item mean of a batch of ``batch_size`` items."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
        if batch_size not in self._worst:  # the safety checks ask for the same few batch sizes many times between adds
            names = sorted({k for row, _ in self._rows for k in row})
            self._worst[batch_size] = {k: self._worst_one(k, batch_size) for k in names}
        return dict(self._worst[batch_size])

    def _worst_one(self, name: str, batch_size: int) -> float:
        counted = [(row.get(name, 0.0), n) for row, n in self._rows if n is not None]
        # rows at face value: those without an item count, or all rows while fewer than 2 are counted
        face = [row.get(name, 0.0) for row, n in self._rows if n is None or len(counted) < 2]
        bounds = [float(np.quantile(face, self.quantile, method="higher"))] if face else []
        if len(counted) >= 2:
            x = np.array([v for v, _ in counted])
            w = np.array([n for _, n in counted], dtype=float)
            mu = float(np.sum(w * x) / w.sum())
            s2_item = float(np.sum(w * (x - mu) ** 2)) / (len(x) - 1)
            recent_x, recent_w = x[-self.RECENT:], w[-self.RECENT:]
            recent = float(np.sum(recent_w * recent_x) / recent_w.sum())
            centre, n_centre = (recent, recent_w.sum()) if recent > mu else (mu, w.sum())
            var = s2_item * (1.0 / batch_size + 1.0 / n_centre)
            if centre > 0:  # lognormal with this mean and variance (sizes are right-skewed)
                s2 = math.log1p(var / centre**2)
                bounds.append(math.exp(math.log(centre) - s2 / 2 + self._z * math.sqrt(s2)))
            else:
                bounds.append(centre + self._z * math.sqrt(var))
        return max(bounds)


class ConfigEncoder:
    """Numeric coordinates of an OpConfig within its space: batch size on a log scale in [0, 1],
    numeric knobs in [0, 1] (log scale where the knob says so), categorical knobs one-hot."""

    def __init__(self, space: ConfigSpace) -> None:
        self.space = space

    def batch_coord(self, batch_size: int) -> float:
        lo, hi = math.log(self.space.batch_size_min), math.log(self.space.batch_size_max)
        return 0.0 if hi == lo else (math.log(batch_size) - lo) / (hi - lo)

    @staticmethod
    def knob_value(knob: KnobSpace, config: OpConfig):
        """The config's value of ``knob``; a config without it has the knob's default (low end / first choice)."""
        value = config.knob(knob.name)
        if value is None:
            return knob.choices[0] if knob.kind == "categorical" else knob.low
        return value

    @staticmethod
    def _unit(knob: KnobSpace, value: float) -> float:
        lo, hi, v = float(knob.low), float(knob.high), float(value)
        if knob.log and lo > 0:
            lo, hi, v = math.log(lo), math.log(hi), math.log(max(v, 1e-300))
        return 0.0 if hi == lo else (v - lo) / (hi - lo)

    def knob_vector(self, config: OpConfig) -> list[float]:
        out: list[float] = []
        for knob in self.space.knobs:
            value = self.knob_value(knob, config)
            if knob.kind == "categorical":
                out.extend(1.0 if str(value) == str(c) else 0.0 for c in knob.choices)
            else:
                out.append(self._unit(knob, value))
        return out

    def knob_steps(self, a: OpConfig, b: OpConfig) -> tuple[float, int]:
        """(largest numeric knob distance in [0, 1], number of categorical knobs that differ)."""
        numeric, categorical = 0.0, 0
        for knob in self.space.knobs:
            va, vb = self.knob_value(knob, a), self.knob_value(knob, b)
            if knob.kind == "categorical":
                categorical += str(va) != str(vb)
            else:
                numeric = max(numeric, abs(self._unit(knob, va) - self._unit(knob, vb)))
        return numeric, categorical

    def seed(self, device: str) -> OpConfig:
        """The smallest configuration of ``device``: smallest batch, numeric knobs at their low end,
        categorical knobs at their first choice (list the lightest choice first)."""
        knobs = {k.name: (k.choices[0] if k.kind == "categorical" else (int(k.low) if k.kind == "int" else float(k.low)))
                 for k in self.space.knobs}
        return self.space.config(device, self.space.batch_size_min, **knobs)


@dataclass(frozen=True)
class OomRegion:
    """Unsafe for good (in this regime): ``device`` with ``knobs`` at batch size >= ``batch_size``."""

    device: str
    knobs: tuple
    batch_size: int

    @classmethod
    def above(cls, config: OpConfig) -> "OomRegion":
        return cls(config.device, config.knobs, config.batch_size)

    def contains(self, config: OpConfig) -> bool:
        return config.device == self.device and config.knobs == self.knobs and config.batch_size >= self.batch_size


class MemoryModel:
    """GP of log peak memory of one device's replicas, as ``R + W``.

    R is the resident part (the smallest resident memory reported, i.e. a warm replica before its
    first batch; 0 when never reported) and W the working set of a batch. log W is a Gaussian
    process (scikit-learn) over the config encoding (log batch size, knobs); the per-item workload
    features enter through its prior mean ``theta + log(batch_size * prod_f feature_f)``: a working
    set proportional to the batch's work, ``theta`` the largest working set per unit of work
    measured. For ``W = per_item * work`` (plus anything sublinear) that extrapolation is an upper
    bound, so far from data the model errs on the high side; the GP learns the residual near
    measurements. Peaks jitter between batches by about ``PEAK_JITTER`` of the peak: ``theta``
    comes only from "informative" measurements, whose working set is at least
    ``INFORMATIVE_SHARE`` of their peak (from all while there is none), and each row enters the GP
    with its own noise ``(PEAK_JITTER / share)**2`` (at most ``MAX_ROW_NOISE``), so a working set
    lost in a large resident peak (model weights on an accelerator, a small batch) neither inflates
    ``theta`` many times over nor pins the fit. Without R the whole peak is treated as working set:
    from a seed using more than half the limit, doubling the batch is then never predicted safe, so
    report resident memory where the runtime knows it.

    ``predict`` gives mean and std of log W, ``upper`` gives ``R + exp(mean + k * std)`` bytes and
    ``p_feasible`` the probability of staying under a limit. The std is the GP's LATENT std (its
    fitted white noise left out): a measured peak is already the largest of a canary window's
    batches, so the jitter between batches is in the data, and adding it again would keep every
    config near the frontier out of reach however often its neighbours were measured.
    ``informative()`` says whether any measurement is informative; until one is, the memory per
    unit of work is not known yet. The GP's hyperparameters are tuned (L-BFGS-B, from the last
    tuned ones) when the set of configs measured changes; a new peak of a config already measured
    conditions the GP on it with the hyperparameters kept: what the length scales describe (how
    memory varies between configs) is unchanged, and re-tuning after every peak costs a large share
    of a tick on a wide cluster. An OOM enters as a censored measurement: "memory >= budget"."""

    #: bounds of the residual's prior std in log units (0.15 = a factor of 1.16); the lower bound keeps a
    #: few similar measurements from making the model overconfident far from them.
    MIN_AMPLITUDE = 0.15
    MAX_AMPLITUDE = 0.5
    #: measurements kept per config (the highest peaks), so a config told often stays one small group
    ROWS_PER_CONFIG = 8
    #: a working set under this share of its peak is within the peak's jitter (resident memory dominates)
    INFORMATIVE_SHARE = 0.1
    #: peaks of equal batches differ by about this share of the peak (allocator and measurement jitter)
    PEAK_JITTER = 0.02
    #: cap of a row's own noise variance (log units), so even a jittery row anchors the fit near it
    MAX_ROW_NOISE = 0.25

    def __init__(self, space: ConfigSpace, device: str, seed: int = 0) -> None:
        self.encoder = ConfigEncoder(space)
        self.device = device
        self.seed = seed
        self._configs: list[OpConfig] = []
        self._features: list[dict[str, float]] = []
        self._peaks: list[float] = []
        self._residents: list[float] = []
        self._gp: GaussianProcessRegressor | None = None
        self._start: Kernel | None = None  # the last fit's kernel: where the next fit's optimiser starts (warm start)
        self._tuned_on: frozenset[OpConfig] = frozenset()  # the configs measured when the hyperparameters were last tuned
        self._names: tuple[str, ...] = ()
        self._floor: dict[str, float] = {}
        self._theta = 0.0

    def __len__(self) -> int:
        return len(self._peaks)

    @property
    def resident(self) -> float:
        """The smallest resident memory reported on this device (0 when none was reported)."""
        return min(self._residents, default=0.0)

    def informative(self) -> bool:
        """Whether any measurement's working set is at least ``INFORMATIVE_SHARE`` of its peak, i.e. the
        memory per unit of work was measured, not guessed from a working set lost in the peak's jitter."""
        peaks = np.array(self._peaks)
        return bool(len(peaks)) and bool(np.any(peaks - self.resident >= self.INFORMATIVE_SHARE * peaks))

    def add(self, config: OpConfig, features: Mapping[str, float], peak_bytes: float, resident_bytes: float | None = None) -> None:
        """Record one measurement (or, for an OOM, the budget as a lower bound of the true peak).
        ``resident_bytes``: memory of the warm replica before its first batch, when known."""
        if config.device != self.device:
            raise ValueError(f"memory model of device {self.device!r} was given a {config.device!r} config")
        if not peak_bytes > 0:
            raise ValueError(f"peak memory of {config.label()} must be > 0 bytes, got {peak_bytes!r}")
        if resident_bytes is not None:
            if not 0 <= resident_bytes <= peak_bytes:
                raise ValueError(f"resident memory of {config.label()} must be in [0, peak {peak_bytes:.0f}] bytes, got {resident_bytes!r}")
        resident = self.resident
        if resident_bytes is not None:
            self._residents.append(float(resident_bytes))
        self._configs.append(config)
        self._features.append(dict(features))
        self._peaks.append(float(peak_bytes))
        rows = [i for i, c in enumerate(self._configs) if c == config]
        kept = True
        if len(rows) > self.ROWS_PER_CONFIG:  # keep the fit small: drop this config's lowest peak
            drop = min(rows, key=self._peaks.__getitem__)
            kept = drop != len(self._peaks) - 1
            for column in (self._configs, self._features, self._peaks):
                del column[drop]
        # refit only when what the fit reads changed: a measurement dropped at once (under the config's
        # kept peaks) leaves the fit as it was, and refitting it was most of a 256-node tick's memory-model cost
        if kept or self.resident != resident:
            if self._gp is not None:
                self._start = self._gp.kernel_
            self._gp = None

    def _size(self, config: OpConfig, features: Mapping[str, float]) -> float:
        """Work units of a batch for the prior: batch size times the product of its per-item features,
        each floored at a tenth of the largest value measured (so a feature that is often 0 does not
        make every other workload look infinitely larger)."""
        return config.batch_size * math.prod(max(float(features.get(n, 0.0)), self._floor[n]) for n in self._names)

    def _prior(self, configs: Sequence[OpConfig], features: Sequence[Mapping[str, float]]) -> np.ndarray:
        """``theta + log(size)``: the log working set grows in proportion to the batch's work."""
        return np.array([self._theta + math.log(self._size(c, f)) for c, f in zip(configs, features)])

    def _working(self) -> np.ndarray:
        """Measured working sets (peak minus resident), floored at 1% of the peak against noise."""
        peaks = np.array(self._peaks)
        return np.maximum(peaks - self.resident, 0.01 * peaks)

    def _inputs(self, configs: Sequence[OpConfig]) -> np.ndarray:
        return np.array([[self.encoder.batch_coord(c.batch_size)] + self.encoder.knob_vector(c) for c in configs], dtype=float)

    def _fit(self) -> None:
        self._names = tuple(sorted({n for f in self._features for n in f}))
        self._floor = {n: max(0.1 * max(float(f.get(n, 0.0)) for f in self._features), 1e-12) for n in self._names}
        # theta: the largest working set per unit of work measured (an upper envelope), so that the
        # prior, and the GP far from data, extrapolate from the most memory-hungry measurement.
        # Only measurements whose working set stands out of the peak's jitter take part (all of them
        # while none does): a working set of a few percent of a large resident peak is mostly jitter,
        # and its ratio to the work would overstate the memory per unit of work many times over.
        working = self._working()
        log_work = np.log(working)
        share = working / np.array(self._peaks)
        rows = np.flatnonzero(share >= self.INFORMATIVE_SHARE)
        rows = rows if len(rows) else np.arange(len(share))
        self._theta = max(log_work[i] - math.log(self._size(self._configs[i], self._features[i])) for i in rows)
        x = self._inputs(self._configs)
        resid = log_work - self._prior(self._configs, self._features)
        kernel = (ConstantKernel(0.3**2, (self.MIN_AMPLITUDE**2, self.MAX_AMPLITUDE**2))
                  * Matern(length_scale=np.full(x.shape[1], 0.5), length_scale_bounds=(0.2, 5.0), nu=2.5)
                  + WhiteKernel(1e-3, (1e-4, 0.05)))
        configs = frozenset(self._configs)
        tune = True
        if self._start is not None and self._start.n_dims == kernel.n_dims:
            # warm start: a refit follows one added row, and the last fit's hyperparameters are
            # near the new optimum (cold, these fits were a quarter of an 8-node trident run's policy time)
            kernel = self._start
            tune = configs != self._tuned_on  # a new peak of a measured config keeps them (class docstring)
        # each row's own noise in log units: the peak's jitter relative to its working set, so a working
        # set lost in a large resident peak hardly moves the fit (but still anchors it near its config)
        alpha = np.minimum((self.PEAK_JITTER / share) ** 2, self.MAX_ROW_NOISE)
        gp = GaussianProcessRegressor(kernel=kernel, alpha=alpha, normalize_y=False, n_restarts_optimizer=0, random_state=self.seed,
                                      optimizer="fmin_l_bfgs_b" if tune else None)
        if tune:
            self._tuned_on = configs
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            gp.fit(x, resid)
        self._gp = gp

    def predict(self, configs: Sequence[OpConfig], features: Features) -> tuple[np.ndarray, np.ndarray]:
        """Mean and std of the log WORKING SET (peak minus resident) of each config under the per-item
        ``features`` (one mapping for all configs, or one per config); an ``inf`` mean without any
        measurement (nothing is known to fit). The std is the GP's latent std, without its fitted
        measurement noise (see the class docstring)."""
        if not self._peaks:
            return np.full(len(configs), math.inf), np.full(len(configs), self.MAX_AMPLITUDE)
        if self._gp is None:
            self._fit()
        assert self._gp is not None
        feats = [features] * len(configs) if isinstance(features, Mapping) else list(features)
        if len(feats) != len(configs):
            raise ValueError(f"memory model got {len(feats)} feature mappings for {len(configs)} configs")
        mean, std = self._gp.predict(self._inputs(configs), return_std=True)
        # the latent std: the fitted white noise is left out, since a measured peak is already the
        # largest of its canary window's batches (its jitter is in the data, not to be added again)
        latent = np.sqrt(np.maximum(std**2 - self._gp.kernel_.k2.noise_level, 0.0))
        return mean + self._prior(configs, feats), latent

    def expected(self, configs: Sequence[OpConfig], features: Features) -> np.ndarray:
        """Predicted peak memory in bytes (resident plus the GP's median working set)."""
        mean, _ = self.predict(configs, features)
        return self.resident + np.exp(mean)

    def upper(self, configs: Sequence[OpConfig], features: Features, k: float) -> np.ndarray:
        """Upper bound of peak memory in bytes: ``resident + exp(mean + k * std)``."""
        mean, std = self.predict(configs, features)
        return self.resident + np.exp(mean + k * std)

    def p_feasible(self, configs: Sequence[OpConfig], features: Features, limit_bytes: float) -> np.ndarray:
        """Probability that each config's peak memory stays under ``limit_bytes``."""
        room = limit_bytes - self.resident
        if room <= 0:
            return np.zeros(len(configs))
        mean, std = self.predict(configs, features)
        return norm.cdf((math.log(room) - mean) / np.maximum(std, 1e-9))


def blocked(config: OpConfig, regions: Iterable[OomRegion]) -> bool:
    """Whether ``config`` lies in any OOM region."""
    return any(r.contains(config) for r in regions)
