"""The live section of ``bench corpus-trident --live``: the best static allocation in hindsight (S*) and trident LIVE on one
node, on a stream cut from each corpus workload, beside the same runs in the simulator. Figures under ``sim_*`` keys and in
``raw.live.<workload>.sim_runs`` are SIMULATED; every other figure of the section is LIVE (emulated operators sleeping
their cost models' seconds, on a local Ray node).

Contract of ``run(quick, workloads, previous, log) -> BenchResult`` (the report's ``live`` section):
- Stream (``live_stream``): per corpus workload, the first shards of its corpus stream in the same seeded order, as many as
  the cost model's best static needs at least ``LIVE_S`` seconds for at the workload's time scale (``TIME_SCALES``), on ONE
  node of 16 logical CPUs + 2 logical GPUs (the closed-loop suite's); refused where its fastest source's best rate would pass
  ``MAX_ITEMS_PER_S`` input items, or its best static would pass ``MAX_ROWS_PER_S`` rows into one operator (``rows_per_item``), live. ``quick``: those blocks cut to ``QUICK_BLOCK_ITEMS`` items each, a smoke test, not a measurement.
- S* (``simulate``): searched in the simulator for that stream as corpus-trident searches it (``corpus_trident.search_static``;
  budgets ``STATIC_EVALS``, ``REGIME_EVALS``; ``quick``: climbed from static-default on whole-stream runs alone).
- Live (``live_runs``): static-hindsight (S*) once and trident (from static-default, no memory) ``trident_live_runs`` times
  (``LIVE_TRIDENT_RUNS`` where its simulated repeats spread wider than ``TOLERANCE``, else once), interleaved by the
  closed-loop suite's runs (``closed_loop_suite.run_systems``) on a local Ray node started for the workload.
- Simulated counterpart: the same stream, start and systems as ``suite_sim`` runs them (S*: its run in the search; trident:
  the median of ``SIM_REPEATS`` runs, 1 with ``quick``, stopped as corpus-trident stops them), on the node the live runs
  have (``live_node``): its actor starts share this machine's cores, and each decision costs the clock
  ``LIVE_DECIDE_S_PER_CPU_S`` seconds per CPU second, as the live controller shares them with the pipeline. Each live
  trident run is also replayed (``replay``): its own plans at the same seconds since its start
  (``replay_policy.ReplayPolicy``) on that node, so the simulator is judged on the live run's moves apart from the
  policy's run-to-run spread.
- Summary per workload (``summarise``): ``static_hindsight_items_per_s``, ``trident_items_per_s`` (its live runs' median),
  ``trident_vs_static_hindsight``, ``sim_over_live.<system>`` (simulated / live items/s, medians),
  ``sim_throughput_error.<system>`` (|sim_over_live - 1|), ``trident_replayed_over_live`` (the median over live trident runs
  of replayed / live items/s), ``trident_live_runs``, ``trident_sim_spread`` (the simulated repeats' max / min),
  ``trident_ooms_max_run`` (the most any live trident run had), ``best_static_ooms``, ``items_lost`` (None where a run
  failed); ``targets``.
- The report's simulated section is kept from ``previous`` (``closed_loop_suite.sections``), and so are the live figures of
  corpus workloads this run does not measure where they ran on the same code (``closed_loop_suite.same_code``,
  ``merge_earlier``).
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import ray

from benchmarks import allocation, closed_loop_suite, corpus_headroom, corpus_trident, corpus_workloads, headroom, suite_sim
from benchmarks.baselines import STATIC_DEFAULT, STATIC_HINDSIGHT, Baselines
from benchmarks.closed_loop_runs import RunRecord
from benchmarks.closed_loop_stats import per_system
from benchmarks.closed_loop_workload import CPUS, GPUS
from benchmarks.local_ray import start_local_ray
from benchmarks.replay_policy import ReplayPolicy
from benchmarks.report import BenchResult, Target
from trident_flows.core.types import Plan
from trident_flows.runtime.costmodel import PipelineProfile
from trident_flows.sim.actor_start import ActorStart
from trident_flows.sim.driver import simulate as simulate_run
from trident_flows.sim.static_search import reach

TRIDENT = corpus_trident.TRIDENT
SYSTEMS = (STATIC_HINDSIGHT, TRIDENT)  # the live runs, in this order
# The stream: the fewest first shards whose best static takes at least LIVE_S seconds at the cost model's rates, so that S*
# runs about 6-8 minutes live and the four runs with their start-ups stay within 35 minutes.
LIVE_S = 360.0
# The time scale multiplies every modelled second (cold starts too). The emulated operators sleep; what limits a time scale
# is the runtime's own per-item work on this machine's 2 real cores, about 100 items/s (MAX_ITEMS_PER_S; the closed-loop
# suite's fastest regime runs ~73 items/s at its scale 0.5). Documents: at 0.4 the web documents' best rate is ~43 items/s
# live and 5 shards (archive 1000, web 3000, archive 1000 items) take ~6 min at S*; a larger scale would make the 1000-item
# shards run past the budget. Video: the corpus's scenes splits each video into 33.4 clips, so the rows the runtime moves, not
# the input videos, bind: at scale 0.3 the clips source's best static sends ~370 clip rows/s into motion, and a live S* run
# moved its first clips shard's 9,760 rows in 27 s (360 rows/s) where the simulator took 10 s; the web videos, at ~90 rows/s,
# ran within 3% of the simulator. At scale 1 the clips source sends ~110 rows/s, and 2 shards (clips, web: 584 videos) take
# ~7 min at S*.
TIME_SCALES = {"documents-corpus": 0.4, "video-corpus": 1.0}
MAX_ITEMS_PER_S = 100.0
MAX_ROWS_PER_S = 300.0  # rows into one operator a second, at the best static's rates (the live runtime moved ~360, above)
QUICK_BLOCK_ITEMS = {"documents-corpus": 30, "video-corpus": 10}
# S*'s search: corpus-trident's budgets (on video its steady rates take ~3 min of the ~4 the simulated part takes). --quick
# measures no steady rate (one costs seconds however short the stream: ~2 min on video) and climbs S* from static-default.
STATIC_EVALS, QUICK_STATIC_EVALS = corpus_trident.STATIC_EVALS, suite_sim.QUICK_STATIC_EVALS
REGIME_EVALS, QUICK_REGIME_EVALS = corpus_trident.REGIME_EVALS, 0
TOLERANCE = 0.10  # |simulated / live items/s - 1| the simulator is held to
# Trident's simulated runs differ from run to run (each tick's CPU time is charged to the clock, and a decision on a knife's
# edge flips with it): on the live video stream 9 runs (ee5d474) spread 0.78-1.09 items/s, on the documents stream not at all.
# The counterpart is the median of SIM_REPEATS runs, and where they spread wider than TOLERANCE (max / min - 1) trident runs
# LIVE_TRIDENT_RUNS times live and its live median is compared: one live run against the median of a +-14% spread measures
# the draw, not the simulator.
SIM_REPEATS = 7
# What a live tick costs beyond its tick_s per CPU second the simulator measures for the same decision: the live controller
# shares this machine's 2 cores with the runner, the replicas and Ray's own processes, and reads the runner's state and
# samples over Ray calls. The live section on 3f49cdd: a tick without a plan came 0.315 s (video, mean of 3 runs) and
# 0.110 s (documents) after the previous one's tick_s, where the simulator charged a decision 0.076 s and 0.030 s of CPU on
# the same streams (means over 6 and 3 runs): 4.1 and 3.7 s per CPU second; the first 25 live ticks of a video run, the
# models' first fits beside 16 starting actors, took 0.66-0.89 s of wall time each against 0.11-0.14 s of CPU simulated.
# Charged 1 s per CPU second, simulated trident on the live video stream decided ~15% sooner than live and ran at a median
# of 1.07 items/s over 16 runs against 0.89 live; at 2 and 6 s per CPU second 0.955 and 0.968 (8 runs each).
LIVE_DECIDE_S_PER_CPU_S = 4.0
LIVE_TRIDENT_RUNS = 3
START_STOP_S = 30.0  # a live run's start (to its first output) and stop beside its items, for the estimate
RAY_START_S = 20.0
RAY_ATTEMPTS = 3


@dataclass(frozen=True)
class LiveCorpus:
    """One corpus workload's live stream, prepared for the simulator and the live runs."""

    sim: suite_sim.SimWorkload  # its ``suite`` is a ``corpus_trident.CorpusCase``, its ``start`` static-default
    workload: headroom.Workload
    sizing: Mapping[str, Any]


