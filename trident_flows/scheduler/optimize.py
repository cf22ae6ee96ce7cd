"""Memory-constrained Bayesian optimisation of one operator's OpConfig.

Contract:
- ``ConfigOptimizer(space, budget, ...)`` searches the operator's ``ConfigSpace`` (devices,
  batch size on a log scale, knobs) with scikit-optimize (``skopt.Optimizer``, GP surrogate,
  ask/tell) for the config that maximises the OBJECTIVE

      throughput per unit of resource = items/s of one replica / (cpus + gpu_weight * gpus)

  (``gpu_weight``, default 4: one accelerator costs as much as four CPUs), subject to
  peak memory <= budget * (1 - safety_margin), host memory for CPU replicas and device
  memory for accelerator replicas (``MemoryBudget``).
- Safety (``constraint.py``): a per-device memory model (resident part + a GP of the log
  working set) gives an upper bound ``resident + exp(mean + k * std)`` at the worst recent
  workload FOR THE CANDIDATE'S BATCH SIZE (``FeatureWindow.worst``: the ``feature_quantile``
  of a batch's per-item mean, estimated from the per-item features of the last
  ``feature_window`` batches seen, told or passed to ``observe_features``, with the item
  count each was averaged over; a larger batch averages more items, so its worst case is
  tighter; features given without an item count are taken at face value for every batch
  size); a candidate is eligible only when that bound is under the limit AND
  it is near an already-measured safe config (same device; numeric knobs within
  ``knob_radius``; batch size at most ``growth`` times the safe one's, or one categorical knob
  changed at no larger batch). A longer batch step, up to ``headroom_growth`` times a safe
  batch, a categorical knob value never measured safe on the device (the memory model has not
  seen its effect, and a smooth model carries the measured values' memory over to it), and,
  on a device that ran out of memory before, a batch larger than any measured safe with the
  same knobs, are eligible only where the upper bound leaves room for the working set to
  double (``resident + 2 * (bound - resident) <= limit``). A device with no safe measurement is entered only at its
  seed: smallest batch, numeric knobs at their low end, categorical knobs at their first choice.
- Order of proposals over a fixed candidate grid (batch sizes 8 per doubling, so a frontier
  optimum is not missed by a coarse grid; knob grids):
  (1) the seed of every device; (2) safe expansion: the batch of each device grows (by the
  largest eligible step) from its best config while throughput keeps growing, the memory frontier is not
  reached and even linear growth could beat the best config so far (up to the largest batch
  while the device's working sets are all within its peaks' jitter, ``MemoryModel.informative``:
  where its memory runs out is not known yet); (3) the candidate with the
  largest constrained expected improvement (``skopt.acquisition.gaussian_ei`` on the skopt GP
  surrogate of ``-log(objective)``, times P(memory under the limit)) anywhere in the space: it
  is proposed when it is in the safe set; otherwise the safe candidate closest to it, when
  that is closer to it than every safe measurement (a step toward it), else the safe
  candidate with the largest constrained expected improvement when that is at least
  ``min_expected_gain``, else the safe candidate closest to it (refining the memory model
  next to it).
  ``ask`` returns ``None`` when nothing is left worth trying (constrained expected gain under
  ``min_expected_gain``, no eligible candidate, or ``max_evals`` distinct configs measured); ``status`` says
  which. ``ask`` does not change state: calling it twice gives the same proposal; measured
  configs are not proposed again.
- ``tell_oom(config)`` records a constraint violation: the config and every larger batch
  with the same device and knobs become unsafe for good (in this optimiser, i.e. this regime),
  the memory model learns "memory >= budget" there, and the returned ``Rollback`` names the
  config to go back to (the best safe measured one, else the incumbent given at construction).
- When no device has a safe starting point (its seed OOM'd or measured over the limit),
  ``ask`` raises ``NoSafeConfigError`` naming the operator, devices and budgets.
- ``warm_start(observations)`` replays a regime's earlier observations; ``best()`` then
  returns the earlier best at once.
"""

from __future__ import annotations

import itertools
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
from skopt import Optimizer as SkoptOptimizer
from skopt.acquisition import gaussian_ei
from skopt.space import Categorical, Integer, Real
from skopt.learning import GaussianProcessRegressor
from skopt.learning.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel
from skopt.space import Space
from skopt.utils import normalize_dimensions

