"""The closed-loop suite in the simulator: every suite workload, every system that can be simulated,
scored against the best static configuration in hindsight (S*) and the per-regime oracle (O).
Every figure here is SIMULATED (``trident_flows.sim``).

Contract of ``run(quick, workloads, jobs, log) -> dict`` (the suite's ``sim`` section):
- Streams, node and starting configurations are the live suite's (``suite_workloads``).
- Systems (``SYSTEMS``; ``DEFINITIONS`` has one sentence each): ``static-default``; ``threshold``,
  ``ds2`` and ``trident`` starting from static-default; and two references that use knowledge no user
  has, both searched in the space trident searches: ``static-hindsight`` (S*, the best single static
  allocation for the whole stream) and ``oracle`` (O, each regime's best allocation switched ahead of
  its block; never below S*).
- Per workload (``summarise``): ``headroom`` (O / S*), ``t_over_oracle`` (T / O), ``gain_captured``
  ((T - S*) / (O - S*)), trident's ratios to S* and static-default, OOMs, ``items_lost`` and
  ``oracle_beaten_by_more_than_2pct``; ``raw`` keeps per system its rate, OOMs, plans per block and errors.
- Throughput is input items / (last output - first output), as the live suite measures it.
"""

from __future__ import annotations

import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

from benchmarks import allocation, sim_headroom, suite_workloads
from benchmarks.allocation import Allocation, allocation_of
from benchmarks.baselines import STATIC_DEFAULT, STATIC_HINDSIGHT
from benchmarks.closed_loop_runs import TICK_S
from benchmarks.oracle_policy import OraclePolicy
from trident_flows.core.decision import Decision
from trident_flows.core.state import RunnerState
from trident_flows.core.types import BatchSample, ClusterSpec
from trident_flows.runtime.costmodel import PipelineProfile
from trident_flows.runtime.spec import PipelineSpec
from trident_flows.scheduler.policies import make_policy
from trident_flows.scheduler.throughput_measure import stream_positions
from trident_flows.sim.actor_start import ActorStart
from trident_flows.sim.driver import simulate
from trident_flows.sim.static_search import StaticConfig

ORACLE = "oracle"
POLICIES = ("threshold", "ds2", "trident")
SYSTEMS = (STATIC_DEFAULT, STATIC_HINDSIGHT, *POLICIES, ORACLE)
DEFINITIONS = {
    STATIC_DEFAULT: "the pipeline's own default sizing for the node: what a user who writes the pipeline runs",
    STATIC_HINDSIGHT: ("S*: the best single static allocation for the whole stream, hill-climbed on the simulated stream over "
                       "replica counts, batch sizes, devices and mixed configurations; uses knowledge no user has"),
    "threshold": "scale an operator out when its queue grows and in when its replicas idle, starting from static-default",
    "ds2": "DS2 (Kalavri et al., OSDI 2018): rate-based parallelism for every operator at once, starting from static-default",
    "trident": "this project's scheduler, starting from static-default with no memory of earlier runs",
    ORACLE: ("O: each regime's best allocation (simulated, hill-climbed), switched at each operator one cold start ahead of "
             "its block, paying every cold start, and never below S*; uses knowledge no user has"),
}
BEAT_TOLERANCE = 0.02  # a system more than 2% above O means the search missed an allocation
SEED_ROUNDS = 2
NO_HEADROOM = 0.01  # gain_captured is undefined where O is within 1% of S*
REPEATS, QUICK_REPEATS = 3, 1  # runs of each adaptive system; its figures are the median one's
STATIC_EVALS, QUICK_STATIC_EVALS = 40, 8  # whole-stream runs one climb of S* may take
# steady rates one per-regime climb may measure (the whole stream's S* is climbed on whole-stream runs instead of the
# steady rates sim_headroom's own static climb would take: that climb cost ~3 measures per step)
REGIME_EVALS, QUICK_REGIME_EVALS = 60, 10
CUT_AFTER = 1.5  # a search's candidate is stopped after 1.5x the time the best so far takes for the stream
SEEDS_KEPT = 4  # allocations a policy ran in one regime that seed the oracle's next climb (most ticks first)