@dataclass(frozen=True)
class Simulated:
    """S* searched for a live stream and the simulated runs of the live systems (and static-default, trident's start)."""

    search: corpus_trident.StaticSearch
    runs: Mapping[str, suite_sim.SystemRun]  # static-default, static-hindsight, trident (the median repeat)
    trident_unfinished: int
    seconds: float
    trident_repeats: Sequence[float | None]  # every simulated trident repeat's items/s

    @property
    def trident_spread(self) -> float | None:
        """The simulated trident repeats' fastest over slowest rate (None where one did not finish)."""
        rates = list(self.trident_repeats)
        return max(rates) / min(rates) if rates and all(rates) else None

    def trident_live_runs(self, quick: bool) -> int:
        """How many times trident runs live: ``LIVE_TRIDENT_RUNS`` where its simulated repeats spread wider than
        ``TOLERANCE`` (or did not all finish), else once (once with ``quick``)."""
        spread = self.trident_spread
        return 1 if quick or (spread is not None and spread - 1.0 <= TOLERANCE) else LIVE_TRIDENT_RUNS


def live_stream(name: str, quick: bool) -> tuple[headroom.Workload, corpus_workloads.CorpusStream, dict[str, Any]]:
    """Corpus ``name`` on one node cut to its first shards (the module docstring) at ``TIME_SCALES[name]``, and how it was
    sized: the cost model's (``headroom.headroom``, each source's mean item) best static and best per-source rates at that
    time scale. A time scale at which a source's best rate passes ``MAX_ITEMS_PER_S`` is refused (``ValueError``)."""
    corpus, scale = corpus_workloads.CORPORA[name], TIME_SCALES[name]
    workload, stream = corpus_workloads.corpus_workload(name, False, 1)
    fluid = headroom.headroom(workload)
    fastest = {source: rate / scale for source, rate in fluid.per_regime_items_per_s.items()}
    if max(fastest.values()) > MAX_ITEMS_PER_S:
        raise ValueError(f"{name} at time scale {scale:g}: its {max(fastest, key=fastest.get)} items would run at up to "
                         f"{max(fastest.values()):.0f} items/s, past the {MAX_ITEMS_PER_S:g} the runtime moves on this machine")
    rates = {source: rate / scale for source, rate in fluid.static_items_per_s.items()}
    rows = {source: rate * rows_per_item(workload.profile) for source, rate in rates.items()}
    if max(rows.values()) > MAX_ROWS_PER_S:
        raise ValueError(f"{name} at time scale {scale:g}: its {max(rows, key=rows.get)} items would send {max(rows.values()):.0f} "
                         f"rows/s into one operator at the best static's rate, past the {MAX_ROWS_PER_S:g} the runtime moves on this "
                         f"machine; raise its time scale")
    shards = corpus_trident.shards_for(lambda k: corpus.model.blocks(k, corpus_workloads.SEED), rates, LIVE_S, 1)
    workload, stream = corpus_trident.resized(workload, stream, shards)
    if quick:
        cut = tuple((source, min(n, QUICK_BLOCK_ITEMS[name])) for source, n in workload.schedule)
        workload, stream = corpus_trident.with_schedule(workload, stream, cut)
    stream = replace(stream, time_scale=scale)
    sizing = {"shards": shards, "blocks": len(workload.schedule), "items": stream.items, "time_scale": scale, "quick": quick,
              "live_s": LIVE_S, "model_static_items_per_s": rates, "model_best_items_per_s": fastest, "model_static_rows_per_s": rows,
              "model_static_s": sum(n / rates[source] for source, n in workload.schedule)}
    return workload, stream, sizing


