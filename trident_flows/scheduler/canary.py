"""The canary protocol: measure a candidate config on one replica beside the incumbent ones.

Contract:
- ``decide(candidate, incumbent, elapsed_s=..., policy=...)``: a pure function of the batches
  measured on the canary and on incumbent replicas over the same window, returning a frozen
  ``CanaryDecision``: MEASURE, ACCEPT or REJECT, with the figures and a reason. Values compared
  are per batch items/s per resource cost (``optimize.resource_cost``), fair across devices.
- Measuring stops once the candidate's 95% CI is within ``rel_ci`` (after ``min_batches``) or at
  ``max_window_s`` / ``max_batches``. ACCEPT needs a clear gain (CI's lower end above 0, gain >=
  ``min_gain``); REJECT when not worth it, unclear at the end, on any OOM or over
  ``memory_limit``. Without incumbent batches a precisely measured candidate is accepted.
- ``measure(candidate)``: what the optimiser is told (``ConfigOptimizer.tell``): items/s per
  replica, peak device memory, and the peaking batch's per-item features and item count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Mapping, Sequence

import numpy as np
from scipy import stats

from trident_flows.core.types import CPU, BatchSample, Outcome
from trident_flows.scheduler.constraint import per_item
from trident_flows.scheduler.optimizer_values import DEFAULT_GPU_WEIGHT, resource_cost


class Verdict(str, Enum):
    MEASURE = "measure"
    ACCEPT = "accept"
    REJECT = "reject"


@dataclass(frozen=True)
class CanaryPolicy:
    """How long and how precisely to measure, and what gain is worth a change."""

    rel_ci: float = 0.05
    confidence: float = 0.95
    min_batches: int = 4
    max_batches: int = 64
    max_window_s: float = 120.0
    min_gain: float = 0.02
    gpu_weight: float = DEFAULT_GPU_WEIGHT

    def __post_init__(self) -> None:
        if not 0 < self.rel_ci < 1:
            raise ValueError(f"CanaryPolicy.rel_ci must be in (0, 1), got {self.rel_ci}")
        if not 0.5 <= self.confidence < 1:
            raise ValueError(f"CanaryPolicy.confidence must be in [0.5, 1), got {self.confidence}")
        if not 2 <= self.min_batches <= self.max_batches:
            raise ValueError(f"CanaryPolicy needs 2 <= min_batches <= max_batches, got {self.min_batches}, {self.max_batches}")
        if self.max_window_s <= 0:
            raise ValueError(f"CanaryPolicy.max_window_s must be > 0, got {self.max_window_s}")


@dataclass(frozen=True)
class CanaryDecision:
    """What to do with the canary now, and why. Means are per batch, per unit of resource;
    ``gain`` is the relative gain over the incumbent with its confidence interval."""

    verdict: Verdict
    reason: str
    batches: int
    candidate_mean: float = math.nan
    candidate_rel_ci: float = math.nan
    incumbent_mean: float = math.nan
    gain: float = math.nan
    gain_ci: tuple[float, float] = (math.nan, math.nan)


@dataclass(frozen=True)
class Measurement:
    """A canary window condensed for ``ConfigOptimizer.tell`` / ``tell_oom``."""

    throughput: float
    peak_memory: float
    features: Mapping[str, float] = field(default_factory=dict)
    batches: int = 0
    oom: bool = False
    items: int | None = None  # items the features were averaged over (the peak batch's items_in)


def _peak(sample: BatchSample) -> int:
    return sample.peak_host_mem_bytes if sample.config.device == CPU else sample.peak_device_mem_bytes


def _rates(samples: Sequence[BatchSample], gpu_weight: float) -> np.ndarray:
    return np.array([s.items_in / s.busy_s / resource_cost(s.config, gpu_weight) for s in samples
                     if s.outcome == Outcome.OK and s.busy_s > 0])


def measure(candidate: Sequence[BatchSample]) -> Measurement:
    """Items/s of the replica (items over busy seconds of its OK batches), the largest peak memory
    of its device, and the per-item features (and item count) of the batch with that peak; ``oom``
    if any batch OOM'd."""
    if not candidate:
        raise ValueError("measure() needs at least one batch of the canary replica")
    ok = [s for s in candidate if s.outcome == Outcome.OK and s.busy_s > 0]
    busy = sum(s.busy_s for s in ok)
    throughput = sum(s.items_in for s in ok) / busy if busy > 0 else 0.0
    oom = [s for s in candidate if s.outcome == Outcome.OOM]
    peak_batch = oom[0] if oom else max(candidate, key=_peak)
    return Measurement(throughput, float(_peak(peak_batch)), per_item(peak_batch.features, peak_batch.items_in), len(candidate), bool(oom),
                       max(int(peak_batch.items_in), 1))


