"""Known-truth simulator of one operator's batch samples (no Ray), for the observe benchmark and tests.

Contract:
- ``simulate(op, phases, regimes, ...)`` returns a ``SimRun``: the ``BatchSample`` values a runtime
  would report (in completion order), plus the truth behind each one.
- A batch's cost follows ``runtime.costmodel.DeviceCost`` with contention, knob speed-ups, a regime's
  hidden slowdown and noise (``SimOperator.expected_seconds``); injected anomalies (``Anomalies``) are
  marked in ``SimRun.anomaly``.
- Truth: ``expected_busy`` is each batch's cost without noise or anomalies; ``SimRun.true_throughput``
  is the sustainable throughput the model should predict.
- A phase is one configuration (OpConfig, replicas) for a number of batches, each a new
  ``config_epoch``; regimes follow their own schedule (in batches), cycling.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from trident_flows.core.types import CPU, BatchSample, OpConfig
from trident_flows.runtime.costmodel import DeviceCost


@dataclass(frozen=True)
class Regime:
    """A workload regime: mean per-item features, their per-item spread (log-normal sigma)
    and a hidden slowdown factor that no feature reveals."""

    name: str
    features: Mapping[str, float]
    spread: float = 0.4
    slowdown: float = 1.0


@dataclass(frozen=True)
class SimOperator:
    """A known-truth operator: a cost model per device plus contention and knob effects."""

    name: str
    costs: Mapping[str, DeviceCost]
    contention: float = 0.03
    knob_exponents: Mapping[str, float] = field(default_factory=dict)
    noise: float = 0.05

    def expected_seconds(self, config: OpConfig, replicas: int, items: int, feature_sums: Mapping[str, float], slowdown: float = 1.0) -> float:
        """A batch's cost without noise or anomalies: ``DeviceCost`` seconds (linear in items and summed workload
        features), divided by ``knob ** exponent`` for speed-up knobs, times a contention factor
        ``1 + contention*(R-1)`` for R replicas running together, times a regime's hidden ``slowdown`` (a change no
        workload feature shows). ``simulate`` multiplies it by log-normal noise of mean 1 and injected anomalies."""
        cost = self.costs[config.device].seconds(items, feature_sums)
        for knob, exponent in self.knob_exponents.items():
            cost /= float(config.knob(knob, 1)) ** exponent
        return cost * (1.0 + self.contention * (replicas - 1)) * slowdown

    def true_throughput(self, config: OpConfig, replicas: int, per_item: Mapping[str, float], slowdown: float = 1.0) -> float:
        """Operator throughput (items/s) of full batches with these mean per-item features."""
        b = config.batch_size
        return replicas * b / self.expected_seconds(config, replicas, b, {f: v * b for f, v in per_item.items()}, slowdown)


@dataclass(frozen=True)
class Phase:
    config: OpConfig
    replicas: int
    batches: int


@dataclass(frozen=True)
class Anomalies:
    """Injected anomalies, multiplying a batch's cost: isolated spikes (GC pause, straggler: probability per batch,
    slowdown range) and short bursts (a neighbour's load)."""

    spike_prob: float = 0.03
    spike_factor: tuple[float, float] = (2.0, 6.0)
    burst_prob: float = 0.002
    burst_len: tuple[int, int] = (3, 8)
    burst_factor: float = 1.7


@dataclass
class SimRun:
    op: SimOperator
    samples: list[BatchSample]
    expected_busy: np.ndarray
    regime: list[str]
    phase: np.ndarray
    replicas: np.ndarray
    anomaly: np.ndarray            # "" | "spike" | "burst"
    switches: list[tuple[int, str, str]]   # (first sample index of the new regime, old, new)

    def true_throughput(self, indices: Sequence[int]) -> float:
        """The sustainable operator throughput over the batches ``indices`` (replicas * items / expected busy seconds):
        the figure the model should predict."""
        idx = np.asarray(indices, dtype=int)
        items = sum(self.samples[i].items_in for i in idx)
        return float(self.replicas[idx[0]] * items / self.expected_busy[idx].sum())


def simulate(op: SimOperator, phases: Sequence[Phase], regimes: Sequence[tuple[Regime, int]], *, anomalies: Anomalies = Anomalies(),
             seed: int = 0, start: float = 1_000.0, starvation_s: float = 0.0, partial_prob: float = 0.05) -> SimRun:
    """Simulate ``phases`` back to back; regimes cycle through ``regimes`` (regime, batches)."""
    if not phases or not regimes:
        raise ValueError("simulate needs at least one phase and one regime")
    rng = np.random.default_rng(seed)
    schedule = [r for r, n in regimes for _ in range(n)]
    records = []
    clock = start
    burst_left = 0
    batch_no = 0
    for p_no, phase in enumerate(phases):
        free = np.full(phase.replicas, clock)
        for _ in range(phase.batches):
            regime = schedule[batch_no % len(schedule)]
            batch_no += 1
            b = phase.config.batch_size
            items = int(rng.integers(1, b + 1)) if rng.random() < partial_prob else b
            sums = {f: float(np.sum(m * rng.lognormal(-regime.spread ** 2 / 2, regime.spread, items))) for f, m in regime.features.items()}
            expected = op.expected_seconds(phase.config, phase.replicas, items, sums, regime.slowdown)
            busy = expected * rng.lognormal(-op.noise ** 2 / 2, op.noise)
            kind = ""
            if burst_left == 0 and rng.random() < anomalies.burst_prob:
                burst_left = int(rng.integers(anomalies.burst_len[0], anomalies.burst_len[1] + 1))
            if burst_left > 0:
                busy *= anomalies.burst_factor
                burst_left -= 1
                kind = "burst"
            elif rng.random() < anomalies.spike_prob:
                busy *= rng.uniform(*anomalies.spike_factor)
                kind = "spike"
            r = int(np.argmin(free))
            t0 = free[r] + (rng.exponential(starvation_s) if starvation_s > 0 else 0.0)
            t1 = t0 + busy
            free[r] = t1
            cost = op.costs[phase.config.device]
            peak = cost.peak_bytes(items, sums) * rng.lognormal(0, 0.02)
            host, dev = (int(peak), 0) if phase.config.device == CPU else (int(2**28), int(peak))
            sample = BatchSample(op.name, f"{op.name}-e{p_no}-r{r}", phase.config, t0, t1, busy, items, items, sums, host, dev,
                                 config_epoch=p_no, inflight=2 if starvation_s == 0 else 1)
            records.append((t1, sample, expected, regime.name, p_no, phase.replicas, kind, batch_no - 1))
        clock = float(free.max())
    records.sort(key=lambda r: r[0])
    names = [r[3] for r in records]
    order = np.array([r[7] for r in records])
    switches = []
    for k in range(1, batch_no):
        old, new = schedule[(k - 1) % len(schedule)].name, schedule[k % len(schedule)].name
        if old != new:
            first = int(np.flatnonzero(order >= k)[0])
            switches.append((first, old, new))
    return SimRun(op, [r[1] for r in records], np.array([r[2] for r in records]), names, np.array([r[4] for r in records]),
                  np.array([r[5] for r in records]), np.array([r[6] for r in records]), switches)