@dataclass
class SystemRun:
    """One simulated run of one system over the whole stream."""

    system: str
    items_per_s: float | None = None
    ooms: int | None = None
    items_lost: int | None = None
    reconfigurations: int | None = None
    plans_per_block: list[int] = field(default_factory=list)
    error: str = ""
    cut: bool = False  # a search's candidate stopped once it could no longer win
    sim_wall_s: float = 0.0
    seen: dict[str, dict[Allocation, int]] = field(default_factory=dict)  # regime -> allocation running -> ticks
    repeat_items_per_s: list[float | None] = field(default_factory=list)  # every repeat's rate (adaptive systems)

    def to_dict(self) -> dict[str, Any]:
        return {"system": self.system, "items_per_s": self.items_per_s, "ooms": self.ooms, "items_lost": self.items_lost,
                "reconfigurations": self.reconfigurations, "plans_per_block": self.plans_per_block, "error": self.error,
                "cut": self.cut, "sim_wall_s": round(self.sim_wall_s, 2), "repeat_items_per_s": self.repeat_items_per_s}


class _Watched:
    """A policy seen from outside: the allocation running and the block the head reads at each tick, and each plan's
    block. Everything else is the wrapped policy's."""

    def __init__(self, policy: Any, blocks: Sequence[tuple[str, int, int]]) -> None:
        self._policy, self._blocks = policy, blocks
        self.ticks: list[tuple[int, Allocation]] = []
        self.plans: list[int] = []

    def _block(self, state: RunnerState) -> int:
        head = stream_positions(state)[state.operators[0].name]
        return next((k for k, (_, _, end) in enumerate(self._blocks) if head < end), len(self._blocks) - 1)

    def decide(self, state: RunnerState, samples: Sequence[BatchSample]) -> Decision:
        block = self._block(state)
        self.ticks.append((block, running_allocation(state)))
        decision = self._policy.decide(state, samples)
        if decision.plan is not None:
            self.plans.append(block)
        return decision

    def __getattr__(self, name: str) -> Any:
        return getattr(self._policy, name)


def static_policy(chosen: Allocation, items: int, cluster: ClusterSpec) -> OraclePolicy | None:
    """What runs ``chosen`` all along from ``allocation.start_config(chosen)``: nothing when it has one config per operator,
    else an oracle of one block that completes it at the first tick."""
    if allocation.completion_plan(chosen) is None:
        return None
    return OraclePolicy([("all", 0, items)], {"all": chosen}, cluster.total_cpus, cluster.total_gpus)


def running_allocation(state: RunnerState) -> Allocation:
    """The (config, replicas) groups each operator runs, canaries left out, in a canonical order."""
    return tuple((op.name, tuple(sorted(op.configs().items(), key=lambda g: g[0].label()))) for op in state.operators)