def _half_width(values: np.ndarray, confidence: float) -> float:
    if len(values) < 2:
        return math.inf
    return float(stats.t.ppf(0.5 + confidence / 2, len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values)))


def decide(candidate: Sequence[BatchSample], incumbent: Sequence[BatchSample], *, elapsed_s: float,
           policy: CanaryPolicy = CanaryPolicy(), memory_limit: float | None = None) -> CanaryDecision:
    """Keep measuring, accept or reject the canary (see the module docstring)."""
    n = len(candidate)
    if any(s.outcome == Outcome.OOM for s in candidate):
        return CanaryDecision(Verdict.REJECT, "the canary ran out of memory", n)
    if memory_limit is not None and candidate and max(_peak(s) for s in candidate) > memory_limit:
        peak = max(_peak(s) for s in candidate)
        return CanaryDecision(Verdict.REJECT, f"canary peak memory {peak / 2**30:.3g} GiB is over the safe limit "
                                              f"{memory_limit / 2**30:.3g} GiB", n)
    cand = _rates(candidate, policy.gpu_weight)
    expired = elapsed_s >= policy.max_window_s or n >= policy.max_batches
    if len(cand) < policy.min_batches and not expired:
        return CanaryDecision(Verdict.MEASURE, f"{len(cand)} of at least {policy.min_batches} batches measured", n)
    if len(cand) == 0:
        return CanaryDecision(Verdict.REJECT, "the window ended without a successful canary batch", n)
    c_mean = float(cand.mean())
    c_rel = _half_width(cand, policy.confidence) / c_mean if c_mean > 0 else math.inf
    precise = c_rel <= policy.rel_ci
    inc = _rates(incumbent, policy.gpu_weight)
    if len(inc) < 2:
        if precise or expired:
            return CanaryDecision(Verdict.ACCEPT, "no incumbent to compare with; candidate measured "
                                  + ("precisely" if precise else "until the window ended"), n, c_mean, c_rel)
        return CanaryDecision(Verdict.MEASURE, f"candidate mean known to +-{c_rel:.1%}, need {policy.rel_ci:.0%}", n, c_mean, c_rel)
    i_mean = float(inc.mean())
    gain = c_mean / i_mean - 1.0
    # Welch's t interval of the difference of means, relative to the incumbent mean.
    var_c = cand.var(ddof=1) / len(cand) if len(cand) > 1 else math.inf
    var_i = inc.var(ddof=1) / len(inc)
    se = math.sqrt(var_c + var_i)
    dof = (var_c + var_i) ** 2 / ((var_c**2 / (len(cand) - 1)) + (var_i**2 / (len(inc) - 1))) if math.isfinite(se) and se > 0 else 1.0
    half = float(stats.t.ppf(0.5 + policy.confidence / 2, max(dof, 1.0))) * se / i_mean if math.isfinite(se) else math.inf
    lo, hi = gain - half, gain + half
    i_rel = _half_width(inc, policy.confidence) / i_mean
    figures = dict(batches=n, candidate_mean=c_mean, candidate_rel_ci=c_rel, incumbent_mean=i_mean, gain=gain, gain_ci=(lo, hi))
    if lo > 0 and gain >= policy.min_gain:
        return CanaryDecision(Verdict.ACCEPT, f"clearly better: {gain:+.1%} per unit of resource (CI {lo:+.1%}..{hi:+.1%})", **figures)
    if hi < policy.min_gain:
        return CanaryDecision(Verdict.REJECT, f"not better by {policy.min_gain:.0%}: {gain:+.1%} (CI {lo:+.1%}..{hi:+.1%})", **figures)
    if precise and i_rel <= policy.rel_ci:
        return CanaryDecision(Verdict.REJECT, f"gain {gain:+.1%} is within the noise of precise measurements (CI {lo:+.1%}..{hi:+.1%})", **figures)
    if expired:
        return CanaryDecision(Verdict.REJECT, f"window ended without a clear gain: {gain:+.1%} (CI {lo:+.1%}..{hi:+.1%})", **figures)
    return CanaryDecision(Verdict.MEASURE, f"gain {gain:+.1%} not clear yet (CI {lo:+.1%}..{hi:+.1%})", **figures)