def rows_per_item(profile: PipelineProfile) -> float:
    """The most rows one operator of ``profile`` takes per input item (``static_search.reach``, the product of the
    selectivities before it)."""
    return max(reach(profile).values())


def prepare(name: str, quick: bool) -> LiveCorpus:
    """``live_stream`` as ``suite_sim`` runs a workload, starting from static-default on the live node (``live_node``)."""
    workload, stream, sizing = live_stream(name, quick)
    start = corpus_trident.static_default(corpus_workloads.CORPORA[name], 1)
    case = corpus_trident.CorpusCase(name, workload.note)
    actor_start, decide_s_per_cpu_s = live_node()
    return LiveCorpus(suite_sim.SimWorkload(case, workload.profile, stream, corpus_headroom.cluster(1), start, start, actor_start,
                                            decide_s_per_cpu_s), workload, sizing)


def live_node() -> tuple[ActorStart, float]:
    """How the one live node differs from a simulated cluster's: its actors start on this machine's cores, and its
    controller shares them (``LIVE_DECIDE_S_PER_CPU_S``)."""
    return ActorStart(host_cores=float(os.cpu_count() or 1)), LIVE_DECIDE_S_PER_CPU_S


def simulate(c: LiveCorpus, quick: bool, log: Callable[[str], None]) -> Simulated:
    """S* searched for ``c``'s stream, and static-default, S* and trident simulated on it (the module docstring)."""
    t0 = time.perf_counter()
    w = c.sim
    found = corpus_trident.search_static(w, c.workload, QUICK_STATIC_EVALS if quick else STATIC_EVALS,
                                         QUICK_REGIME_EVALS if quick else REGIME_EVALS, log)
    default = w.run(STATIC_DEFAULT)
    repeats = corpus_trident.trident_repeats(w, default, suite_sim.QUICK_REPEATS if quick else SIM_REPEATS)
    runs = {STATIC_DEFAULT: default, STATIC_HINDSIGHT: found.run, TRIDENT: suite_sim.median_run(repeats)}
    log(f"{w.suite.name}: simulated S* {found.run.items_per_s} items/s ({allocation.label(found.chosen)}), trident "
        f"{[r.items_per_s for r in repeats]} items/s, static-default {default.items_per_s} ({time.perf_counter() - t0:.0f} s)")
    return Simulated(found, runs, sum(r.cut for r in repeats), time.perf_counter() - t0, [r.items_per_s for r in repeats])