@dataclass
class SimWorkload:
    """One suite workload prepared for the simulator."""

    suite: suite_workloads.SuiteWorkload
    profile: PipelineProfile
    stream: Any  # closed_loop_workload.Workload
    cluster: ClusterSpec
    start: StaticConfig  # static-default
    model_hindsight: StaticConfig
    # how the simulated nodes start actors and what a decision costs the clock per CPU second: the defaults are a cluster
    # whose nodes and controller have cores of their own (corpus_live's one node emulated on this machine shares them)
    actor_start: ActorStart = field(default_factory=ActorStart)
    decide_s_per_cpu_s: float = 1.0

    @property
    def blocks(self) -> list[tuple[str, int, int]]:
        return self.stream.blocks()

    def spec(self, system: str, start: StaticConfig | None = None) -> PipelineSpec:
        """The emulated pipeline ``system`` runs, from ``start`` (default static-default). Each operator may hold every CPU
        (no config holds less than one): the spec's replica cap never binds before the cluster does, so the policies
        search the space S* and O are searched in."""
        return self.stream.spec(self.profile, start or self.start, f"suite-sim-{self.suite.name}-{system}",
                                max_replicas=int(self.cluster.total_cpus))

    def run(self, system: str, policy: Any | None = None, start: StaticConfig | None = None, slower_than: float = 0.0) -> SystemRun:
        """Simulate the whole stream from ``start`` (default static-default) under ``policy`` (None: static). A search's
        candidate that cannot beat ``slower_than`` items/s is cut once it has run ``CUT_AFTER`` times as long as that rate
        takes for the stream (its rate is then None and ``cut`` true: it is no candidate)."""
        record = SystemRun(system)
        spec = self.spec(system, start)
        watched = None
        try:
            if system in POLICIES:
                policy = make_policy(system, spec=spec, cluster=self.cluster)
            watched = _Watched(policy, self.blocks) if policy is not None else None
            t0 = time.perf_counter()
            cap = CUT_AFTER * self.stream.items / slower_than if slower_than > 0 else None
            run = simulate(spec, self.cluster, watched, tick_s=TICK_S, duration_s=cap, actor_start=self.actor_start,
                           decide_s_per_cpu_s=self.decide_s_per_cpu_s)
            record.sim_wall_s = time.perf_counter() - t0
        except Exception as exc:  # noqa: BLE001 - a system that cannot run is reported, not fatal for the others
            record.error = f"{type(exc).__name__}: {exc}"
            record.seen = {}
            traceback.print_exc()
            return record
        s = run.summary
        if not run.runner.finished:
            record.cut = True
            return record
        record.items_per_s, record.ooms, record.reconfigurations = s["steady_items_per_s"], s["ooms"], s["reconfigurations"]
        record.items_lost = s["items_missing"]
        record.error = s["error"] or ""
        if watched is not None:
            record.plans_per_block = [watched.plans.count(k) for k in range(len(self.blocks))]
            for block, running in watched.ticks:
                seen = record.seen.setdefault(self.blocks[block][0], {})
                seen[running] = seen.get(running, 0) + 1
        return record

    def run_static(self, system: str, chosen: Allocation, slower_than: float = 0.0) -> SystemRun:
        """``chosen`` all along (``static_policy``)."""
        return self.run(system, static_policy(chosen, self.stream.items, self.cluster), allocation.start_config(chosen), slower_than)

    def run_oracle(self, per_block: Sequence[Allocation], slower_than: float = 0.0) -> SystemRun:
        """``per_block[k]`` from when block k reaches each operator (``OraclePolicy``), starting in ``per_block[0]`` as S* starts
        in its own allocation, and paying every cold start of a switch."""
        blocks = [(str(k), start, end) for k, (_, start, end) in enumerate(self.blocks)]
        configs = {str(k): chosen for k, chosen in enumerate(per_block)}
        return self.run(ORACLE, OraclePolicy(blocks, configs, self.cluster.total_cpus, self.cluster.total_gpus),
                        start=allocation.start_config(per_block[0]), slower_than=slower_than)

    def search_oracle(self, per_regime: Mapping[str, Allocation], static: Allocation) -> tuple[list[Allocation], SystemRun, int]:
        """O: each block's regime's best allocation or S* in every block, whichever runs the whole stream faster, then block
        by block the best of its regime's best, S* and its neighbours' choices (a short block may not pay for its cold
        starts); returns the choices, their run and the runs made."""
        switching = [per_regime[regime] for regime, _, _ in self.blocks]
        steady = self.run_oracle([static] * len(switching))  # S* everywhere: where switching costs more than it gains
        choices, best_run, runs = [static] * len(switching), steady, 2
        first = self.run_oracle(switching, slower_than=run_rate(steady))
        if run_rate(first) > run_rate(best_run):
            choices, best_run = switching, first
        for k in range(len(choices)):
            neighbours = [choices[j] for j in (k - 1, k + 1) if 0 <= j < len(choices)]
            for alternative in dict.fromkeys([switching[k], static, *neighbours]):
                if alternative == choices[k]:
                    continue
                trial = choices[:k] + [alternative] + choices[k + 1:]
                run, runs = self.run_oracle(trial, slower_than=run_rate(best_run)), runs + 1
                if run_rate(run) > run_rate(best_run):
                    choices, best_run = trial, run
        return choices, best_run, runs