from trident_flows.scheduler.constraint import ConfigEncoder, FeatureWindow, MemoryBudget, MemoryModel, OomRegion, blocked
from trident_flows.core.types import ConfigSpace, KnobValue, OpConfig

DEFAULT_GPU_WEIGHT = 4.0
_MAX_CANDIDATES = 3000
_BATCH_STEPS_PER_DOUBLING = 8
_KNOB_GRID = 9


def resource_cost(config: OpConfig, gpu_weight: float = DEFAULT_GPU_WEIGHT) -> float:
    """The resource cost of one replica: ``cpus + gpu_weight * gpus``."""
    return config.cpus + gpu_weight * config.gpus


def objective(config: OpConfig, throughput: float, gpu_weight: float = DEFAULT_GPU_WEIGHT) -> float:
    """Items/s of one replica per unit of resource cost (what the optimiser maximises)."""
    return throughput / resource_cost(config, gpu_weight)


class NoSafeConfigError(RuntimeError):
    """No configuration of the operator fits its memory budget."""


@dataclass(frozen=True)
class Observation:
    """One evaluated config: items/s per replica, peak memory in bytes (host memory for CPU
    replicas, device memory for accelerator replicas), per-item workload features, and whether
    it ran out of memory (then ``throughput`` is 0 and ``peak_memory`` the budget it exceeded);
    ``resident_memory``: bytes the warm replica held before its first batch, when known;
    ``items``: how many items ``features`` were averaged over, when known."""

    config: OpConfig
    throughput: float
    peak_memory: float
    features: Mapping[str, float] = field(default_factory=dict)
    oom: bool = False
    resident_memory: float | None = None
    items: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config.to_dict(), "throughput": self.throughput, "peak_memory": self.peak_memory,
                "features": dict(self.features), "oom": self.oom, "resident_memory": self.resident_memory, "items": self.items}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Observation":
        return cls(OpConfig.from_dict(data["config"]), float(data["throughput"]), float(data["peak_memory"]),
                   dict(data.get("features", {})), bool(data.get("oom", False)),
                   None if data.get("resident_memory") is None else float(data["resident_memory"]),
                   None if data.get("items") is None else int(data["items"]))


@dataclass(frozen=True)
class Proposal:
    """A config to try on a canary replica, with what the models expect of it and why it was chosen.
    ``predicted_throughput`` (items/s per replica) is ``nan`` before any measurement;
    ``memory_upper_bound`` is ``inf`` for a seed on a device with no memory measurement yet.
    ``kind``: "seed" (first config of a device), "expand" (a larger batch than any safe one near it)
    or "exploit" (inside the measured safe region)."""

    config: OpConfig
    predicted_throughput: float
    memory_upper_bound: float
    memory_limit: float
    kind: str
    reason: str


@dataclass(frozen=True)
class Rollback:
    """After an OOM: go back to ``to`` (``None``: no safe config is known yet; stop the canary and
    keep the running replicas as they are). ``failed`` is the config that ran out of memory."""

    to: OpConfig | None
    failed: OpConfig
    reason: str


def surrogate_optimizer(dimensions: Sequence[Any], seed: int, n_initial_points: int) -> SkoptOptimizer:
    """The skopt ask/tell optimiser with EI and a GP surrogate like ``gp_minimize``'s (Matern 5/2 with
    per-dimension length scales, normalised targets), except that the fitted noise is bounded to at
    most 10% of the target variance: with skopt's unbounded default a handful of points is often
    explained as pure noise, the surrogate goes flat and expected improvement vanishes everywhere."""
    n_dims = Space(normalize_dimensions(list(dimensions))).transformed_n_dims
    kernel = (ConstantKernel(1.0, (0.1, 10.0)) * Matern(length_scale=np.ones(n_dims), length_scale_bounds=[(0.05, 20.0)] * n_dims, nu=2.5)
              + WhiteKernel(1e-3, (1e-5, 0.1)))
    estimator = GaussianProcessRegressor(kernel=kernel, normalize_y=True, noise="gaussian", n_restarts_optimizer=1, random_state=seed)
    return SkoptOptimizer(list(dimensions), base_estimator=estimator, acq_func="EI", n_initial_points=n_initial_points,
                          acq_optimizer="sampling", acq_optimizer_kwargs={"n_points": 256}, random_state=seed)


