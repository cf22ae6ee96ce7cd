"""The DS2 baseline: every operator's parallelism from true rates, all in one step, by a scaling
manager that holds once it has converged (Kalavri et al., OSDI 2018; reference implementation
github.com/strymon-system/ds2).

Contract:
- ``measure_rates(state, samples)``: per operator, the true processing and output rates of one
  replica (items in / out per busy second) from its OK batches of the current config epoch.
- ``ds2_decision(state, rates, ...)`` (pure): targets ``ceil(r_i / p_i)`` from the source rate
  down the graph, within min/max replicas and the cluster's CPUs/GPUs; a ``Plan`` of every
  operator that changes when a step is called for, else a hold; it waits while an operator has
  fewer than ``min_batches`` batches or no replica.
- ``DS2Policy``: the scaling manager (policy interval, warm-up, activation window; a refused step
  is not issued again on the same parallelism); its options are a ``DS2Settings``.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from trident_flows.core.decision import Decision, Hold, HoldKind
from trident_flows.core.state import ApplyOutcome, RunnerState
from trident_flows.core.types import BatchSample, Outcome, Plan
from trident_flows.scheduler.replicas import held, main_config, replica_limits, scaled_plan
from trident_flows.scheduler.settings import check_types, refuse, setting

_SLACK = 1e-6
_BISECTIONS = 40
# the reference manager's consider_change: a scale-down by one instance is not a change worth making
_SCALE_DOWN_MIN = 2


@dataclass(frozen=True)
class OperatorRates:
    """Measured true rates of one operator (items per busy second of one replica)."""

    operator: str
    replicas: int
    batches: int
    processing_rate: float
    output_rate: float

    @property
    def selectivity(self) -> float:
        """Items out per item in (1 before any item was measured)."""
        return self.output_rate / self.processing_rate if self.processing_rate > 0 else 1.0


@dataclass(frozen=True)
class DS2Decision:
    """One evaluation: targets per operator, the rates behind them, the target source rate ``R``, the
    rate the current configuration sustains ``A``, the plan (None: hold) and why."""

    targets: Mapping[str, int]
    rates: Mapping[str, OperatorRates]
    source_rate: float
    sustained_rate: float
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
                                     items_out / busy if busy > 0 else 0.0)
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


def _sustained(order: Sequence[str], rates: Mapping[str, OperatorRates], counts: Mapping[str, int]) -> float:
    """Source items/s that ``counts`` replicas of each operator serve at the measured true rates."""
    rate, work = math.inf, 1.0
    for name in order:
        if work > 0:
            rate = min(rate, counts[name] * rates[name].processing_rate / work)
        work *= rates[name].selectivity
    return rate


def finished_operators(state: RunnerState) -> list[str]:
    """The operators that will receive no more work, a prefix of the pipeline: the input is closed and
    nothing is queued or in flight at them or upstream."""
    done: list[str] = []
    for op in state.operators if state.input_closed else ():
        if op.queue_items > 0 or any(r.inflight > 0 for r in op.replicas):
            break
        done.append(op.name)
    return done


def ds2_decision(state: RunnerState, rates: Mapping[str, OperatorRates], *, spec: Any | None = None, source_rate: float | None = None,
                 min_batches: int = 4, target_rate_ratio: float = 1.2) -> DS2Decision:
    """One evaluation of DS2 on ``state`` and the ``rates`` measured.

    The first operator's required rate is the target source rate ``R``, operator i+1's is operator
    i's true output at its target, ``r_i * o_i / p_i``; targets ``ceil(r_i / p_i)`` within the
    min/max replicas (the paper's model, section 3; ``policy/scaling.rs``). ``R`` is ``source_rate``,
    lowered (bisection) until the targets fit the cluster's CPUs/GPUs, or, for a pull source (None),
    the highest rate whose targets fit. Operators that will get no more input
    (``finished_operators``) keep their replicas and the rest pulls at the first busy one (the pull
    source and finished operators are this runtime's: a batch pipeline's input is read as fast as
    the pipeline takes it, and it ends). A step is called for when the current parallelism
    sustains, at the same rates, less than ``R / target_rate_ratio``, or, with a given
    ``source_rate``, when an operator's target is 2+ replicas under its count; else it holds.

    ``target_rate_ratio`` is the reference's (``manager.rs``/``scaling.rs``: a further step when
    the target source rate over the observed one exceeds it); here it gates every step, with the
    rate the parallelism sustains by the true rates for the observed one (a pull source is observed
    at its bottleneck's rate, without the fill and drain transients). Its default 1.2 is ours (the
    reference leaves it unset): above the spread of a slow operator's per-replica rate over a window
    of 4+ batches. A scale-down by one replica is no change (``manager.rs`` ``consider_change``); a
    scale-up goes through the target rate ratio. With a pull source a step that only frees replicas
    gains nothing: ``R`` already counts every replica the others could use."""
    finished = finished_operators(state)
    order = [op.name for op in state.operators if op.name not in finished]
    if not order:
        return DS2Decision({}, rates, 0.0, 0.0, None, "every operator has finished its input")
    short = [f"{n} ({rates[n].batches}/{min_batches})" for n in order if rates[n].batches < min_batches or rates[n].processing_rate <= 0]
    if short:
        return DS2Decision({}, rates, 0.0, 0.0, None, f"waiting for batches of {', '.join(short)}")
    configs = {op.name: main_config(op, spec) for op in state.operators}
    idle = [n for n in order if configs[n] is None]
    if idle:
        return DS2Decision({}, rates, 0.0, 0.0, None, f"operators {idle} run no replica; DS2 needs a running one to measure")
    limits = {n: replica_limits(n, spec) for n in order}
    others = {n: {c: k for c, k in state.operator(n).configs().items() if c != configs[n]} for n in order}
    kept = [held(state.operator(n).configs()) for n in finished] + [held(others[n]) for n in order]  # what a step leaves as it is
    kept_cpus, kept_gpus = sum(c for c, _ in kept), sum(g for _, g in kept)

    def fits(t: Mapping[str, int]) -> bool:
        main = {n: max(0, t[n] - sum(others[n].values())) for n in order}
        cpus = kept_cpus + sum(configs[n].cpus * main[n] for n in order)
        gpus = kept_gpus + sum(configs[n].gpus * main[n] for n in order)
        return cpus <= state.cluster_cpus + _SLACK and gpus <= state.cluster_gpus + _SLACK

    if source_rate is not None and not finished:
        wanted, origin = source_rate, "given"
    else:
        wanted = _sustained(order, rates, {n: limits[n][1] for n in order})
        origin = f"a pull source{' at ' + order[0] if finished else ''}: the highest rate that fits"
    source, capped = wanted, ""
    if not fits(_targets(order, rates, wanted, limits)):
        lo, hi = 0.0, wanted
        for _ in range(_BISECTIONS):
            mid = (lo + hi) / 2
            if fits(_targets(order, rates, mid, limits)):
                lo = mid
            else:
                hi = mid
        source = lo
        if origin == "given":
            capped = f"; {wanted:.4g} items/s needs more than the cluster's {state.cluster_cpus:g} CPUs / {state.cluster_gpus:g} GPUs, capped"
    targets = _targets(order, rates, source, limits)
    counts = {n: rates[n].replicas for n in order}
    sustained = _sustained(order, rates, counts)
    ops, required, parts = [], source, []
    for name in order:
        r = rates[name]
        why = (f"DS2: required {required:.4g} items/s / true rate {r.processing_rate:.4g} items/s per replica "
               f"= {required / r.processing_rate:.3g} -> {targets[name]} replicas (was {r.replicas})")
        parts.append(f"{name} {r.replicas}->{targets[name]}")
        if targets[name] != r.replicas:
            ops.append(scaled_plan(state.operator(name), targets[name], why, spec))
        required *= r.selectivity
    predicted = _sustained(order, rates, targets)
    ratio = source / sustained if sustained > 0 else math.inf
    shrink = [n for n in order if counts[n] - targets[n] >= _SCALE_DOWN_MIN] if origin == "given" else []
    reason = (f"DS2 at target source rate {source:.4g} items/s ({origin}{capped}); the current configuration sustains "
              f"{sustained:.4g} (ratio {ratio:.3g}): " + ", ".join(parts) + (f"; finished: {', '.join(finished)}" if finished else ""))
    if not ops:
        return DS2Decision(targets, rates, source, sustained, None, f"{reason}; targets equal the current parallelism")
    if ratio <= target_rate_ratio and not shrink:
        return DS2Decision(targets, rates, source, sustained, None,
                           f"{reason}; within the target rate ratio {target_rate_ratio:g} and no operator {_SCALE_DOWN_MIN}+ replicas over: hold")
    return DS2Decision(targets, rates, source, sustained, Plan(tuple(ops), predicted, f"{reason}; step"), f"{reason}; step")


@dataclass(frozen=True)
class DS2Settings:
    """The DS2 policy's options, validated at construction (see ``scheduler/settings.py``)."""

    source_rate: float | None = setting(None, "target source rate in items/s (None: a pull source, the highest rate the cluster fits)")
    policy_interval_s: float = setting(10.0, "seconds of the run between two evaluations of the policy (reference ds2.toml: 10)")
    warm_up_intervals: int = setting(2, "policy intervals after the start and after each step whose samples are not used (ds2.toml: 2)")
    activation_intervals: int = setting(1, "consecutive evaluations that must call for the same step before it is issued, >= 1 (reference: 1)")
    target_rate_ratio: float = setting(1.2, "target source rate / rate the current parallelism sustains above which DS2 steps, >= 1")
    min_batches: int = setting(4, "batches every operator needs in the activation window before DS2 evaluates, >= 1")

    def __post_init__(self) -> None:
        check_types("ds2", self)
        if self.source_rate is not None and self.source_rate <= 0:
            raise refuse("ds2", "source_rate", self.source_rate, "give a positive number of items/s, or None")
        if self.policy_interval_s <= 0:
            raise refuse("ds2", "policy_interval_s", self.policy_interval_s, "give a positive number of seconds")
        if self.warm_up_intervals < 0:
            raise refuse("ds2", "warm_up_intervals", self.warm_up_intervals, "give a count of intervals >= 0")
        if self.activation_intervals < 1:
            raise refuse("ds2", "activation_intervals", self.activation_intervals, "give a count of intervals >= 1")
        if self.target_rate_ratio < 1:
            raise refuse("ds2", "target_rate_ratio", self.target_rate_ratio, "give a ratio >= 1 (1: step on any shortfall)")
        if self.min_batches < 1:
            raise refuse("ds2", "min_batches", self.min_batches, "give a count of batches >= 1")