def prepare(name: str, quick: bool) -> SimWorkload:
    """Workload ``name`` as the live suite runs it: the same seeded regime blocks at the same time scale, on one node
    of 16 CPUs (+ GPUs), starting from static-default."""
    suite = suite_workloads.suite_workloads(quick, [name])[0]
    profile = PipelineProfile.load(suite.profile)
    stream, _ = suite.streams()
    baselines = suite.baselines(profile, stream, stream.rows(profile))
    cluster = ClusterSpec.single_node(suite_workloads.CPUS, suite.gpus, gpu_memory_bytes=suite_workloads.DEVICE_MEMORY)
    return SimWorkload(suite, profile, stream, cluster, baselines.start(STATIC_DEFAULT), baselines.start(STATIC_HINDSIGHT))


def run_rate(run: SystemRun) -> float:
    """``run``'s items/s, 0 for a run that failed or lost items (it is no candidate for S* or O)."""
    return run.items_per_s if run.items_per_s and not run.error and not run.items_lost else 0.0


def search_static_hindsight(w: SimWorkload, candidates: Sequence[Allocation], max_evals: int) -> tuple[Allocation, SystemRun, int]:
    """S*: the best of ``candidates`` on the whole simulated stream, hill-climbed (each allocation run once)."""
    runs: dict[Allocation, SystemRun] = {}

    def score(candidate: Allocation) -> float:
        if candidate not in runs:
            runs[candidate] = w.run_static(STATIC_HINDSIGHT, candidate, slower_than=max(map(run_rate, runs.values()), default=0.0))
        return run_rate(runs[candidate])

    start = max(dict.fromkeys(candidates), key=score)
    best = sim_headroom.climb(start, score, max_evals)
    return best, runs[best], len(runs)


