"""Memory-constrained Bayesian optimisation of one operator's OpConfig.

Contract:
- ``ConfigOptimizer(space, budget, ...)`` searches the ``ConfigSpace`` (``search_space``) with skopt
  ask/tell for the config maximising ``optimizer_values.objective`` (items/s of one replica per unit
  of resource) with peak memory <= budget * (1 - safety_margin).
- Safety (``constraint``): a candidate is eligible only when the memory model's upper bound at the
  worst recent workload is under the limit and it is near a measured safe config (``knob_radius``,
  ``growth``); a device with no safe measurement is entered only at its seed.
- ``ask`` proposes each device's seed, then safe batch growth, then the largest constrained expected
  improvement (or the safe step toward it); ``None`` when nothing is worth trying (``status`` says
  why); it changes no state, never re-proposes a measured config, and raises ``NoSafeConfigError``
  with no safe start on any device.
- ``tell_oom(config)`` makes the config and every larger batch unsafe for good and returns the
  ``Rollback``; ``warm_start(observations)`` replays a regime's observations.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
from skopt.acquisition import gaussian_ei

from trident_flows.core.types import ConfigSpace, OpConfig
from trident_flows.scheduler.constraint import ConfigEncoder, FeatureWindow, MemoryBudget, MemoryModel, OomRegion, blocked
from trident_flows.scheduler.optimizer_values import DEFAULT_GPU_WEIGHT, NoSafeConfigError, Observation, Proposal, Rollback, objective, resource_cost
from trident_flows.scheduler.search_space import candidate_grid, check_in_space, skopt_dimensions, skopt_point, surrogate_optimizer


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
        self._dims, self._dim_keys = skopt_dimensions(space)
        self._skopt = surrogate_optimizer(self._dims, seed, n_initial_points=1) if self._dims else None
        self._dirty = False
        self._candidates = candidate_grid(space, np.random.default_rng(seed))
        self._cand_x = self._skopt.space.transform([self._point(c) for c in self._candidates]) if self._skopt else None
        self._cand_enc = np.array([[self._encoder.batch_coord(c.batch_size)] + self._encoder.knob_vector(c) for c in self._candidates])

    def _point(self, config: OpConfig) -> list[Any]:
        return skopt_point(self.space, self._encoder, self._dim_keys, config)

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
        check_in_space(self.space, self._encoder, self.operator, config)
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
        check_in_space(self.space, self._encoder, self.operator, config)
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