class DS2Policy:
    """DS2's scaling manager behind the ``Policy`` interface (the paper's section 4, ``bin/manager.rs``).

    One evaluation per ``policy_interval_s`` of the run (``RunnerState.wall_s``); no sample is used
    for ``warm_up_intervals`` intervals after the start and after each step it issues; rates over
    the activation window (the last ``activation_intervals`` intervals, further back within the
    same parallelism for an operator with fewer than ``min_batches`` batches there); a step is
    issued once ``activation_intervals`` evaluations in a row called for it (each operator scaled
    the same way: up, down or kept), with the last one's targets; a step the runner refused is not
    issued again on the same parallelism. Defaults from the reference's ``config/ds2.toml``
    (``policy_interval = 10`` s, ``warm_up_time = 2`` intervals) and ``manager.rs``
    (``activation_time`` 1 when unset; it counts evaluations since the last step, this one
    evaluations in a row that call for the same step)."""

    name = "ds2"
    settings_type = DS2Settings

    def __init__(self, spec: Any | None = None, cluster: Any | None = None, settings: DS2Settings | None = None) -> None:
        self.settings = settings if settings is not None else DS2Settings()
        self.spec = spec
        self.source_rate = self.settings.source_rate
        self.last: DS2Decision | None = None  # the last evaluation
        self._warm_until: float | None = None  # run seconds before which samples are not used (None: set at the next tick)
        self._interval_start: float | None = None  # None: the next tick after the warm-up starts the first interval
        self._current: list[BatchSample] = []
        self._intervals: list[list[BatchSample]] = []  # closed intervals of this configuration, after its warm-up
        self._calls = 0                                # consecutive evaluations that called for the same step
        self._direction: dict[str, int] | None = None  # per operator -1, 0 or +1: the step the last evaluation called for
        self._refused: tuple[dict[str, int], dict[str, int]] | None = None  # (parallelism, targets) of a refused plan

    def decide(self, state: RunnerState, samples: Sequence[BatchSample]) -> Decision:
        s, now = self.settings, state.wall_s
        if self._warm_until is None:  # the first tick, or the first after a step (the loop waited for it to land)
            self._warm_until, self._interval_start, self._current, self._intervals = now + s.warm_up_intervals * s.policy_interval_s, None, [], []
        if now < self._warm_until:
            return Decision.no_change(f"warming up until {self._warm_until:.1f} s")
        if self._interval_start is None:  # these samples span the warm-up's end: the first interval starts now
            self._interval_start = now
            return Decision.no_change("warmed up: observing")
        self._current.extend(samples)
        if now - self._interval_start < s.policy_interval_s * (1 - _SLACK):
            return Decision.no_change(f"observing: {now - self._interval_start:.1f} of {s.policy_interval_s:g} s")
        self._intervals.append(self._current)
        self._current, self._interval_start = [], now
        self.last = ds2_decision(state, measure_rates(state, self._window(state)), spec=self.spec, source_rate=self.source_rate,
                                 min_batches=s.min_batches, target_rate_ratio=s.target_rate_ratio)
        plan = self.last.plan
        if plan is not None and self._refused == (_parallelism(self.last), dict(self.last.targets)):
            return Decision.no_change(f"{self.last.reason}; refused before with this parallelism, not issued again", Hold(HoldKind.REFUSED_BEFORE))
        direction = _direction(self.last) if plan is not None else None
        self._calls = self._calls + 1 if direction is not None and direction == self._direction else 1 if direction is not None else 0
        self._direction = direction
        if plan is None:
            return Decision.no_change(self.last.reason)
        if self._calls < s.activation_intervals:
            return Decision.no_change(f"{self.last.reason} ({self._calls} of {s.activation_intervals} evaluations in a row)")
        self._calls, self._direction, self._warm_until, self._refused = 0, None, None, None
        return Decision.roll_out(plan, plan.reason)

    def observe_apply(self, plan: Plan, outcome: ApplyOutcome) -> None:
        """A refused plan is remembered so that the same step is not issued again on the same parallelism."""
        if not outcome.changed and self.last is not None and self.last.plan is plan:
            self._refused = (_parallelism(self.last), dict(self.last.targets))

    def _window(self, state: RunnerState) -> list[BatchSample]:
        """The activation window's samples (see the class docstring); older intervals no operator needs are dropped
        (an operator whose input is finished takes no more batches: it holds none back)."""
        keep, need = self.settings.activation_intervals, self.settings.min_batches
        counts = [Counter(x.operator for x in interval if x.outcome == Outcome.OK) for interval in self._intervals]
        finished = set(finished_operators(state))
        begin: dict[str, int] = {}
        for op in state.operators:
            start, batches = len(counts), 0
            while start > 0 and (len(counts) - start < keep or (batches < need and op.name not in finished)):
                start -= 1
                batches += counts[start][op.name]
            begin[op.name] = start
        first = min(begin.values(), default=len(counts))
        self._intervals = self._intervals[first:]
        return [x for k, interval in enumerate(self._intervals) for x in interval if k + first >= begin.get(x.operator, len(counts))]


def _parallelism(decision: DS2Decision) -> dict[str, int]:
    return {name: r.replicas for name, r in decision.rates.items()}


def _direction(decision: DS2Decision) -> dict[str, int]:
    """Per operator, whether the decision scales it down (-1), keeps it (0) or scales it up (+1)."""
    return {n: (t > decision.rates[n].replicas) - (t < decision.rates[n].replicas) for n, t in decision.targets.items()}