def evaluate(name: str, quick: bool, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every system on one workload, the searches for S* and O, and the workload's figures (``summarise``).

    Adaptive systems tick every ``TICK_S`` seconds with each tick's CPU time charged to the simulated clock, so one
    run can land in either of two modes: each runs ``REPEATS`` times (``QUICK_REPEATS`` with ``quick``) and its
    figures are the run of median rate (``median_run``; ``repeat_items_per_s`` keeps every repeat's).
    S* is hill-climbed (``sim_headroom.climb``) on the whole stream's simulated rate from the best of static-default,
    the cost model's best static for the stream, the simulated headroom's static and each regime's best allocation.
    O starts from each regime's best allocation (``sim_headroom.simulated_headroom``: the cost model's answers
    hill-climbed on steady rates), switched by ``OraclePolicy`` at each operator one cold start ahead of its block
    (warm when the block arrives), paying every cold start of a switch (it starts in its first block's allocation,
    as S* starts in its own: the same run as S* when it chooses S* in every block, where that is faster); then block
    by block, its regime's best, S* or a neighbouring block's choice where that runs the whole stream faster (a
    short block may not pay for its cold starts). When a system beats O by more than ``BEAT_TOLERANCE``, the
    allocations it ran in each regime seed new climbs and the oracle runs again (at most ``SEED_ROUNDS`` rounds);
    whatever still beats it is reported in ``oracle_beaten_by``."""
    t0 = time.perf_counter()
    w = prepare(name, quick)
    runs: dict[str, SystemRun] = {STATIC_DEFAULT: w.run(STATIC_DEFAULT)}
    for system in POLICIES:
        runs[system] = median_run([w.run(system) for _ in range(QUICK_REPEATS if quick else REPEATS)])
        log(f"{name}: {system} {runs[system].items_per_s} items/s (repeats {runs[system].repeat_items_per_s}), plans per block "
            f"{runs[system].plans_per_block}{', error ' + runs[system].error if runs[system].error else ''}")
    workload = w.suite.headroom_workload(w.profile)
    meter = sim_headroom.meter_for(workload, w.stream, w.cluster)
    regime_evals = QUICK_REGIME_EVALS if quick else REGIME_EVALS
    found = sim_headroom.simulated_headroom(workload, w.stream, w.cluster, max_evals=regime_evals, meter=meter, static_evals=1)
    per_regime = dict(found.per_regime)
    candidates = [allocation_of(w.start), allocation_of(w.model_hindsight), found.static, *per_regime.values()]
    best_static, runs[STATIC_HINDSIGHT], static_evals = search_static_hindsight(w, candidates, QUICK_STATIC_EVALS if quick else STATIC_EVALS)
    log(f"{name}: S* {runs[STATIC_HINDSIGHT].items_per_s} items/s ({allocation.label(best_static)}; {static_evals} whole-stream runs)")
    oracle_choices, oracle_run, oracle_runs = w.search_oracle(per_regime, best_static)
    rounds = 0
    while True:
        s_star = run_rate(runs[STATIC_HINDSIGHT])
        o = max(run_rate(oracle_run), s_star)
        beaters = {s: r for s, r in runs.items() if s in POLICIES and run_rate(r) > o * (1 + BEAT_TOLERANCE)}
        log(f"{name}: oracle run {oracle_run.items_per_s} items/s, O {o:.3f}; beaten by {sorted(beaters) or 'none'}")
        if not beaters or rounds >= SEED_ROUNDS:
            break
        rounds += 1
        seeds = {r: [a for a, _ in sorted(seen.items(), key=lambda kv: -kv[1])[:SEEDS_KEPT]]
                 for run in beaters.values() for r, seen in run.seen.items()}
        found = sim_headroom.simulated_headroom(workload, w.stream, w.cluster, max_evals=regime_evals, meter=meter, seeds=seeds,
                                                static_evals=1)
        per_regime = dict(found.per_regime)
        extra = [a for allocations in seeds.values() for a in allocations]
        best_static, runs[STATIC_HINDSIGHT], more = search_static_hindsight(w, [best_static, *extra], QUICK_STATIC_EVALS if quick else STATIC_EVALS)
        static_evals += more
        oracle_choices, oracle_run, more = w.search_oracle(per_regime, best_static)
        oracle_runs += more
    runs[ORACLE] = oracle_run
    oracle_switching = run_rate(oracle_run)
    summary = summarise(runs, oracle_switching)
    raw = {"note": w.suite.note, "regimes": w.suite.regimes, "items": w.stream.items, "time_scale": w.suite.time_scale,
           "gpus": w.suite.gpus, "runs": {s: r.to_dict() for s, r in runs.items()},
           "static_hindsight_allocation": allocation.label(best_static), "static_hindsight": allocation.to_data(best_static),
           "static_hindsight_whole_stream_runs": static_evals,
           "oracle_regime_allocations": {r: allocation.label(a) for r, a in per_regime.items()},
           "oracle_block_allocations": [allocation.label(a) for a in oracle_choices],
           "oracle_blocks": [allocation.to_data(a) for a in oracle_choices], "oracle_whole_stream_runs": oracle_runs,
           "oracle_steady_items_per_s": dict(found.per_regime_items_per_s), "oracle_switching_items_per_s": oracle_switching,
           "steady_rates_measured": meter.evals, "seed_rounds": rounds, "bench_seconds": round(time.perf_counter() - t0, 1)}
    return {"summary": summary, "raw": raw}


def median_run(repeats: Sequence[SystemRun]) -> SystemRun:
    """The repeat of median rate (the upper one of an even count; a run with no rate counts as the slowest), holding every
    repeat's rate and the sum of their OOMs and items lost (none may hide behind the median)."""
    ordered = sorted(repeats, key=run_rate)
    chosen = ordered[len(ordered) // 2]
    return replace(chosen, ooms=sum(r.ooms or 0 for r in repeats), items_lost=sum(r.items_lost or 0 for r in repeats),
                   repeat_items_per_s=[r.items_per_s for r in repeats])


def summarise(runs: Mapping[str, SystemRun], oracle_switching: float) -> dict[str, Any]:
    """The figures of one workload; ``runs[ORACLE]`` is the switching oracle's run and O = max(its rate, S*'s).
    ``headroom`` (O / S*), ``t_over_oracle`` (T / O), ``gain_captured`` ((T - S*) / (O - S*); None when O is within
    ``NO_HEADROOM`` of S*), ``trident_vs_static_hindsight`` (T / S*), ``trident_vs_static_default``, ``trident_ooms``,
    ``best_static_ooms``, ``items_lost`` (every system), ``oracle_beaten_by_more_than_2pct`` (any adaptive system above O by
    more than ``BEAT_TOLERANCE``), ``ds2_max_reconfigurations_per_block``."""
    t, s_star, default = (run_rate(runs[s]) if s in runs else 0.0 for s in ("trident", STATIC_HINDSIGHT, STATIC_DEFAULT))
    o = max(oracle_switching, s_star)
    beaten = {s: round(run_rate(r) / o, 4) for s, r in runs.items() if s in POLICIES and o and run_rate(r) > o * (1 + BEAT_TOLERANCE)}
    ds2 = runs.get("ds2")

    def ratio(a: float, b: float) -> float | None:
        return a / b if a and b else None

    return {
        "headroom": ratio(o, s_star),
        "t_over_oracle": ratio(t, o),
        "gain_captured": (t - s_star) / (o - s_star) if t and s_star and o > s_star * (1 + NO_HEADROOM) else None,
        "trident_vs_static_hindsight": ratio(t, s_star),
        "trident_vs_static_default": ratio(t, default),
        "trident_ooms": runs["trident"].ooms if "trident" in runs else None,
        "best_static_ooms": runs[STATIC_HINDSIGHT].ooms if STATIC_HINDSIGHT in runs else None,
        "items_lost": sum(r.items_lost or 0 for r in runs.values()),
        "oracle_beaten_by_more_than_2pct": bool(beaten),
        "oracle_beaten_by": beaten,
        "ds2_max_reconfigurations_per_block": max(ds2.plans_per_block) if ds2 is not None and ds2.plans_per_block else None,
    }


def run(quick: bool = False, workloads: Sequence[str] = suite_workloads.WORKLOADS, jobs: int = 1,
        log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every chosen workload (``jobs`` worker processes); returns ``{"summary": {workload: ...}, "raw": {workload: ...}}``."""
    t0 = time.perf_counter()
    if jobs <= 1:
        results = {name: evaluate(name, quick, log) for name in workloads}
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = {name: pool.submit(evaluate, name, quick) for name in workloads}
            results = {}
            for name, future in futures.items():
                results[name] = future.result()
                log(f"{name}: {results[name]['summary']}")
    return {"summary": {n: r["summary"] for n, r in results.items()},
            "raw": {**{n: r["raw"] for n, r in results.items()},
                    "_run": {"quick": quick, "workloads": list(workloads), "jobs": jobs, "tick_s": TICK_S,
                             "bench_seconds": round(time.perf_counter() - t0, 1), "definitions": DEFINITIONS}}}
