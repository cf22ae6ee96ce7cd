"""The headroom replayed in the simulator: the cost model's best allocations, measured where runs happen.

Contract:
- ``simulated_headroom(workload, stream, cluster) -> SimulatedHeadroom``: per regime the best measured
  allocation and its steady rate (``steady_rate``), and the best measured static allocation for the whole
  schedule. Candidates are the fluid model's answers (``headroom``) at the batch caps ``BATCH_CAPS``,
  each hill-climbed (``climb``) on measured rates.
- ``SimulatedHeadroom.ratio``: the static's duration over the oracle's, where the oracle runs each regime
  at its best rate, switched at the block boundaries for free (a regime's best is never under the
  static's rate there).
- An allocation that dead-letters an item scores 0: it is no choice.
- Not a proof of optimality: the oracle is the best of the model's answers, measured. A scheduler may
  beat it where the model is wrong (the report says so when captured exceeds 1).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator, Mapping, Sequence

from benchmarks import headroom
from benchmarks.allocation import Allocation, completion_plan, label, start_config
from benchmarks.closed_loop_workload import Workload as Stream
from trident_flows.core.types import CPU, ClusterSpec, OpConfig
from trident_flows.runtime.costmodel import PipelineProfile
from trident_flows.sim.runner import SimRunner

BATCH_CAPS = (8, 16, 64)  # the model's answers at these batch-size caps are each measured
MAX_EVALS = 120  # allocations one hill-climb may measure
STEADY_BLOCKS = 3  # a regime's measuring stream, in multiples of its largest block (its middle third is timed) ...
STEADY_ITEMS_FIRST = 3000  # ... at most this many at first (gpu-ocr's born-digital blocks hold 21,000: one measure took minutes) ...
# ... doubled up to this many while the input closes before the timed third ends (queues grow with their pools,
# backpressure.items_bound: on 256 nodes tens of thousands of items are between the operators)
STEADY_ITEMS_MAX = 800_000
_STEP_S = 1.0  # the longest step, in simulated seconds, between two looks at the items done


@dataclass(frozen=True)
class SimulatedHeadroom:
    """What ``simulated_headroom`` measured (durations in seconds at the stream's time scale)."""

    oracle_s: float
    static_s: float
    per_regime_items_per_s: Mapping[str, float]
    per_regime_allocation: Mapping[str, str]
    static_items_per_s: Mapping[str, float]
    static_allocation: str
    evals: int
    per_regime: Mapping[str, Allocation] = field(default_factory=dict, compare=False, repr=False)  # the allocations labelled above
    static: Allocation = field(default=(), compare=False, repr=False)

    @property
    def ratio(self) -> float:
        return self.static_s / self.oracle_s

    def to_dict(self) -> dict[str, object]:
        return {"headroom": self.ratio, "oracle_s": self.oracle_s, "static_s": self.static_s,
                "per_regime_items_per_s": dict(self.per_regime_items_per_s), "per_regime_allocation": dict(self.per_regime_allocation),
                "static_items_per_s": dict(self.static_items_per_s), "static_allocation": self.static_allocation,
                "allocations_measured": self.evals}


def simulated_headroom(workload: headroom.Workload, stream: Stream, cluster: ClusterSpec, max_evals: int = MAX_EVALS,
                       meter: "Meter | None" = None, seeds: Mapping[str, Sequence[Allocation]] | None = None,
                       static_evals: int | None = None) -> SimulatedHeadroom:
    """Per regime the best measured allocation, and the best measured static. ``meter``: a ``meter_for`` this
    workload whose measures are kept between calls; ``seeds``: more starting allocations per regime (e.g. what a
    policy ran there), each measured beside the model's answers; ``static_evals``: measures the static's climb may
    take (default ``max_evals``; 1: the best of the model's statics).

    The candidates are the fluid model's answers (``headroom.regime_optimum`` per regime and ``headroom.best_static``),
    searched over batch sizes up to each cap in ``BATCH_CAPS``: the fluid model counts a batch's cost per item and
    nothing else, so larger batches are never worse there, while in the simulator (as live) a batch is served whole
    by one replica and the queues between operators are bounded. Per regime, the best candidate is hill-climbed
    (``climb``, at most ``max_evals`` measures); so is the static whose measured duration, the regimes' rates weighted
    by their items, is shortest. An allocation that dead-letters an item (out of memory until its retries ran out)
    scores 0: it is no choice, though its dead-lettered items count as done, and fast."""
    items = regime_items(workload)
    measure = meter or meter_for(workload, stream, cluster)
    optima: list[Allocation] = []
    statics: list[Allocation] = []
    for cap in BATCH_CAPS:
        capped = replace(workload, batches=tuple(b for b in workload.batches if b <= cap))
        opts = headroom.options(capped)
        found = {r: headroom.regime_optimum(capped, r, opts) for r in items}
        optima += [_allocation(workload.profile, a) for _, a in found.values()]
        statics.append(_allocation(workload.profile, headroom.best_static(capped, {r: t for r, (t, _) in found.items()}, opts)))
    best = {}
    for r in items:
        start = max(optima + statics + list((seeds or {}).get(r, ())), key=lambda a: measure.rate(a, r))  # noqa: B023 - used at once
        best[r] = climb(start, lambda a: measure.rate(a, r), max_evals)  # noqa: B023 - used at once
    duration = lambda a: sum(n / max(measure.rate(a, r), 1e-9) for r, n in items.items())  # noqa: E731
    static = climb(min(statics, key=duration), lambda a: -duration(a), max_evals if static_evals is None else static_evals)
    for r in items:  # a climb may stop under the static's rate on a regime; the static is a candidate too
        if measure.rate(static, r) > measure.rate(best[r], r):
            best[r] = static
    lost = [r for r in items if measure.rate(best[r], r) <= 0]
    if lost:
        raise RuntimeError(f"regime(s) {lost}: every allocation measured dead-lettered items (out of memory); "
                           "the workload's device memory is too small for its batches")
    oracle_s = sum(n / measure.rate(best[r], r) for r, n in items.items())
    return SimulatedHeadroom(oracle_s, duration(static), {r: measure.rate(a, r) for r, a in best.items()},
                             {r: label(a) for r, a in best.items()}, {r: measure.rate(static, r) for r in items},
                             label(static), measure.evals, dict(best), static)


def regime_items(workload: headroom.Workload) -> dict[str, int]:
    """Items of each regime over the workload's schedule."""
    items: dict[str, int] = defaultdict(int)
    for regime, n in workload.schedule:
        items[regime] += n
    return dict(items)


def meter_for(workload: headroom.Workload, stream: Stream, cluster: ClusterSpec) -> "Meter":
    """A ``Meter`` whose measuring stream per regime is ``STEADY_BLOCKS`` times its largest block (capped)."""
    largest: dict[str, int] = defaultdict(int)
    for regime, n in workload.schedule:
        largest[regime] = max(largest[regime], n)
    return Meter(workload.profile, stream, cluster, {r: min(STEADY_BLOCKS * n, STEADY_ITEMS_FIRST) for r, n in largest.items()})


class Meter:
    """Steady rates of allocations on regimes, each measured once."""

    def __init__(self, profile: PipelineProfile, stream: Stream, cluster: ClusterSpec, counts: Mapping[str, int]) -> None:
        self.profile, self.stream, self.cluster, self.counts = profile, stream, cluster, counts
        self._rates: dict[tuple[Allocation, str], float] = {}

    @property
    def evals(self) -> int:
        return len(self._rates)

    def rate(self, allocation: Allocation, regime: str) -> float:
        key = (allocation, regime)
        if key not in self._rates:
            self._rates[key] = steady_rate(self.profile, allocation, regime, self.counts[regime], self.stream, self.cluster)
        return self._rates[key]


def climb(start: Allocation, score: Callable[[Allocation], float], max_evals: int) -> Allocation:
    """Hill-climb from ``start``: take the best neighbour while it scores higher, for at most ``max_evals`` scores."""
    best, best_score, used = start, score(start), 1
    while used < max_evals:
        improved = False
        for candidate in _neighbours(best):
            if used >= max_evals:
                break
            used += 1
            value = score(candidate)
            if value > best_score * (1 + 1e-6):
                best, best_score, improved = candidate, value, True
        if not improved:
            break
    return best


def _neighbours(allocation: Allocation) -> Iterator[Allocation]:
    """One CPU replica moved between operators' CPU groups, or one group's batch size doubled or halved."""
    ops = dict(allocation)
    for name, groups in allocation:
        for k, (config, n) in enumerate(groups):
            for b in (config.batch_size * 2, config.batch_size // 2):
                if 1 <= b <= max(headroom.BATCHES):
                    yield _with(allocation, name, groups[:k] + ((replace(config, batch_size=b), n),) + groups[k + 1:])
    for src, groups in allocation:
        for k, (config, _n) in enumerate(groups):
            if config.device != CPU or sum(m for _, m in groups) <= 1:
                continue
            taken = tuple((c, m - (j == k)) for j, (c, m) in enumerate(groups) if m - (j == k) > 0)
            for dst, others in ops.items():
                cpu = [j for j, (c, _) in enumerate(others) if c.device == CPU]
                if dst == src or not cpu:
                    continue
                j = cpu[0]
                grown = others[:j] + ((others[j][0], others[j][1] + 1),) + others[j + 1:]
                yield _with(_with(allocation, src, taken), dst, grown)


def _with(allocation: Allocation, name: str, groups: tuple[tuple[OpConfig, int], ...]) -> Allocation:
    return tuple((n, groups if n == name else g) for n, g in allocation)


def steady_rate(profile: PipelineProfile, allocation: Allocation, regime: str, count: int, stream: Stream, cluster: ClusterSpec) -> float:
    """Input items/s of ``allocation`` on ``regime`` alone, over a third of a stream of at least ``count`` items
    timed once the allocation is in place and the pipeline filled, and before the whole stream has been read (fill
    and drain left out, as the fluid model leaves them out; when the input closes, lingering partial batches flush
    at once). The stream is doubled until that holds, up to ``STEADY_ITEMS_MAX``. An allocation that mixes
    configurations for one operator (GPU shares beside CPU replicas) starts with the config holding the most
    replicas and is then brought to the full allocation by one applied plan before the measured third begins."""
    while True:
        rate = _timed_third(profile, allocation, regime, count, stream, cluster)
        if rate is not None:
            return rate
        if count >= STEADY_ITEMS_MAX:
            raise RuntimeError(f"{regime}: the input was read to its end before a third of {count} items could be timed; "
                               f"raise STEADY_ITEMS_MAX (now {STEADY_ITEMS_MAX})")
        count = min(2 * count, STEADY_ITEMS_MAX)


def _timed_third(profile: PipelineProfile, allocation: Allocation, regime: str, count: int, stream: Stream,
                 cluster: ClusterSpec) -> float | None:
    """The rate of ``steady_rate`` for one stream length; None when the input closed before the timed third ended."""
    spec = replace(stream, variant=f"steady-{regime}", regimes=f"{regime}:{count}", memory_spikes=()).spec(
        profile, start_config(allocation), f"steady-{regime}")
    runner = SimRunner(spec, cluster)
    runner.start()
    plan = completion_plan(allocation)
    if plan is not None:
        runner.apply(plan)
    first = max(count // 3, runner.inputs_done + count // 6)  # the timed third starts once the allocation is in place and filled
    last = first + count // 3
    if last > count:
        return None
    t_first = t_last = None
    t0 = runner.now
    while t_last is None and not runner.finished:
        # steps of about count / 300 items at the rate so far (the timed third spans ~100 of them), at most _STEP_S
        step = _STEP_S if runner.inputs_done == 0 else min(_STEP_S, (runner.now - t0) / runner.inputs_done * count / 300)
        runner.run_until(runner.now + max(step, 1e-3))
        if t_first is None and runner.inputs_done >= first:
            t_first = runner.now
        if runner.inputs_done >= last:
            t_last = runner.now
        elif runner.input_closed:
            return None
    if t_first is None or t_last is None or t_last <= t_first:
        return None
    if runner.inputs_dead:
        return 0.0  # items ran out of memory until dead-lettered: no choice (they count as done, and fast)
    return (last - first) / (t_last - t_first)


def _allocation(profile: PipelineProfile, replicas: Mapping[headroom.Option, float]) -> Allocation:
    """The model's replicas as whole replicas per operator and config, in pipeline order (every operator keeps one)."""
    out = []
    for op in profile.operators:
        mine = [(OpConfig.make(o.device, batch_size=o.batch_size, gpus=0.0 if o.device == CPU else o.gpus), round(n))
                for o, n in replicas.items() if o.operator == op.name and n > 1e-6]
        groups = tuple((c, n) for c, n in mine if n > 0) or ((max(mine, key=lambda g: g[1])[0] if mine else OpConfig.make(CPU), 1),)
        out.append((op.name, groups))
    return tuple(out)