def estimate_s(prepared: Mapping[str, LiveCorpus], simulated: Mapping[str, Simulated], quick: bool) -> float:
    """The live runs' wall seconds at their simulated rates, with ``START_STOP_S`` a run and ``RAY_START_S`` a node."""
    total = 0.0
    for name, c in prepared.items():
        runs = {STATIC_HINDSIGHT: 1, TRIDENT: simulated[name].trident_live_runs(quick)}
        rates = {s: suite_sim.run_rate(simulated[name].runs[s]) for s in SYSTEMS}
        total += RAY_START_S + sum(n * (c.sim.stream.items / rates[s] if rates[s] else 0.0) + n * START_STOP_S for s, n in runs.items())
    return total


def live_runs(c: LiveCorpus, s_star: allocation.Allocation, trident_runs: int, work: Path, log: Callable[[str], None]) -> list[RunRecord]:
    """S* once and trident ``trident_runs`` times live on ``c``'s stream (``closed_loop_suite.run_systems``), on a local Ray
    node of ``CPUS`` CPUs and the case's GPUs started here (a caller's own Ray session is used as it is)."""
    own_ray = not ray.is_initialized()
    if own_ray:
        start_local_ray(CPUS, c.sim.suite.gpus, RAY_ATTEMPTS)
    try:
        baselines = Baselines({STATIC_DEFAULT: c.sim.start}, 0, {})  # what trident starts from; S* runs its searched allocation
        return closed_loop_suite.run_systems(c.sim.profile, c.sim.suite, c.sim.stream, baselines,
                                             {STATIC_HINDSIGHT: 1, TRIDENT: trident_runs}, work, log,
                                             {"static_hindsight": allocation.to_data(s_star)})
    finally:
        if own_ray:
            ray.shutdown()