class ConfigOptimizer:
    """OOM-safe Bayesian optimiser of one operator's config (see the module docstring)."""

    def __init__(self, space: ConfigSpace, budget: MemoryBudget, *, operator: str = "operator", safety_margin: float = 0.1,
                 k: float = 2.0, seed: int = 0, gpu_weight: float = DEFAULT_GPU_WEIGHT, growth: float = 4.0, headroom_growth: float = 16.0,
                 knob_radius: float = 0.34, feature_quantile: float = 0.95, feature_window: int = 64,
                 min_expected_gain: float = 0.002, max_evals: int | None = 40, incumbent: OpConfig | None = None) -> None:
        if not 0.0 <= safety_margin < 1.0:
            raise ValueError(f"operator {operator!r}: safety_margin must be in [0, 1), got {safety_margin}")
        if k < 0:
            raise ValueError(f"operator {operator!r}: k (std multiplier of the memory bound) must be >= 0, got {k}")
        if growth <= 1.0:
            raise ValueError(f"operator {operator!r}: growth must be > 1 (factor of safe batch-size expansion), got {growth}")
        if headroom_growth < growth:
            raise ValueError(f"operator {operator!r}: headroom_growth must be >= growth ({growth}), got {headroom_growth}")
        if gpu_weight < 0:
            raise ValueError(f"operator {operator!r}: gpu_weight must be >= 0, got {gpu_weight}")
        self.space, self.budget, self.operator = space, budget, operator
        self.safety_margin, self.k, self.seed = safety_margin, k, seed
        self.gpu_weight, self.growth, self.headroom_growth, self.knob_radius = gpu_weight, growth, headroom_growth, knob_radius
        self.min_expected_gain, self.max_evals, self.incumbent = min_expected_gain, max_evals, incumbent
        self.limits = {d: budget.limit(d, safety_margin) for d in space.devices}  # ValueError names a missing budget
        self.status = "not asked yet"
        self._encoder = ConfigEncoder(space)
        self._memory = {d: MemoryModel(space, d, seed) for d in space.devices}
        self._features = FeatureWindow(feature_quantile, feature_window)
        self._observations: list[Observation] = []
        self._regions: list[OomRegion] = []
        self._ranking: tuple[tuple[int, int], list[OpConfig]] | None = None  # (observations, regions) -> ``_ranked``
        self._dims, self._dim_keys = self._dimensions()
        self._skopt = surrogate_optimizer(self._dims, seed, n_initial_points=1) if self._dims else None
        self._dirty = False
        self._candidates = self._grid(np.random.default_rng(seed))
        self._cand_x = self._skopt.space.transform([self._point(c) for c in self._candidates]) if self._skopt else None
        self._cand_enc = np.array([[self._encoder.batch_coord(c.batch_size)] + self._encoder.knob_vector(c) for c in self._candidates])

    # ----- the search space -------------------------------------------------------------------
    def _dimensions(self) -> tuple[list[Any], list[str]]:
        dims: list[Any] = []
        keys: list[str] = []
        if len(self.space.devices) > 1:
            dims.append(Categorical(list(self.space.devices), name="device"))
            keys.append("device")
        if self.space.batch_size_max > self.space.batch_size_min:
            dims.append(Integer(self.space.batch_size_min, self.space.batch_size_max, prior="log-uniform", name="batch_size"))
            keys.append("batch_size")
        for knob in self.space.knobs:
            if knob.kind == "categorical":
                if len(knob.choices) > 1:
                    dims.append(Categorical([str(c) for c in knob.choices], name=knob.name))
                    keys.append(knob.name)
            elif knob.high > knob.low:
                prior = "log-uniform" if knob.log and knob.low > 0 else "uniform"
                dim = Integer(int(knob.low), int(knob.high), prior=prior) if knob.kind == "int" else Real(float(knob.low), float(knob.high), prior=prior)
                dims.append(dim)
                keys.append(knob.name)
        return dims, keys

    def _point(self, config: OpConfig) -> list[Any]:
        values: dict[str, Any] = {"device": config.device, "batch_size": config.batch_size}
        for knob in self.space.knobs:
            value = self._encoder.knob_value(knob, config)
            values[knob.name] = str(value) if knob.kind == "categorical" else value
        return [values[key] for key in self._dim_keys]

    def _knob_grid(self) -> list[dict[str, KnobValue]]:
        axes: list[list[tuple[str, KnobValue]]] = []
        for knob in self.space.knobs:
            if knob.kind == "categorical":
                values: list[KnobValue] = list(knob.choices)
            elif knob.kind == "int" and knob.high - knob.low + 1 <= _KNOB_GRID:
                values = list(range(int(knob.low), int(knob.high) + 1))
            else:
                spaced = (np.geomspace(knob.low, knob.high, _KNOB_GRID) if knob.log and knob.low > 0
                          else np.linspace(knob.low, knob.high, _KNOB_GRID))
                values = sorted({int(round(v)) for v in spaced}) if knob.kind == "int" else [float(v) for v in spaced]
            axes.append([(knob.name, v) for v in values])
        return [dict(combo) for combo in itertools.product(*axes)]

    def _batch_grid(self) -> list[int]:
        lo, hi = self.space.batch_size_min, self.space.batch_size_max
        steps = int(math.ceil(math.log2(hi / lo) * _BATCH_STEPS_PER_DOUBLING)) + 1
        return sorted({int(round(v)) for v in np.geomspace(lo, hi, max(steps, 1))} | {lo, hi})

    def _grid(self, rng: np.random.Generator) -> list[OpConfig]:
        batches = self._batch_grid()
        combos = self._knob_grid()
        room = max(1, _MAX_CANDIDATES // (len(batches) * len(self.space.devices)))
        if len(combos) > room:  # keep the seed's knobs, sample the rest
            keep = [0] + sorted(rng.choice(np.arange(1, len(combos)), size=room - 1, replace=False).tolist())
            combos = [combos[i] for i in keep]
        return [self.space.config(d, b, **knobs) for d in self.space.devices for knobs in combos for b in batches]

    def _check_in_space(self, config: OpConfig) -> None:
        if config.device not in self.space.devices:
            raise ValueError(f"operator {self.operator!r}: config {config.label()} has device {config.device!r}, "
                             f"not one of the space's devices {list(self.space.devices)}")
        if not self.space.batch_size_min <= config.batch_size <= self.space.batch_size_max:
            raise ValueError(f"operator {self.operator!r}: config {config.label()} has batch_size {config.batch_size}, outside "
                             f"the space's {self.space.batch_size_min}..{self.space.batch_size_max}")
        for knob in self.space.knobs:
            value = self._encoder.knob_value(knob, config)
            if knob.kind == "categorical":
                if str(value) not in {str(c) for c in knob.choices}:
                    raise ValueError(f"operator {self.operator!r}: config {config.label()} has knob {knob.name}={value!r}, "
                                     f"not one of {list(knob.choices)}")
            elif isinstance(value, (str, bool)) or not knob.low <= value <= knob.high:
                raise ValueError(f"operator {self.operator!r}: config {config.label()} has knob {knob.name}={value!r}, "
                                 f"outside {knob.low}..{knob.high}")

    # ----- state ------------------------------------------------------------------------------
    @property
    def observations(self) -> tuple[Observation, ...]:
        return tuple(self._observations)

    def worst_features(self, batch_size: int = 1) -> dict[str, float]:
        """The per-item workload the safety check assumes for a batch of ``batch_size`` items: a high
        quantile of its per-item mean under the recent features (``FeatureWindow.worst``)."""
        return self._features.worst(batch_size)

    def _worst_for(self, configs: Sequence[OpConfig]) -> list[dict[str, float]]:
        """``worst_features`` of each config's batch size."""
        by_batch = {b: self._features.worst(b) for b in {c.batch_size for c in configs}}
        return [by_batch[c.batch_size] for c in configs]

    def observe_features(self, features: Mapping[str, float], items: int | None = None) -> None:
        """Add per-item features seen on any replica, averaged over ``items`` items when known
        (they move the worst-case workload; with ``items`` a large batch's worst case is tighter)."""
        self._features.add(features, items)

    def observe_batches(self, batches: Sequence[tuple[Mapping[str, float], int]]) -> None:
        """``observe_features(per_item(features, items), items)`` of each batch's (summed features, items), in order."""
        self._features.add_batches(batches)

    def _is_safe(self, obs: Observation) -> bool:
        return not obs.oom and obs.peak_memory <= self.limits[obs.config.device] and not blocked(obs.config, self._regions)

    def _safe_points(self, device: str) -> list[OpConfig]:
        return [o.config for o in self._observations if o.config.device == device and self._is_safe(o)]

    def _device_closed(self, device: str) -> str | None:
        """Why ``device`` has no safe starting point, or ``None`` when it has one."""
        if self._safe_points(device):
            return None
        seed = self._encoder.seed(device)
        if blocked(seed, self._regions):
            return f"its smallest config {seed.label()} ran out of memory"
        over = [o.peak_memory for o in self._observations if o.config == seed and not o.oom]
        if over and min(over) > self.limits[device]:
            return f"its smallest config {seed.label()} measured {min(over) / 2**30:.3g} GiB"
        return None

    # ----- tell -------------------------------------------------------------------------------
    def tell(self, config: OpConfig, throughput: float, peak_memory: float, features: Mapping[str, float] | None = None,
             resident_memory: float | None = None, items: int | None = None) -> None:
        """Record a measurement: items/s of one replica, peak memory in bytes (host for CPU replicas,
        device memory for accelerators), the per-item features of the batch that peaked, and (when the
        runtime knows it) the replica's resident memory before its first batch, which lets the memory
        model tell model weights from the per-batch working set. ``items``: how many items the
        features were averaged over (the peak batch's items), when known."""
        self._check_in_space(config)
        if not (math.isfinite(throughput) and throughput >= 0):
            raise ValueError(f"operator {self.operator!r}: throughput of {config.label()} must be a finite number >= 0, got {throughput!r}")
        if not (math.isfinite(peak_memory) and peak_memory > 0):
            raise ValueError(f"operator {self.operator!r}: peak_memory of {config.label()} must be > 0 bytes, got {peak_memory!r}")
        features = dict(features or {})
        self._features.add(features, items)
        self._memory[config.device].add(config, features, peak_memory, resident_memory)
        self._observations.append(Observation(config, float(throughput), float(peak_memory), features, False, resident_memory, items))
        self._dirty = True

    def tell_oom(self, config: OpConfig, features: Mapping[str, float] | None = None, items: int | None = None) -> Rollback:
        """Record an OOM of ``config``: it and every larger batch with the same device and knobs are
        unsafe from now on (``features``/``items`` as in ``tell``). Returns the rollback decision
        (see ``Rollback``)."""
        self._check_in_space(config)
        features = dict(features or {})
        budget = self.budget.for_device(config.device)
        self._features.add(features, items)
        self._memory[config.device].add(config, features, budget)
        self._observations.append(Observation(config, 0.0, budget, features, True, items=items))
        self._regions.append(OomRegion.above(config))
        unsafe = f"{config.label()} ran out of memory (budget {budget / 2**30:.3g} GiB); batch >= {config.batch_size} with these knobs is now unsafe"
        target = self.best()
        if target is None and self.incumbent is not None and not blocked(self.incumbent, self._regions):
            target = self.incumbent
        if target is None:
            return Rollback(None, config, f"{unsafe}; no safe config is known yet: stop the canary, keep the running replicas")
        return Rollback(target, config, f"{unsafe}; rolling back to {target.label()}")

    def warm_start(self, observations: Iterable[Observation]) -> None:
        """Replay earlier observations of this operator (e.g. from a regime's memory)."""
        for obs in observations:
            if obs.oom:
                self.tell_oom(obs.config, obs.features, obs.items)
            else:
                self.tell(obs.config, obs.throughput, obs.peak_memory, obs.features, obs.resident_memory, obs.items)

    # ----- best / ask -------------------------------------------------------------------------
    def best(self) -> OpConfig | None:
        """The best safe MEASURED config (mean objective over its measurements): not OOM'd, measured
        under the limit, and predicted under the limit at today's worst-case workload for its batch size. ``None`` if none."""
        for config in self._ranked():
            if float(self._memory[config.device].expected([config], self.worst_features(config.batch_size))[0]) <= self.limits[config.device]:
                return config
        return None

    def _ranked(self) -> list[OpConfig]:
        """The configs measured safe, best mean objective first; ranked again only after a measurement or an
        OOM (both only ever add), since ``best`` is asked every tick and a 256-node run tells thousands."""
        key = (len(self._observations), len(self._regions))
        if self._ranking is None or self._ranking[0] != key:
            by_config: dict[OpConfig, list[float]] = {}
            for obs in self._observations:
                if self._is_safe(obs):
                    by_config.setdefault(obs.config, []).append(objective(obs.config, obs.throughput, self.gpu_weight))
            ranked = sorted(by_config.items(), key=lambda item: -float(np.mean(item[1])))
            self._ranking = (key, [config for config, _ in ranked])
        return self._ranking[1]

    def _needs_room(self, config: OpConfig, safe: Sequence[OpConfig], surprised: bool) -> bool:
        """Whether ``config`` may only be tried with room for its working set to double: it has a
        categorical knob value never measured safe on its device (the memory model has not seen its
        effect, and a smooth model would carry the measured values' memory over to it), or its device
        ran out of memory before (a jump no measurement foretold) and its batch is larger than any
        measured safe with its knobs."""
        for knob in self.space.knobs:
            if knob.kind == "categorical":
                value = str(self._encoder.knob_value(knob, config))
                if all(str(self._encoder.knob_value(knob, s)) != value for s in safe):
                    return True
        return surprised and config.batch_size > max((s.batch_size for s in safe if s.knobs == config.knobs), default=0)

    def _near_safe(self, config: OpConfig, safe: Sequence[OpConfig], growth: float) -> bool:
        for s in safe:
            numeric, categorical = self._encoder.knob_steps(config, s)
            if numeric > self.knob_radius + 1e-9:
                continue
            if categorical == 0 and config.batch_size <= growth * s.batch_size:
                return True
            if categorical == 1 and config.batch_size <= s.batch_size:
                return True
        return False

    def _model(self):
        """The skopt surrogate of ``-log(objective)``, refitted on the mean of each measured config
        (a config told many times, e.g. an incumbent, is one point, not many)."""
        if self._skopt is None:
            return None
        if self._dirty:
            ys: dict[OpConfig, list[float]] = {}
            for o in self._observations:
                if not o.oom:
                    ys.setdefault(o.config, []).append(-math.log(max(objective(o.config, o.throughput, self.gpu_weight), 1e-12)))
            self._skopt = surrogate_optimizer(self._dims, self.seed, n_initial_points=1)
            if ys:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    self._skopt.tell([self._point(c) for c in ys], [float(np.mean(v)) for v in ys.values()])
            self._dirty = False
        return self._skopt.models[-1] if self._skopt.models else None

    def _no_safe_error(self, reasons: Mapping[str, str]) -> NoSafeConfigError:
        parts = [f"device {d!r} (budget {self.budget.for_device(d) / 2**30:.3g} GiB, safe limit {self.limits[d] / 2**30:.3g} GiB "
                 f"with margin {self.safety_margin:.0%}): {why}" for d, why in reasons.items()]
        return NoSafeConfigError(f"operator {self.operator!r} has no configuration that fits its memory budget: " + "; ".join(parts)
                                 + ". Raise the MemoryBudget, lower safety_margin, or allow a smaller batch_size_min / lighter knobs.")

    @property
    def finished(self) -> bool:
        """True when the last ``ask`` found nothing left worth trying (``status`` says why)."""
        return self.status.startswith(("converged", "stopped"))

    def ask(self) -> Proposal | None:
        """The next config to try on a canary, or ``None`` (see ``status``). Raises ``NoSafeConfigError``
        when no device has a safe starting point."""
        if self.max_evals is not None and len({o.config for o in self._observations}) >= self.max_evals:
            self.status = f"stopped: max_evals={self.max_evals} configs evaluated"
            return None
        closed = {d: why for d in self.space.devices if (why := self._device_closed(d)) is not None}
        if len(closed) == len(self.space.devices):
            raise self._no_safe_error(closed)
        measured = {o.config for o in self._observations}
        seed = self._seed_proposal(closed, measured)
        if seed is not None:
            return seed
        open_idx = np.array([i for i, c in enumerate(self._candidates)
                             if c.device not in closed and c not in measured and not blocked(c, self._regions)], dtype=int)
        # 1. The safe set: near a measured safe config and with a memory upper bound under the limit.
        eligible = self._safe_set(open_idx)
        if not eligible:
            self.status = "stopped: no unmeasured candidate is both near a safe config and under the memory limit"
            return None
        # 2. Safe expansion first: grow the batch of every device until throughput stops growing or
        #    the memory frontier is reached.
        explore = self._exploration_step(eligible)
        # 3. Then the target: the largest constrained expected improvement (EI x P(memory under the
        #    limit)) anywhere, reachable yet or not; proposed when safe, else the safe step closest to it.
        eic = self._constrained_ei(open_idx)
        gain = dict(zip(open_idx.tolist(), eic.tolist()))
        t = int(np.argmax(eic))
        if explore is not None:
            pick, toward = explore
        elif eic[t] >= self.min_expected_gain:
            pick, toward = self._step_toward(int(open_idx[t]), eic[t], eligible, gain)
        else:
            self.status = f"converged: largest expected gain {eic[t]:.2g} (log objective) < min_expected_gain {self.min_expected_gain}"
            return None
        return self._proposal(pick, toward, eligible, gain)

    def _seed_proposal(self, closed: Mapping[str, str], measured: set[OpConfig]) -> Proposal | None:
        """Every open device is entered at its seed (its smallest config) first: that seed, or None once all were."""
        for device in self.space.devices:
            seed = self._encoder.seed(device)
            if device not in closed and not self._safe_points(device) and seed not in measured:
                upper = float(self._memory[device].upper([seed], self._worst_for([seed]), self.k)[0]) if len(self._memory[device]) else math.inf
                predicted = self._predict([seed])
                self.status = f"proposed {seed.label()}"
                return Proposal(seed, predicted[0] if predicted else math.nan, upper, self.limits[device], "seed",
                                f"seed: nothing measured safe on {device} yet, starting from its smallest config")
        return None

    def _safe_set(self, open_idx: np.ndarray) -> dict[int, float]:
        """The open candidates near a measured safe config (within ``growth``, or ``headroom_growth`` where the
        working set could double and still fit) whose memory upper bound is under the limit, with that bound."""
        eligible: dict[int, float] = {}
        for device in self.space.devices:
            safe = self._safe_points(device)
            on = [i for i in open_idx.tolist() if self._candidates[i].device == device]
            near = {i for i in on if self._near_safe(self._candidates[i], safe, self.growth)}
            idx = [i for i in on if i in near or self._near_safe(self._candidates[i], safe, self.headroom_growth)]
            if idx:
                configs = [self._candidates[i] for i in idx]
                upper = self._memory[device].upper(configs, self._worst_for(configs), self.k)
                # a longer step (up to headroom_growth), or a step into what the memory model cannot
                # foresee (``_needs_room``), only where the working set could double and still fit
                roomy = (self.limits[device] + self._memory[device].resident) / 2
                surprised = any(o.oom and o.config.device == device for o in self._observations)
                eligible.update((i, float(u)) for i, u, c in zip(idx, upper, configs)
                                if u <= (self.limits[device] if i in near and not self._needs_room(c, safe, surprised) else roomy))
        return eligible

    def _constrained_ei(self, open_idx: np.ndarray) -> np.ndarray:
        """Per open candidate: expected improvement of the log objective x P(memory under the device's limit)."""
        model = self._model()
        y_best = min(-math.log(max(objective(o.config, o.throughput, self.gpu_weight), 1e-12))
                     for o in self._observations if self._is_safe(o))
        eic = gaussian_ei(self._cand_x[open_idx], model, y_opt=y_best, xi=0.0)
        for device in self.space.devices:
            on = np.array([self._candidates[i].device == device for i in open_idx])
            if on.any():
                configs = [self._candidates[i] for i in open_idx[on]]
                eic[on] *= self._memory[device].p_feasible(configs, self._worst_for(configs), self.limits[device])
        return eic

    def _step_toward(self, target: int, target_gain: float, eligible: Mapping[int, float], gain: Mapping[int, float]) -> tuple[int, str]:
        """The candidate to propose for ``target`` and the note saying so: the target itself when it is safe; else the
        best safe candidate when none gets closer to the target and it is worth it on its own; else the safe step
        closest to the target (refining the memory model next to it)."""
        if target in eligible:
            return target, ""
        # a safe step toward the target, if one gets closer to it than every safe measurement
        # (else stepping "toward" it only re-measures the region it is already known to be beyond)
        device = self._candidates[target].device
        reached = min((self._gap(s, target) for s in self._safe_points(device)), default=math.inf)
        closer = [i for i in eligible if self._candidates[i].device == device and self._distance(i, target) < reached - 1e-9]
        best_safe = max(eligible, key=gain.__getitem__)
        if not closer and gain[best_safe] >= self.min_expected_gain:
            return best_safe, ""
        same = closer or [i for i in eligible if self._candidates[i].device == device] or list(eligible)
        pick = min(same, key=lambda i: (round(self._distance(i, target), 9), -gain[i]))
        return pick, f" toward {self._candidates[target].label()} (expected gain {target_gain:.3g}, not yet known safe)"

    def _proposal(self, pick: int, toward: str, eligible: Mapping[int, float], gain: Mapping[int, float]) -> Proposal:
        """Candidate ``pick`` as a proposal: "expand" when its batch exceeds every safe one of its knobs, else "exploit"."""
        chosen = self._candidates[pick]
        largest = max((s.batch_size for s in self._safe_points(chosen.device) if s.knobs == chosen.knobs), default=0)
        kind = "expand" if chosen.batch_size > largest else "exploit"
        limit = self.limits[chosen.device]
        predicted = self._predict([chosen])[0]
        self.status = f"proposed {chosen.label()}"
        return Proposal(chosen, predicted, eligible[pick], limit, kind,
                        f"{kind}{toward}: expected gain {gain[pick]:.3g} (log objective), predicted {predicted:.3g} items/s per replica; "
                        f"memory bound {eligible[pick] / 2**30:.3g} GiB = {eligible[pick] / limit:.0%} of the safe limit")

    def _exploration_step(self, eligible: Mapping[int, float]) -> tuple[int, str] | None:
        """The next batch-size step of the most promising device whose range is unexplored, or ``None``.

        Throughput per replica usually grows with batch size until it saturates, which a surrogate
        fitted on small batches cannot foresee. A device counts as explored once its best measured
        config is not its largest safe batch (throughput stopped growing), no larger batch is in
        the safe set (the memory frontier is reached), or even linear growth up to its predicted
        frontier would not beat the best config measured; until then its batch keeps growing from
        its best config (like SafeOpt's expanders).
        """
        value = {o.config: objective(o.config, o.throughput, self.gpu_weight) for o in self._observations if self._is_safe(o)}
        if not value:
            return None
        overall = max(value.values())
        options: list[tuple[float, int, str]] = []
        for device in self.space.devices:
            safe = [c for c in value if c.device == device]
            if not safe:
                continue
            top = max(c.batch_size for c in safe)
            best = max(safe, key=value.__getitem__)
            if best.batch_size < top:
                continue
            # A batch takes no less time than a smaller one, so items/s grows at most in proportion
            # to the batch: a device that cannot beat the best even so is not worth exploring.
            reach = [c for c in self._candidates if c.device == device and c.knobs == best.knobs and c.batch_size > top]
            if self._memory[device].informative():
                fits = [c.batch_size for c, m in zip(reach, self._memory[device].expected(reach, self._worst_for(reach))) if m <= self.limits[device]] if reach else []
            else:  # the working set so far is lost in the peak's jitter: where memory runs out is unknown
                fits = [c.batch_size for c in reach]
            potential = value[best] * max(fits, default=top) / top
            steps = [i for i in eligible if self._candidates[i].device == device and self._candidates[i].batch_size > top]
            if potential > overall and steps:
                pick = min(steps, key=lambda i: (sum(self._encoder.knob_steps(self._candidates[i], best)), -self._candidates[i].batch_size))
                options.append((potential, pick, f" (exploring {device}: batch sizes above {top} not measured yet)"))
        if not options:
            return None
        _, pick, why = max(options)  # the device with the most potential first
        return pick, why

    def _distance(self, i: int, j: int) -> float:
        return float(np.linalg.norm(self._cand_enc[i] - self._cand_enc[j]))

    def _gap(self, config: OpConfig, j: int) -> float:
        """Distance of any config to candidate ``j`` (in the same encoding as ``_distance``)."""
        enc = np.array([self._encoder.batch_coord(config.batch_size)] + self._encoder.knob_vector(config))
        return float(np.linalg.norm(enc - self._cand_enc[j]))

    def _predict(self, configs: Sequence[OpConfig]) -> list[float]:
        """Predicted items/s per replica of each config (empty when nothing was measured yet)."""
        model = self._model()
        if model is None:
            return []
        mean = model.predict(self._skopt.space.transform([self._point(c) for c in configs]))
        return [math.exp(-m) * resource_cost(c, self.gpu_weight) for m, c in zip(mean, configs)]
