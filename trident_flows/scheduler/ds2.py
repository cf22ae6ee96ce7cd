"""The DS2 baseline (Kalavri et al., OSDI 2018): rate-based parallelism for every operator in one step.

Contract:
- ``ds2_decision(state, samples, *, spec, source_rate, min_batches) -> DS2Decision`` is a pure
  function. Per operator, from its OK batches of the current config epoch:
  true processing rate per replica ``p_i`` = items in / busy seconds, selectivity
  ``s_i`` = items out / items in. The required input rate of the first operator is the source
  rate (``source_rate`` when given; with an unbounded pull source, the first operator's own
  true capacity ``replicas_0 * p_0``); the required rate of operator i+1 is operator i's
  output at its required rate, ``r_{i+1} = r_i * s_i`` (the upstream's true output rate).
  Target parallelism ``ceil(r_i / p_i)``, clamped to the operator's min/max replicas. When
  the targets need more CPUs/GPUs than the cluster has, the source rate is lowered until
  they fit (bisection), so every operator still matches its upstream.
- It decides only when every operator has ``min_batches`` fresh batches; the decision is one
  DS2 step (all operators at once), carrying per operator the rates and the arithmetic as
  its reason. ``DS2Policy`` keeps the samples of the current config epochs between ticks and
  returns the step's ``Plan`` (only the operators whose parallelism changes), or ``None``; its
  options are a ``DS2Settings``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from trident_flows.core.state import RunnerState
from trident_flows.scheduler.replicas import main_config, replica_limits, scaled_plan
from trident_flows.scheduler.settings import check_types, refuse, setting
from trident_flows.core.types import BatchSample, Outcome, Plan

_SLACK = 1e-6


@dataclass(frozen=True)
class OperatorRates:
    """Measured true rates of one operator (items per busy second of one replica)."""

    operator: str
    replicas: int
    batches: int
    processing_rate: float
    selectivity: float


@dataclass(frozen=True)
class DS2Decision:
    """One DS2 step: targets per operator, the rates behind them, the plan (None: no change) and why."""

    targets: Mapping[str, int]
    rates: Mapping[str, OperatorRates]
    source_rate: float
    plan: Plan | None
    reason: str


def measure_rates(state: RunnerState, samples: Sequence[BatchSample]) -> dict[str, OperatorRates]:
    """True rates per operator from OK samples of its current config epoch."""
    sums: dict[str, list[float]] = {}
    for s in samples:
        if s.outcome != Outcome.OK or s.busy_s <= 0:
            continue
        try:
            op = state.operator(s.operator)
        except KeyError:
            continue
        if s.config_epoch != op.config_epoch:
            continue
        acc = sums.setdefault(s.operator, [0.0, 0.0, 0.0, 0.0])
        acc[0] += s.items_in
        acc[1] += s.items_out
        acc[2] += s.busy_s
        acc[3] += 1
    out = {}
    for op in state.operators:
        items_in, items_out, busy, n = sums.get(op.name, [0.0, 0.0, 0.0, 0.0])
        replicas = sum(op.configs(include_canary=False).values())
        out[op.name] = OperatorRates(op.name, replicas, int(n), items_in / busy if busy > 0 else 0.0,
                                     items_out / items_in if items_in > 0 else 1.0)
    return out


def _targets(order: Sequence[str], rates: Mapping[str, OperatorRates], source: float,
             limits: Mapping[str, tuple[int, int]]) -> dict[str, int]:
    targets, required = {}, source
    for name in order:
        r = rates[name]
        lo, hi = limits[name]
        targets[name] = min(hi, max(lo, math.ceil(required / r.processing_rate - _SLACK)))
        required *= r.selectivity
    return targets


def ds2_decision(state: RunnerState, samples: Sequence[BatchSample], *, spec: Any | None = None, source_rate: float | None = None,
                 min_batches: int = 4) -> DS2Decision:
    """One DS2 step on ``state`` and the fresh ``samples`` (see the module docstring)."""
    rates = measure_rates(state, samples)
    order = [op.name for op in state.operators]
    short = [f"{n} ({rates[n].batches}/{min_batches})" for n in order if rates[n].batches < min_batches or rates[n].processing_rate <= 0]
    if short:
        return DS2Decision({}, rates, 0.0, None, f"waiting for fresh batches of {', '.join(short)}")
    first = rates[order[0]]
    source = source_rate if source_rate is not None else first.replicas * first.processing_rate
    limits = {n: replica_limits(n, spec) for n in order}
    configs = {op.name: main_config(op, spec) for op in state.operators}
    idle = [n for n, c in configs.items() if c is None]
    if idle:
        return DS2Decision({}, rates, 0.0, None, f"operators {idle} run no replica; DS2 needs a running one to measure")
    others = {op.name: {c: k for c, k in op.configs().items() if c != configs[op.name]} for op in state.operators}

    def fits(t: Mapping[str, int]) -> bool:
        cpus = sum(configs[n].cpus * max(0, t[n] - sum(others[n].values())) + sum(c.cpus * k for c, k in others[n].items()) for n in order)
        gpus = sum(configs[n].gpus * max(0, t[n] - sum(others[n].values())) + sum(c.gpus * k for c, k in others[n].items()) for n in order)
        return cpus <= state.cluster_cpus + _SLACK and gpus <= state.cluster_gpus + _SLACK

    targets = _targets(order, rates, source, limits)
    capped = ""
    if not fits(targets):
        lo, hi = 0.0, source
        for _ in range(40):
            mid = (lo + hi) / 2
            if fits(_targets(order, rates, mid, limits)):
                lo = mid
            else:
                hi = mid
        capped = f"; {source:.4g} items/s needs more than the cluster's {state.cluster_cpus:g} CPUs / {state.cluster_gpus:g} GPUs, capped"
        source = lo
        targets = _targets(order, rates, source, limits)
    ops, required, parts = [], source, []
    for name in order:
        r = rates[name]
        why = (f"DS2: required {required:.4g} items/s / true rate {r.processing_rate:.4g} items/s per replica "
               f"= {required / r.processing_rate:.3g} -> {targets[name]} replicas (was {r.replicas})")
        parts.append(f"{name} {r.replicas}->{targets[name]}")
        if targets[name] != r.replicas:
            ops.append(scaled_plan(state.operator(name), targets[name], why, spec))
        required *= r.selectivity
    work, predicted = 1.0, math.inf
    for name in order:
        predicted = min(predicted, targets[name] * rates[name].processing_rate / work)
        work *= rates[name].selectivity
    origin = "given" if source_rate is not None else "the first operator's true capacity"
    reason = f"DS2 step at source rate {source:.4g} items/s ({origin}{capped}): " + ", ".join(parts)
    plan = Plan(tuple(ops), predicted, reason) if ops else None
    return DS2Decision(targets, rates, source, plan, reason if ops else "DS2 targets equal the current parallelism")


@dataclass(frozen=True)
class DS2Settings:
    """The DS2 policy's options, validated at construction (see ``scheduler/settings.py``)."""

    source_rate: float | None = setting(None, "source rate in items/s (None: the first operator's measured true capacity)")
    min_batches: int = setting(4, "fresh batches every operator needs before a DS2 step, >= 1")
    window: int = setting(4000, "batch samples of the current config epochs kept between ticks, >= 1")

    def __post_init__(self) -> None:
        check_types("ds2", self)
        if self.source_rate is not None and self.source_rate <= 0:
            raise refuse("ds2", "source_rate", self.source_rate, "give a positive number of items/s, or None")
        if self.min_batches < 1:
            raise refuse("ds2", "min_batches", self.min_batches, "give a count of batches >= 1")
        if self.window < 1:
            raise refuse("ds2", "window", self.window, "give a count of samples >= 1")


class DS2Policy:
    """DS2 behind the ``Policy`` interface (see the module docstring)."""

    name = "ds2"
    settings_type = DS2Settings

    def __init__(self, spec: Any | None = None, cluster: Any | None = None, settings: DS2Settings | None = None) -> None:
        settings = settings if settings is not None else DS2Settings()
        self.settings = settings
        self.spec = spec
        self.source_rate = settings.source_rate
        self.min_batches = settings.min_batches
        self.window = settings.window
        self._samples: list[BatchSample] = []
        self.last: DS2Decision | None = None

    def decide(self, state: RunnerState, samples: Sequence[BatchSample]) -> Plan | None:
        epochs = {op.name: op.config_epoch for op in state.operators}
        self._samples = [s for s in [*self._samples, *samples] if epochs.get(s.operator) == s.config_epoch][-self.window:]
        self.last = ds2_decision(state, self._samples, spec=self.spec, source_rate=self.source_rate, min_batches=self.min_batches)
        if self.last.plan is not None:
            self._samples = []  # the next step waits for batches of the new configuration
        return self.last.plan