def replay(c: LiveCorpus, record: RunRecord) -> float | None:
    """``record``'s plans replayed in the simulator at the same seconds since the run's start (``ReplayPolicy``), from the
    same start on the same stream, on the live node (``live_node``): the simulated items/s of the live run's own moves (None
    where the simulated run did not finish)."""
    moves = [(float(d["t"]), Plan.from_dict(d["plan"])) for d in record.decisions if d.get("plan")]
    run = simulate_run(c.sim.spec(TRIDENT, None), c.sim.cluster, ReplayPolicy(moves, from_start=True), tick_s=suite_sim.TICK_S,
                       actor_start=c.sim.actor_start, decide_s_per_cpu_s=c.sim.decide_s_per_cpu_s)
    return run.summary["steady_items_per_s"] if run.runner.finished else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _total(values: Sequence[int | None]) -> int | None:
    return None if not values or any(v is None for v in values) else sum(values)


def summarise(live: Sequence[RunRecord], simulated: Simulated, replayed: Sequence[float | None]) -> dict[str, Any]:
    """One workload's live summary (the module docstring) from its live runs, their simulated counterparts and the live
    trident runs' replayed rates (``replayed``, in the order of those runs). A live rate is its runs' median (``per_system``;
    None where none ran without error); ``items_lost``, ``trident_ooms_max_run`` and ``best_static_ooms`` are None where a
    run left them unknown (it failed)."""
    systems, sim = per_system(live), simulated.runs
    rate = {s: (systems.get(s) or {}).get("items_per_s_median") for s in SYSTEMS}
    over = {s: _ratio(sim[s].items_per_s if s in sim else None, rate[s]) for s in SYSTEMS}
    trident = [r for r in live if r.system == TRIDENT]
    replay_ratios = [_ratio(p, r.items_per_s) for p, r in zip(replayed, trident)]
    trident_ooms = [r.ooms for r in trident]
    return {
        "static_hindsight_items_per_s": rate[STATIC_HINDSIGHT],
        "trident_items_per_s": rate[TRIDENT],
        "trident_vs_static_hindsight": _ratio(rate[TRIDENT], rate[STATIC_HINDSIGHT]),
        "sim_over_live": over,
        "sim_throughput_error": {s: None if v is None else abs(v - 1.0) for s, v in over.items()},
        "trident_replayed_over_live": statistics.median(replay_ratios) if replay_ratios and None not in replay_ratios else None,
        "trident_live_runs": len(trident),
        "trident_sim_spread": simulated.trident_spread,
        "trident_ooms_max_run": None if not trident_ooms or None in trident_ooms else max(trident_ooms),
        "best_static_ooms": _total([r.ooms for r in live if r.system == STATIC_HINDSIGHT]),
        "items_lost": _total([r.items_lost for r in live]),
    }


