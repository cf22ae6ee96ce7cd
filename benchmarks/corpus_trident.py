"""Benchmark ``corpus-trident``: trident against the best static in hindsight (S*) and the per-regime oracle (O) on
the corpus workloads. The report has two sections: ``sim``, every figure SIMULATED (``trident_flows.sim``), written here;
and ``live`` (``--live``, ``corpus_live``): S* and trident LIVE on one node beside their simulated counterparts. A run
writes one section and keeps the other from ``previous`` with that section's provenance (``closed_loop_suite.sections``).

Contract of ``run(quick, live=) -> BenchResult`` (the simulated section; ``live``: ``corpus_live.run``):
- Workloads: ``documents-corpus`` and ``video-corpus`` (``corpus_workloads``) on ``NODES`` nodes of 16 CPUs + 2 GPUs,
  their streams grown shard by shard until the cost model's best static takes ``HOURS`` hours for them
  (``stream_for_hours``); quick: 1 node and the corpus's quick stream.
- Systems (``DEFINITIONS``): static-default, trident (from static-default), and S* and O as the closed-loop suite's
  simulation searches and runs them (``suite_sim``: S* hill-climbed on whole-stream runs, O switched one cold start
  ahead of each block paying its cold starts, never below S*), on the per-regime allocations ``sim_headroom`` measures
  (as ``corpus-headroom`` does), on budgets ``STATIC_EVALS`` and ``REGIME_EVALS``. trident runs ``suite_sim.REPEATS`` times (1 with quick); its figures are the median
  run's, its OOMs every repeat's; a repeat still going after ``CAP`` x static-default's simulated time is stopped and
  counted in ``trident_unfinished_runs`` (its items are then not all done).
- Summary per workload (``summarise``, under ``sim``): ``headroom`` (O/S*), ``t_over_oracle``, ``gain_captured`` ((T-S*)/(O-S*),
  None below ``HEADROOM_LOW``), ``trident_vs_static_hindsight``, ``trident_vs_static_default``, ``trident_ooms``
  (every repeat), ``trident_ooms_max_run``, ``best_static_ooms``, ``items_lost`` (every run) and more; ``targets``
  are the issue's, chosen by the headroom measured (``section_targets``: both sections').
- Where the gap to S* lies (``gap_runs``, ``raw.sim.<workload>.gap``): ``trident_choice_vs_static_hindsight``, the
  allocation trident's median run held longest run static over the whole stream, and
  ``static_hindsight_at_trident_batches_vs_static_hindsight``, S*'s replicas at that allocation's batch sizes, each over S*.
- ``previous`` (the CLI passes OUT/corpus-trident.json): where its simulated section ran the same stream, its S* and O
  allocations are run again instead of searched (the searches, most of the run's time, do not depend on the scheduler's
  code); ``CORPUS_TRIDENT_SEARCH=1`` searches anyway. ``raw.sim.<workload>.references`` says which.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from benchmarks import allocation, closed_loop_suite, corpus_headroom, corpus_workloads, headroom, sim_headroom, suite_sim
from benchmarks.allocation import Allocation, allocation_of
from benchmarks.baselines import STATIC_DEFAULT, STATIC_HINDSIGHT
from benchmarks.closed_loop_workload import CPUS, GPUS
from benchmarks.report import BenchResult, Target
from trident_flows.pipelines.emulated_docs import LAYOUT as DOCS_LAYOUT
from trident_flows.pipelines.emulated_layout import EmulatedLayout
from trident_flows.pipelines.emulated_video import LAYOUT as VIDEO_LAYOUT
from trident_flows.runtime.costmodel import PipelineProfile
from trident_flows.sim.static_search import StaticConfig

NODES, QUICK_NODES = 8, 1
# quick: shards of each corpus on 1 node (video: ~0.3 items/s there, so 4 shards of 292 already run for about an hour)
QUICK_SHARDS = {"documents-corpus": 8, "video-corpus": 4}
HOURS = 2.0  # simulated hours of stream, at the cost model's best static's rates
LAYOUTS: dict[str, EmulatedLayout] = {"documents": DOCS_LAYOUT, "video": VIDEO_LAYOUT}
ORACLE, TRIDENT = suite_sim.ORACLE, "trident"
WORKLOADS = tuple(corpus_workloads.CORPORA)
SYSTEMS = (STATIC_DEFAULT, STATIC_HINDSIGHT, TRIDENT, ORACLE)
DEFINITIONS = {
    STATIC_DEFAULT: ("the pipeline's own default sizing for one node (emulated layout: one replica per operator, GPU operators on "
                     "the GPUs, spare CPUs shared by its default regime mix) on every node: what a user who writes the pipeline runs"),
    STATIC_HINDSIGHT: suite_sim.DEFINITIONS[STATIC_HINDSIGHT],
    TRIDENT: "this project's scheduler, starting from static-default with no memory of earlier runs",
    ORACLE: suite_sim.DEFINITIONS[ORACLE],
}
# the targets, by the headroom measured: with much to gain trident gets near O, with little it costs nothing
HEADROOM_HIGH, HEADROOM_LOW = 1.2, 1.05
# the searches' budgets (the suite's ``suite_sim.STATIC_EVALS`` / ``REGIME_EVALS`` halved for the 8-node 2-hour streams, whose
# runs cost seconds each on the documents and up to ~10 s on the video; quick: the suite's quick ones)
STATIC_EVALS, QUICK_STATIC_EVALS = 20, suite_sim.QUICK_STATIC_EVALS
REGIME_EVALS, QUICK_REGIME_EVALS = 30, suite_sim.QUICK_REGIME_EVALS
T_OVER_ORACLE_MIN, VS_STATIC_MIN = 0.90, 0.97
# a trident run is stopped after CAP x the simulated time static-default takes for the stream and reported unfinished (a
# guard: a stuck run fails its target instead of holding the benchmark)
CAP = 2.0


@dataclass(frozen=True)
class CorpusCase:
    """What ``suite_sim``'s prepared workload and ``closed_loop_suite.run_one`` read of a corpus workload's case: a name, a
    note for the report and the GPUs of its node."""

    name: str
    note: str
    gpus: int = GPUS


def static_default(corpus: corpus_workloads.Corpus, nodes: int) -> StaticConfig:
    """The emulated layout's default stages for one node, sized by the base profile's default regime mix (the pipeline's
    own, not the corpus's), each operator's replicas times ``nodes``."""
    layout, base = LAYOUTS[corpus.profile], PipelineProfile.load(corpus.profile)
    n = 1000  # items the default mix is split over: only its shares matter
    stages = layout.default_stages(base, layout.default_regimes(base, n), n, cpus=CPUS, gpus=GPUS)
    return StaticConfig(tuple((s.operator, s.config, s.replicas * nodes) for s in stages), 0.0)


def shards_for(blocks: Callable[[int], Sequence[tuple[str, int]]], rates: Mapping[str, float], seconds: float, start: int) -> int:
    """The fewest shards (at least ``start``) whose blocks (``blocks(shards)``) take at least ``seconds`` at ``rates``
    (items/s per source)."""
    def duration(shards: int) -> float:
        return sum(n / rates[source] for source, n in blocks(shards))

    lo, hi = start, start
    while duration(hi) < seconds:
        lo, hi = hi + 1, 2 * hi
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if duration(mid) < seconds else (lo, mid)
    return lo


def stream_for_hours(name: str, nodes: int, hours: float) -> tuple[headroom.Workload, corpus_workloads.CorpusStream, dict[str, Any]]:
    """Corpus ``name`` on ``nodes`` nodes with as many shards as the cost model's best static (``headroom.headroom``, on
    each source's mean item) needs ``hours`` for (at least the corpus's own count): the same seeded shard order, longer."""
    workload, stream = corpus_workloads.corpus_workload(name, False, nodes)
    corpus = corpus_workloads.CORPORA[name]
    fluid = headroom.headroom(workload)
    shards = shards_for(lambda s: corpus.model.blocks(s, corpus_workloads.SEED), fluid.static_items_per_s, hours * 3600.0,
                        corpus.shards)
    workload, stream = resized(workload, stream, shards)
    sizing = {"shards": shards, "blocks": len(workload.schedule), "items": stream.items, "hours": hours,
              "fluid_static_items_per_s": dict(fluid.static_items_per_s), "fluid_headroom": fluid.ratio}
    return workload, stream, sizing


def resized(workload: headroom.Workload, stream: corpus_workloads.CorpusStream,
            shards: int) -> tuple[headroom.Workload, corpus_workloads.CorpusStream]:
    """The corpus workload and its stream with ``shards`` shards in the same seeded order."""
    corpus = corpus_workloads.CORPORA[stream.corpus]
    return with_schedule(workload, stream, tuple(corpus.model.blocks(shards, corpus_workloads.SEED)))


def with_schedule(workload: headroom.Workload, stream: corpus_workloads.CorpusStream,
                  schedule: tuple[tuple[str, int], ...]) -> tuple[headroom.Workload, corpus_workloads.CorpusStream]:
    """The corpus workload and its stream on the blocks ``schedule`` ((source, items) in order)."""
    note = workload.note.replace(f"{len(workload.schedule)} blocks", f"{len(schedule)} blocks", 1)
    return replace(workload, schedule=schedule, note=note), replace(stream, regimes=",".join(f"{r}:{n}" for r, n in schedule))


def prepare(name: str, quick: bool) -> tuple[suite_sim.SimWorkload, headroom.Workload, dict[str, Any]]:
    """The corpus workload as ``suite_sim`` runs a workload, its headroom workload, and how its stream was sized."""
    nodes = QUICK_NODES if quick else NODES
    if quick:
        workload, stream = resized(*corpus_workloads.corpus_workload(name, True, nodes), QUICK_SHARDS[name])
        sizing = {"shards": QUICK_SHARDS[name], "blocks": len(workload.schedule), "items": stream.items, "hours": None}
    else:
        workload, stream, sizing = stream_for_hours(name, nodes, HOURS)
    start = static_default(corpus_workloads.CORPORA[name], nodes)
    w = suite_sim.SimWorkload(CorpusCase(name, workload.note), workload.profile, stream, corpus_headroom.cluster(nodes), start, start)
    return w, workload, {**sizing, "nodes": nodes}


def evaluate(name: str, quick: bool, log: Callable[[str], None] = print, previous: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """static-default, trident, S* and O on corpus ``name`` (the module docstring), as ``suite_sim.evaluate`` runs a suite
    workload but for the seed rounds (a trident above O is reported in ``oracle_beaten_by``, not searched again).
    ``previous``: an earlier result of this benchmark (its ``raw`` and ``provenance``); where it ran the same stream, its S*
    and O allocations are run again instead of searched (``references``)."""
    t0 = time.perf_counter()
    w, workload, sizing = prepare(name, quick)
    log(f"{name}: {sizing['items']} items in {sizing['blocks']} blocks on {sizing['nodes']} node(s)")
    earlier = reusable(previous, name, workload, sizing)
    runs = {STATIC_DEFAULT: w.run(STATIC_DEFAULT)}
    log(f"{name}: static-default {runs[STATIC_DEFAULT].items_per_s} items/s, ooms {runs[STATIC_DEFAULT].ooms}")
    repeats = trident_repeats(w, runs[STATIC_DEFAULT], suite_sim.QUICK_REPEATS if quick else suite_sim.REPEATS)
    runs[TRIDENT] = suite_sim.median_run(repeats)
    log(f"{name}: trident {[r.items_per_s for r in repeats]} items/s, ooms {[r.ooms for r in repeats]}, unfinished "
        f"{sum(r.cut for r in repeats)} ({time.perf_counter() - t0:.0f} s)")
    t_search = time.perf_counter()
    if earlier is not None:
        best_static, choices = allocation.from_data(earlier["static_hindsight"]), [allocation.from_data(b) for b in earlier["oracle_blocks"]]
        runs[STATIC_HINDSIGHT], runs[ORACLE] = w.run_static(STATIC_HINDSIGHT, best_static), w.run_oracle(choices)
        search = {k: earlier[k] for k in SEARCH_KEYS if k in earlier}
        search["references"] = f"reused: the S* and O allocations of the result at {earlier['_commit']}, run again here"
    else:
        best_static, choices, runs[STATIC_HINDSIGHT], runs[ORACLE], search = references(w, workload, quick, log)
    log(f"{name}: S* {runs[STATIC_HINDSIGHT].items_per_s} items/s ({allocation.label(best_static)}), O {runs[ORACLE].items_per_s} "
        f"items/s ({time.perf_counter() - t_search:.0f} s)")
    summary = summarise(runs, [r.ooms for r in repeats], sum(r.cut for r in repeats))
    gap = gap_runs(w, runs[TRIDENT], best_static)
    summary.update(gap_figures(gap, runs[STATIC_HINDSIGHT]))
    log(f"{name}: gap {', '.join(f'{k} {r.items_per_s}' for k, (_, r) in gap.items())} items/s")
    raw = {"note": workload.note, "sources": list(workload.sources), "stream": sizing, "schedule": [list(b) for b in workload.schedule],
           "runs": {s: r.to_dict() for s, r in runs.items()}, "trident_repeat_ooms": [r.ooms for r in repeats],
           "static_default_allocation": allocation.label(allocation_of(w.start)),
           "static_hindsight_allocation": allocation.label(best_static), "static_hindsight": allocation.to_data(best_static),
           "oracle_block_allocations": [allocation.label(a) for a in choices], "oracle_blocks": [allocation.to_data(a) for a in choices],
           **search, "simulated_hours": {s: r.items_per_s and sizing["items"] / r.items_per_s / 3600 for s, r in runs.items()},
           "gap": {k: {"allocation": allocation.label(a), "run": r.to_dict()} for k, (a, r) in gap.items()},
           "references_seconds": round(time.perf_counter() - t_search, 1), "bench_seconds": round(time.perf_counter() - t0, 1)}
    log(f"{name}: {summary}")
    return {"summary": summary, "raw": raw}


TRIDENT_CHOICE, HINDSIGHT_AT_TRIDENT_BATCHES = "trident-choice", "static-hindsight-at-trident-batches"


def most_run(run: suite_sim.SystemRun) -> Allocation:
    """The allocation ``run`` held for the most ticks, over every block."""
    ticks: dict[Allocation, int] = {}
    for seen in run.seen.values():
        for held, n in seen.items():
            ticks[held] = ticks.get(held, 0) + n
    return max(ticks, key=ticks.__getitem__)


def at_batches(chosen: Allocation, batches_of: Allocation) -> Allocation:
    """``chosen``'s replicas, each at the batch size ``batches_of`` runs most replicas of on the same device (unchanged
    where ``batches_of`` runs the operator on no such device)."""
    batch = {}
    for name, groups in batches_of:
        for config, _ in sorted(groups, key=lambda g: g[1]):  # the most replicas last: theirs is kept
            batch[(name, config.device)] = config.batch_size
    return tuple((name, tuple((replace(c, batch_size=batch.get((name, c.device), c.batch_size)), n) for c, n in groups))
                 for name, groups in chosen)


def gap_runs(w: suite_sim.SimWorkload, trident: suite_sim.SystemRun,
             best_static: Allocation) -> dict[str, tuple[Allocation, suite_sim.SystemRun]]:
    """Where trident's gap to S* lies, as two static runs of the whole stream, each with its allocation:
    ``trident-choice``, the allocation trident's median run held longest (its choice without the cost of reaching it), and
    ``static-hindsight-at-trident-batches``, S*'s replicas at that allocation's batch sizes (what S* loses with them)."""
    held = most_run(trident)
    at = at_batches(best_static, held)
    return {TRIDENT_CHOICE: (held, w.run_static(TRIDENT_CHOICE, held)),
            HINDSIGHT_AT_TRIDENT_BATCHES: (at, w.run_static(HINDSIGHT_AT_TRIDENT_BATCHES, at))}


def gap_figures(gap: Mapping[str, tuple[Allocation, suite_sim.SystemRun]], best_static: suite_sim.SystemRun) -> dict[str, float | None]:
    """``trident_choice_vs_static_hindsight`` and ``static_hindsight_at_trident_batches_vs_static_hindsight``: each gap
    run's rate over S*'s (None where a rate is missing)."""
    s_star = suite_sim.run_rate(best_static)
    return {f"{k.replace('-', '_')}_vs_static_hindsight": (r.items_per_s / s_star if r.items_per_s and s_star else None)
            for k, (_, r) in gap.items()}


def trident_repeats(w: suite_sim.SimWorkload, static_default_run: suite_sim.SystemRun, repeats: int) -> list[suite_sim.SystemRun]:
    """``repeats`` simulated trident runs from static-default; one still going after ``CAP`` x static-default's simulated time
    (``static_default_run``) is stopped (``suite_sim``'s cut: ``cut`` true, no rate) and counts as unfinished."""
    cap = suite_sim.run_rate(static_default_run) * suite_sim.CUT_AFTER / CAP
    return [w.run(TRIDENT, slower_than=cap) for _ in range(repeats)]


SEARCH_KEYS = ("static_hindsight_whole_stream_runs", "oracle_regime_allocations", "oracle_whole_stream_runs",
               "oracle_steady_items_per_s", "steady_headroom", "steady_rates_measured", "references")


def references(w: suite_sim.SimWorkload, workload: headroom.Workload, quick: bool, log: Callable[[str], None]) -> tuple[Any, ...]:
    """S* and O searched as ``suite_sim.evaluate`` searches them: S* by ``search_static``, O block by block
    (``suite_sim.SimWorkload.search_oracle``) from its per-regime allocations. Returns S*, O's block allocations, their runs
    and what the search measured (``SEARCH_KEYS``)."""
    found = search_static(w, workload, QUICK_STATIC_EVALS if quick else STATIC_EVALS, QUICK_REGIME_EVALS if quick else REGIME_EVALS, log)
    choices, oracle, oracle_runs = w.search_oracle(found.per_regime, found.chosen)
    search = {"static_hindsight_whole_stream_runs": found.whole_stream_runs,
              "oracle_regime_allocations": {r: allocation.label(a) for r, a in found.per_regime.items()},
              "oracle_whole_stream_runs": oracle_runs, "oracle_steady_items_per_s": dict(found.headroom.per_regime_items_per_s),
              "steady_headroom": found.headroom.ratio, "steady_rates_measured": found.steady_rates_measured,
              "references": "searched in this run"}
    return found.chosen, choices, found.run, oracle, search


@dataclass(frozen=True)
class StaticSearch:
    """S* as ``search_static`` found it: its allocation (``chosen``) and whole-stream run, the simulated headroom whose per-regime
    allocations seeded it (None where none was measured), and the runs the search took."""

    chosen: Allocation
    run: suite_sim.SystemRun
    headroom: sim_headroom.SimulatedHeadroom | None
    whole_stream_runs: int
    steady_rates_measured: int

    @property
    def per_regime(self) -> dict[str, Allocation]:
        return dict(self.headroom.per_regime) if self.headroom is not None else {}


def search_static(w: suite_sim.SimWorkload, workload: headroom.Workload, static_evals: int, regime_evals: int,
                  log: Callable[[str], None]) -> StaticSearch:
    """S* as ``suite_sim.evaluate`` searches it: per regime the simulated headroom's allocations (``sim_headroom``, at most
    ``regime_evals`` steady rates), then S* hill-climbed on whole-stream runs (at most ``static_evals``) from the best of
    static-default, the headroom's static and each regime's best. ``regime_evals`` 0: no headroom measured, S* climbed from
    static-default alone (a smoke test's search: one steady rate costs seconds of simulation however short the stream)."""
    candidates, found, measured = [allocation_of(w.start)], None, 0
    if regime_evals > 0:
        meter = sim_headroom.meter_for(workload, w.stream, w.cluster)
        found = sim_headroom.simulated_headroom(workload, w.stream, w.cluster, meter=meter, static_evals=1, max_evals=regime_evals)
        log(f"{w.suite.name}: steady headroom {found.ratio:.3f} ({meter.evals} steady rates)")
        candidates += [found.static, *dict(found.per_regime).values()]
        measured = meter.evals
    best, run, runs = suite_sim.search_static_hindsight(w, candidates, static_evals)
    return StaticSearch(best, run, found, runs, measured)


def reusable(previous: Mapping[str, Any] | None, name: str, workload: headroom.Workload, sizing: Mapping[str, Any]) -> dict[str, Any] | None:
    """``previous``'s raw figures of ``name`` (with ``_commit``, the commit it ran at) when it ran the same stream on as many
    nodes and recorded its references; else None."""
    earlier = (previous or {}).get("raw", {}).get(name)
    if not earlier or "static_hindsight" not in earlier or "oracle_blocks" not in earlier:
        return None
    if earlier.get("schedule") != [list(b) for b in workload.schedule] or earlier.get("stream", {}).get("nodes") != sizing["nodes"]:
        return None
    return {**earlier, "_commit": (previous.get("provenance") or {}).get("commit")}


def summarise(runs: Mapping[str, suite_sim.SystemRun], trident_repeat_ooms: Sequence[int | None], unfinished: int = 0) -> dict[str, Any]:
    """``suite_sim.summarise``'s figures of one workload (O = max(the switching oracle's run, S*)), with ``gain_captured``
    None below ``HEADROOM_LOW`` headroom (the gap is then within the runs' noise), ``trident_ooms_max_run`` (the most OOMs
    of one trident repeat, to set beside ``best_static_ooms``, one run's), ``trident_unfinished_runs`` (repeats stopped after
    ``CAP`` x static-default's simulated time: their items are not all done, so ``items_lost`` is then None, unknown and not
    0) and ``headroom_class`` (``high``: at least
    ``HEADROOM_HIGH``, ``low``: under ``HEADROOM_LOW``, else ``middle``: the class sets the workload's targets)."""
    figures = suite_sim.summarise(runs, suite_sim.run_rate(runs[ORACLE]) if ORACLE in runs else 0.0)
    h = figures["headroom"]
    keys = ("headroom", "t_over_oracle", "gain_captured", "trident_vs_static_hindsight", "trident_vs_static_default", "trident_ooms",
            "best_static_ooms", "items_lost", "oracle_beaten_by_more_than_2pct", "oracle_beaten_by")
    out = {k: figures[k] for k in keys}
    if h is None or h < HEADROOM_LOW:
        out["gain_captured"] = None
    out["trident_ooms_max_run"] = max((o or 0 for o in trident_repeat_ooms), default=None)
    out["trident_unfinished_runs"] = unfinished
    if unfinished:
        out["items_lost"] = None
    out["headroom_class"] = headroom_class(h)
    return out


def headroom_class(h: float | None) -> str | None:
    if h is None:
        return None
    return "high" if h >= HEADROOM_HIGH else "low" if h < HEADROOM_LOW else "middle"


def targets(summary: Mapping[str, Mapping[str, Any]]) -> dict[str, Target]:
    """The issue's targets per workload: with headroom of at least ``HEADROOM_HIGH``, ``t_over_oracle`` >= 0.90; under
    ``HEADROOM_LOW``, ``trident_vs_static_hindsight`` >= 0.97 (between the two the issue sets none); everywhere no more OOMs
    in any trident run than in S*'s (``best_static_ooms``, a per-workload bound) and no item lost."""
    out: dict[str, Target] = {}
    for name, figures in summary.items():
        kind = figures.get("headroom_class")
        if kind == "high":
            out[f"{name}.t_over_oracle"] = Target(">=", T_OVER_ORACLE_MIN)
        elif kind == "low":
            out[f"{name}.trident_vs_static_hindsight"] = Target(">=", VS_STATIC_MIN)
        if figures.get("best_static_ooms") is not None:
            out[f"{name}.trident_ooms_max_run"] = Target("<=", figures["best_static_ooms"])
        out[f"{name}.items_lost"] = Target("==", 0)
        out[f"{name}.trident_unfinished_runs"] = Target("==", 0)
    return out


def run(quick: bool = False, log: Callable[[str], None] = print, previous: Path | None = None, search: bool = False,
        workloads: Sequence[str] = tuple(corpus_workloads.CORPORA), live: bool = False) -> BenchResult:
    """Both corpus workloads (the module docstring): the report's simulated section, or with ``live`` its live section
    (``corpus_live``); the other section is kept from ``previous`` (the last result of this benchmark: the CLI passes
    OUT/corpus-trident.json; one written before the sections is all simulated). The simulated section's S* and O
    allocations are reused, run again, for every workload whose stream it ran, unless ``search`` (or the environment sets
    ``CORPUS_TRIDENT_SEARCH=1``): the searches do not depend on the scheduler's code."""
    if live:
        from benchmarks import corpus_live  # here, not at the top: corpus_live imports this module

        return corpus_live.run(quick, workloads, previous, log)
    t0 = time.perf_counter()
    search = search or os.environ.get("CORPUS_TRIDENT_SEARCH") == "1"
    _, before = closed_loop_suite.sections("live", {}, {}, previous, unsectioned="sim")  # the earlier simulated section
    sim_before = before["sim"] or {}
    earlier = None
    if not search and sim_before and bool((sim_before.get("_run") or {}).get("quick")) == quick:
        earlier = {"raw": sim_before, "provenance": before["sim_provenance"]}
    results = {name: evaluate(name, quick, log, earlier) for name in WORKLOADS if name in workloads}
    summary: dict[str, Any] = {name: r["summary"] for name, r in results.items()}
    raw: dict[str, Any] = {**{name: r["raw"] for name, r in results.items()},
                           "_run": {"quick": quick, "tick_s": suite_sim.TICK_S, "definitions": DEFINITIONS,
                                    "trident_repeats": suite_sim.QUICK_REPEATS if quick else suite_sim.REPEATS,
                                    "bench_seconds": round(time.perf_counter() - t0, 1)}}
    nodes = QUICK_NODES if quick else NODES
    notes = (f"SIMULATED section. {'QUICK: 1 node, the short corpus streams, small searches. ' if quick else ''}"
             f"Corpus workloads (documents-corpus, video-corpus: published statistics, raw.sim.<workload>.sources) on {nodes} node(s) of "
             f"{CPUS} CPUs + {GPUS} GPUs{'' if quick else f', streams of {HOURS:g} hours at the cost model best static rates'}. "
             "S* and O are searched and run as in the closed-loop suite's simulation (O pays its cold starts, never below S*); "
             "their per-regime allocations are the simulated headroom's. Targets by headroom: >= 1.2, t_over_oracle >= 0.90; "
             "< 1.05, trident >= 0.97x S*; no trident run with more OOMs than S*'s; no item lost. raw.sim.<workload>.references says "
             "whether S* and O were searched in this run or reused from the last result (same stream; run again here).")
    summary, raw = closed_loop_suite.sections("sim", summary, raw, previous, unsectioned="sim")
    return BenchResult("corpus-trident", summary, section_targets(summary), raw, figure(summary), f"{notes} {raw['live_note']}".strip())


def section_targets(summary: Mapping[str, Any]) -> dict[str, Target]:
    """The targets of the report's sections (dotted keys): ``targets`` on the simulated one (``sim.<workload>.*``),
    ``corpus_live.targets`` on the live one (``live.<workload>.*``)."""
    from benchmarks import corpus_live  # here, not at the top: corpus_live imports this module

    out = {f"sim.{key}": goal for key, goal in targets(summary.get("sim") or {}).items()}
    out.update({f"live.{key}": goal for key, goal in corpus_live.targets(summary.get("live") or {}).items()})
    return out


def figure(summary: Mapping[str, Any]) -> Any:
    """The report's figure: the simulated section (per workload static-default, S*, trident and O over S*) and the live one
    (``corpus_live.plot``), each where the report has it; None where it has neither."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks import corpus_live  # here, not at the top: corpus_live imports this module

    panels = [section for section in ("sim", "live") if summary.get(section)]
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 3.6), squeeze=False)
    for ax, section in zip(axes[0], panels):
        if section == "sim":
            _sim_panel(ax, summary["sim"])
        else:
            corpus_live.plot(ax, summary["live"])
    fig.tight_layout()
    return fig


def _sim_panel(ax: Any, summary: Mapping[str, Mapping[str, Any]]) -> None:
    names = [n for n, f in summary.items() if isinstance(f, Mapping)]
    bars = [("static-default", lambda f: f["trident_vs_static_hindsight"] / f["trident_vs_static_default"]
             if f.get("trident_vs_static_hindsight") and f.get("trident_vs_static_default") else 0.0, "#bbbbbb"),
            ("S*", lambda f: 1.0, "#9db7dc"),
            ("trident", lambda f: f.get("trident_vs_static_hindsight") or 0.0, "#3465a4"),
            ("O", lambda f: f.get("headroom") or 0.0, "#204a87")]
    width = 0.2
    for k, (label, value, color) in enumerate(bars):
        xs = [x + (k - 1.5) * width for x in range(len(names))]
        ys = [value(summary[n]) for n in names]
        ax.bar(xs, ys, width=width, color=color, label=label)
        for x, y in zip(xs, ys):
            ax.text(x, y + 0.01, f"{y:.2f}", ha="center", fontsize=7)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("throughput / S*")
    ax.set_title(f"trident on the corpus workloads, {NODES} nodes (SIMULATED)")
    ax.legend(loc="lower right", fontsize=8)