def targets(summary: Mapping[str, Any]) -> dict[str, Target]:
    """Per workload of the live section: each system's simulated rate within ``TOLERANCE`` of its live one, no item lost, and
    no live trident run with more OOMs than S*'s run had."""
    out: dict[str, Target] = {}
    for name, figures in summary.items():
        if not isinstance(figures, Mapping):
            continue
        for system in SYSTEMS:
            out[f"{name}.sim_throughput_error.{system}"] = Target("<=", TOLERANCE)
        out[f"{name}.items_lost"] = Target("==", 0)
        if figures.get("best_static_ooms") is not None:
            out[f"{name}.trident_ooms_max_run"] = Target("<=", figures["best_static_ooms"])
    return out


def _raw(c: LiveCorpus, simulated: Simulated, records: Sequence[RunRecord], replayed: Sequence[float | None]) -> dict[str, Any]:
    w, found = c.sim, simulated.search
    return {"note": c.workload.note, "sources": list(c.workload.sources), "stream": dict(c.sizing), "regimes": w.stream.regimes,
            "items": w.stream.items, "time_scale": w.stream.time_scale, "cpus": CPUS, "gpus": w.suite.gpus,
            "static_default_allocation": allocation.label(allocation.allocation_of(w.start)),
            "static_hindsight_allocation": allocation.label(found.chosen), "static_hindsight": allocation.to_data(found.chosen),
            "static_hindsight_whole_stream_runs": found.whole_stream_runs, "steady_rates_measured": found.steady_rates_measured,
            "sim_runs": {s: r.to_dict() for s, r in simulated.runs.items()}, "sim_trident_unfinished_runs": simulated.trident_unfinished,
            "sim_seconds": round(simulated.seconds, 1), "runs": [r.to_dict() for r in records], "per_system": per_system(records),
            "trident_replayed_items_per_s": list(replayed)}


def notes(raw: Mapping[str, Any], quick: bool) -> str:
    """The live section's notes: what ran, on which streams, and how its figures are formed."""
    workloads = {n: d for n, d in raw.items() if not n.startswith("_") and isinstance(d, Mapping)}
    streams = "; ".join(f"{n}: {d['items']} items ({d['regimes']}) at time scale {d['time_scale']:g}, S* {d['static_hindsight_allocation']}"
                        for n, d in workloads.items())
    kept = raw["_run"]["earlier_kept"]
    return (f"{'QUICK live section: the live streams with every block cut to a few items, small searches; a smoke test, not a measurement. ' if quick else ''}"
            f"LIVE section: S* (static-hindsight) once and trident from static-default once, or {LIVE_TRIDENT_RUNS} times where "
            f"its {SIM_REPEATS} simulated runs spread wider than {TOLERANCE:.0%}, per corpus workload on one local Ray "
            f"node of {CPUS} logical CPUs + {GPUS} logical GPUs hosted by this machine's cores, each stream the first shards of the "
            f"corpus stream in its seeded order (the fewest whose cost-model best static takes {LIVE_S:g} s): {streams}. S* is "
            "searched in the simulator for the same stream; the simulated counterparts (sim_over_live = simulated / live items/s) "
            "run the same stream, start and systems in the simulator (trident: the median of its repeats, against its live runs' "
            "median; trident_replayed_over_live: each live trident run's own plans replayed in the simulator at the same seconds, "
            "the median over its runs). Throughput = input "
            f"items / (last output - first output). Earlier live figures of workloads not run here: {kept}.")


def run(quick: bool, workloads: Sequence[str], previous: Path | None, log: Callable[[str], None] = print) -> BenchResult:
    """The live section (the module docstring), the simulated section kept from ``previous``."""
    t0 = time.perf_counter()
    prepared = {name: prepare(name, quick) for name in corpus_trident.WORKLOADS if name in workloads}
    simulated = {name: simulate(c, quick, log) for name, c in prepared.items()}
    estimate = estimate_s(prepared, simulated, quick)
    log(f"corpus-trident live{' (QUICK)' if quick else ''}: " + "; ".join(
        f"{n}: {c.sizing['items']} items in {c.sizing['blocks']} blocks ({c.sim.stream.regimes}) at time scale {c.sizing['time_scale']:g}"
        for n, c in prepared.items()) + f"; trident live runs {[s.trident_live_runs(quick) for s in simulated.values()]}: about "
        f"{estimate / 60:.0f} min at the simulated rates")
    work = Path(tempfile.mkdtemp(prefix="trident-corpus-live-"))
    t_live = time.perf_counter()
    try:
        records = {name: live_runs(c, simulated[name].search.chosen, simulated[name].trident_live_runs(quick), work, log)
                   for name, c in prepared.items()}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    live_s = time.perf_counter() - t_live
    replayed = {name: [replay(c, r) for r in records[name] if r.system == TRIDENT] for name, c in prepared.items()}
    log(f"corpus-trident live: live trident runs replayed in the simulator: {replayed}")
    summary = {name: summarise(records[name], simulated[name], replayed[name]) for name in prepared}
    raw: dict[str, Any] = {name: _raw(c, simulated[name], records[name], replayed[name]) for name, c in prepared.items()}
    before_summary, before = closed_loop_suite.sections("sim", {}, {}, previous, unsectioned="sim")
    same, why = closed_loop_suite.same_code(before.get("live_provenance"), benchmark="corpus-trident")
    summary, raw, _ = closed_loop_suite.merge_earlier(summary, raw, before_summary.get("live") if same else None,
                                                      before.get("live") if same else None, before.get("live_provenance"))
    raw["_run"] = {"quick": quick, "workloads": list(prepared), "systems": list(SYSTEMS), "tolerance": TOLERANCE,
                   "estimate_s": round(estimate), "live_seconds": round(live_s, 1), "bench_seconds": round(time.perf_counter() - t0, 1),
                   "earlier_kept": why, "tick_s": suite_sim.TICK_S, "decide_s_per_cpu_s": LIVE_DECIDE_S_PER_CPU_S, "ray": ray.__version__}
    text = notes(raw, quick)
    summary, raw = closed_loop_suite.sections("live", summary, raw, previous, unsectioned="sim")
    return BenchResult("corpus-trident", summary, corpus_trident.section_targets(summary), raw, corpus_trident.figure(summary),
                       f"{text} {raw['sim_note']}".strip())


def plot(ax: Any, summary: Mapping[str, Any]) -> None:
    """The live section on ``ax``: per workload S* and trident live and simulated, over S*'s live rate."""
    names = [n for n, f in summary.items() if isinstance(f, Mapping)]

    def value(f: Mapping[str, Any], system: str, simulated: bool) -> float:
        live = (1.0 if f.get("static_hindsight_items_per_s") else None) if system == STATIC_HINDSIGHT else f.get("trident_vs_static_hindsight")
        over = (f.get("sim_over_live") or {}).get(system) if simulated else 1.0
        return live * over if live is not None and over is not None else 0.0

    bars = [("S* live", STATIC_HINDSIGHT, False, "#9db7dc"), ("S* simulated", STATIC_HINDSIGHT, True, "#dbe5f3"),
            ("trident live", TRIDENT, False, "#3465a4"), ("trident simulated", TRIDENT, True, "#a9c0e0")]
    width = 0.2
    for k, (label, system, simulated, color) in enumerate(bars):
        xs = [x + (k - 1.5) * width for x in range(len(names))]
        ys = [value(summary[n], system, simulated) for n in names]
        ax.bar(xs, ys, width=width, color=color, label=label, hatch="//" if simulated else None)
        for x, y in zip(xs, ys):
            ax.text(x, y + 0.01, f"{y:.2f}", ha="center", fontsize=7)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("throughput / S* live")
    ax.set_title("LIVE on one node, beside the simulator on the same streams")
    ax.legend(loc="lower right", fontsize=8)
