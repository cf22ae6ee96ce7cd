"""Benchmark ``closed-loop-suite``: trident against the baselines a user would have and against two
references that use knowledge no user has, on workloads where adaptive scheduling can pay and on two
where it cannot (``suite_workloads.WORKLOADS``); in the simulator (every system, ``suite_sim``) and live.

Contract of ``run(quick, sim=, previous=) -> BenchResult``:
- The report has two sections, ``sim`` and ``live``; a run measures one and keeps the other from
  ``previous`` with that section's provenance (``sections``).
- Systems (``SYSTEMS``; one sentence each in ``baselines.DEFINITIONS``): ``static-default`` (the
  pipeline's default sizing, never changed); ``threshold``, ``ds2`` and ``trident`` (policies of this
  runtime); ``static-hindsight`` (S*: the best single static allocation for the whole stream, found in
  the simulator); ``oracle`` (O: each regime block's best allocation, switched as the block arrives);
  ``ray-data-fixed`` and ``ray-data-autoscaling`` (plain Ray Data, fixed and autoscaling actor pools).
- Summary per workload (``summarise``, ``suite_sim.summarise``): ``headroom`` (O / S*), ``t_over_oracle``,
  ``gain_captured``, trident's ratios to the baselines, ``trident_ooms``, ``items_lost`` (None: a system
  could not run). Targets (``targets``): no system beats O by over 2%, no trident OOM, no item lost.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
import traceback
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Collection, Mapping, Sequence

import numpy as np
import psutil
import ray

from benchmarks import allocation, closed_loop_figure, closed_loop_workload, headroom, suite_sim
from benchmarks.baselines import DEFINITIONS, STATIC_DEFAULT, STATIC_HINDSIGHT, STATIC_SYSTEMS, Baselines
from benchmarks.closed_loop_runs import RunRecord, run_ray_data, run_runtime
from benchmarks.closed_loop_stats import per_system
from benchmarks.closed_loop_workload import Workload
from benchmarks.oracle_policy import OraclePolicy
from benchmarks.provenance import code_repo, git, git_state
from benchmarks.report import BenchResult, Target
from benchmarks.suite_workloads import CPUS, DEVICE_MEMORY, WORKLOADS, SuiteWorkload, suite_workloads
from trident_flows.core.types import ClusterSpec
from trident_flows.runtime.costmodel import PipelineProfile
from trident_flows.runtime.leftovers import ray_descendants
from trident_flows.scheduler.policies import make_policy

ORACLE = suite_sim.ORACLE
SYSTEMS = (STATIC_DEFAULT, STATIC_HINDSIGHT, ORACLE, "trident", "ds2", "threshold", "ray-data-fixed", "ray-data-autoscaling")
SPIKE_SYSTEMS = tuple(s for s in SYSTEMS if s != ORACLE)  # the spike variant checks OOM safety: the oracle has no part there
QUICK_SPIKE_SYSTEMS = (STATIC_DEFAULT, "trident")


@dataclass(frozen=True)
class Subset:
    """A named live run of part of the suite (``--subset NAME``): runs per system per workload, no spike variant, and the
    wall-clock budget it is sized for."""

    plan: Mapping[str, Mapping[str, int]]  # workload -> system -> runs
    budget_s: float
    note: str


# Sizes on the full streams, from the last live runs and the sim section (items / items per s + ~20 s start-up per run,
# ~40 s between runs): cpu-only (10755 items at time scale 0.5) static-hindsight ~12 items/s ~ 920 s, trident ~14-15.5
# items/s ~ 720-780 s; docs-baseline (1300 items at time scale 1) ~ 80 s per run.
SUBSETS = {
    "confirm": Subset({"cpu-only": {"trident": 2, STATIC_HINDSIGHT: 1}, "docs-baseline": {STATIC_HINDSIGHT: 1, "trident": 1}}, 45 * 60,
                      "the live confirmation subset (issue 43): cpu-only static-hindsight once and trident twice, docs-baseline "
                      "static-hindsight and trident once, no spike variant; about 45 minutes"),
    "ray-data": Subset({"cpu-only": {"ray-data-autoscaling": 1}}, 20 * 60,
                       "plain Ray Data with autoscaling actor pools once on cpu-only, no spike variant; about 16 minutes. "
                       "ray-data-fixed is left out: a second run of about 15 minutes would not fit the 20"),
}


def run_order(runs: Mapping[str, int]) -> list[tuple[str, int]]:
    """``(system, repeat)`` in the order to run them: rounds over the systems with runs left, the most repeated first and the
    order rotated each round, so a system's repeats bracket the others' runs and load noise hits all alike."""
    systems = sorted((s for s, n in runs.items() if n > 0), key=lambda s: -runs[s])
    order = []
    for rep in range(max(runs.values(), default=0)):
        left = [s for s in systems if runs[s] > rep]
        k = rep % len(left)
        order += [(s, rep) for s in left[k:] + left[:k]]
    return order


# ---------------------------------------------------------------------------- runs
def run_one(system: str, profile: PipelineProfile, suite: SuiteWorkload, stream: Workload, baselines: Baselines, repeat: int,
            work: Path, searched: Mapping[str, Any] | None = None) -> RunRecord:
    """One run of ``system`` on ``stream``; a failure is recorded in ``error`` (its figures stay None). ``searched``: the
    sim section's raw figures of this workload on the same stream, whose S* and oracle allocations static-hindsight and the
    oracle run (static-hindsight falls back to the cost model's choice without them; the oracle cannot run)."""
    record = RunRecord(system, stream.variant, repeat, stream.items)
    cluster = ClusterSpec.single_node(CPUS, suite.gpus, gpu_memory_bytes=DEVICE_MEMORY)
    out = work / f"{suite.name}-{stream.variant}-{system}-{repeat}"
    try:
        start, policy = baselines.start(STATIC_DEFAULT if system == ORACLE else system), None
        if system == STATIC_HINDSIGHT and searched is not None:
            chosen = allocation.from_data(searched["static_hindsight"])
            start, policy = allocation.start_config(chosen), suite_sim.static_policy(chosen, stream.items, cluster)
        elif system == ORACLE:
            if searched is None:
                raise RuntimeError("the oracle runs the sim section's allocations: run `trident-flows bench closed-loop-suite --sim` "
                                   "on the same streams first")
            blocks = [(str(k), first, end) for k, (_, first, end) in enumerate(stream.blocks())]
            per_block = {str(k): allocation.from_data(d) for k, d in enumerate(searched["oracle_blocks"])}
            policy = OraclePolicy(blocks, per_block, cluster.total_cpus, cluster.total_gpus)
        spec = stream.spec(profile, start, f"suite-{suite.name}-{stream.variant}")
        if system.startswith("ray-data"):
            return run_ray_data(spec, record, autoscale=system == "ray-data-autoscaling")
        if system not in (*STATIC_SYSTEMS, ORACLE):
            policy = make_policy(system, spec=spec, cluster=cluster)
        return run_runtime(system, spec, policy, out, record)
    except Exception as exc:  # noqa: BLE001 - a system that cannot run is reported, not fatal for the others
        record.error = f"{type(exc).__name__}: {exc}"
        record.timeline, record.replicas = [], {}
        logging.getLogger(__name__).warning("closed-loop-suite: %s on %s failed: %s\n%s", system, suite.name, exc, traceback.format_exc())
        return record
    finally:
        shutil.rmtree(out, ignore_errors=True)


def searched_allocations(previous: Path | None, name: str, stream: Workload) -> Mapping[str, Any] | None:
    """The sim section's raw figures of workload ``name`` in ``previous`` when it ran the same stream (None otherwise)."""
    if previous is None or not previous.exists():
        return None
    raw = json.loads(previous.read_text()).get("raw", {})
    sim = (raw.get("sim") or {}) if "section" in raw else {}
    found = sim.get(name)
    return found if found and found.get("items") == stream.items and found.get("regimes") == stream.regimes else None


def run_systems(profile: PipelineProfile, suite: SuiteWorkload, stream: Workload, baselines: Baselines, runs: Mapping[str, int],
                work: Path, log: Any, searched: Mapping[str, Any] | None = None) -> list[RunRecord]:
    """``runs[system]`` runs of each system, in ``run_order``."""
    records = []
    for system, rep in run_order(runs):
        rec = run_one(system, profile, suite, stream, baselines, rep, work, searched)
        records.append(rec)
        log(f"{suite.name} {stream.variant} rep {rep} {system}: {rec.items_per_s} items/s, ooms {rec.ooms}, lost {rec.items_lost}, "
            f"reconfigurations {rec.reconfigurations}{', error ' + rec.error if rec.error else ''}")
    return records


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summarise(main: Sequence[RunRecord], spikes: Sequence[RunRecord], model_headroom: float) -> dict[str, Any]:
    """The live summary keys of one workload: the sim section's keys (``suite_sim.summarise``) measured live, with O the
    oracle's median run where it ran, never below S* (static-hindsight's); ``trident_vs_ray_data_autoscaling``; and
    ``model_headroom`` (the cost model's whole-replica bound, ``headroom.headroom``). Throughput is ``closed_loop``'s
    (input items / (first to last output)); ``None`` where a system could not run (its error is in ``raw``)."""
    tp = {s: v["items_per_s_median"] for s, v in per_system(main).items()}
    t, s_star = tp.get("trident"), tp.get(STATIC_HINDSIGHT)
    o = max(tp["oracle"], s_star or 0.0) if tp.get("oracle") else None
    trident = [r for r in (*main, *spikes) if r.system == "trident" and not r.error]
    best_static = [r for r in (*main, *spikes) if r.system == STATIC_HINDSIGHT and not r.error]
    finished = [r for r in (*main, *spikes) if r.items_lost is not None]
    return {
        "headroom": _ratio(o, s_star),
        "t_over_oracle": _ratio(t, o),
        "gain_captured": (t - s_star) / (o - s_star) if t and s_star and o and o > s_star * (1 + suite_sim.NO_HEADROOM) else None,
        "trident_vs_static_hindsight": _ratio(t, s_star),
        "trident_vs_static_default": _ratio(t, tp.get(STATIC_DEFAULT)),
        "trident_vs_ray_data_autoscaling": _ratio(t, tp.get("ray-data-autoscaling")),
        "trident_ooms": sum(r.ooms or 0 for r in trident) if trident else None,
        "best_static_ooms": sum(r.ooms or 0 for r in best_static) if best_static else None,
        "items_lost": sum(r.items_lost or 0 for r in finished) if finished else None,
        "model_headroom": model_headroom,
    }


def run(quick: bool = False, *, sim: bool = False, jobs: int | None = None, previous: Path | None = None,
        workloads: Sequence[str] = WORKLOADS, repeats: int | None = None, systems: Sequence[str] = SYSTEMS,
        spike_systems: Sequence[str] | None = None, subset: str | None = None, log: Any = print) -> BenchResult:
    """The benchmark: its live section, or with ``sim`` its simulated section (``suite_sim``, ``jobs`` worker
    processes); the other section is kept from ``previous`` (the report this run replaces).

    Live, every system runs on every chosen workload, interleaved and rotated within each repeat; ``static-hindsight``
    and ``oracle`` run the allocations the sim section found for the same stream (``run_one``); ``threshold``, ``ds2``
    and ``trident`` start from static-default. The memory-spike variant (the middle 80% of the first ``long`` block at
    5x memory per item) runs every system but the oracle (``SPIKE_SYSTEMS``). cosmos-xenna is not in the suite: its
    autoscaler cannot start from given worker counts (a fixed ``num_workers`` turns it off). ``quick``: blocks of
    ``QUICK_BLOCK_S`` s, the baseline workloads' quick streams, one repeat, the spike variant for static-default and
    trident only. ``systems`` / ``spike_systems`` run a subset (the others' figures are then None); ``subset`` names one
    of ``SUBSETS`` (its runs per system and workload, no spike variant) instead.

    A live run keeps the earlier live section's runs of the systems it does not measure (per workload and variant; all of
    a workload it does not run) where they ran on the same stream and the same code (``same_code``), and recomputes
    those workloads' summaries from the runs together (``merge_earlier``); ``raw.live._earlier`` holds the provenance of
    the runs kept."""
    if sim:
        if subset is not None:
            raise ValueError("--subset names a live run; drop --sim")
        return _run_sim(quick, workloads, jobs or 1, previous, log)
    if subset is not None:
        if subset not in SUBSETS:
            raise ValueError(f"unknown subset {subset!r}; choose from {list(SUBSETS)}")
        if quick or repeats is not None or tuple(workloads) != WORKLOADS or tuple(systems) != SYSTEMS or spike_systems:
            raise ValueError("--subset fixes the workloads, systems and repeats of a full live run: drop --quick, --workloads, "
                             "--systems and --repeats")
        chosen = SUBSETS[subset]
        return _run_live(False, list(chosen.plan), chosen.plan, {}, previous, log, subset)
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        raise ValueError(f"unknown suite system(s) {unknown}; choose from {list(SYSTEMS)}")
    repeats = repeats if repeats is not None else (1 if quick else 2)
    if spike_systems is None:
        spike_systems = [s for s in (QUICK_SPIKE_SYSTEMS if quick else SPIKE_SYSTEMS) if s in systems]
    plan = {w: {s: repeats for s in systems} for w in workloads}
    spikes = {w: {s: 1 for s in spike_systems} for w in workloads}
    return _run_live(quick, workloads, plan, spikes, previous, log, None)


def _run_sim(quick: bool, workloads: Sequence[str], jobs: int, previous: Path | None, log: Any) -> BenchResult:
    unknown = sorted(set(workloads) - set(WORKLOADS))
    if unknown:
        raise ValueError(f"unknown suite workload(s) {unknown}; choose from {list(WORKLOADS)}")
    result = suite_sim.run(quick, workloads, jobs, log)
    summary, raw = sections("sim", result["summary"], result["raw"], previous)
    return BenchResult("closed-loop-suite", summary, targets=targets(summary), raw=raw,
                       notes=_sim_notes(quick) + " " + raw.get("live_note", ""))


def sections(section: str, summary: dict[str, Any], raw: dict[str, Any], previous: Path | None,
             unsectioned: str = "live") -> tuple[dict[str, Any], dict[str, Any]]:
    """The report's ``summary`` and ``raw`` with ``section`` (``sim`` or ``live``) as just measured and the other section as
    ``previous`` holds it (a report written before its benchmark had sections is its ``unsectioned`` section: the suite's
    were live, corpus-trident's simulated), with that section's provenance and notes (``raw.OTHER_provenance``,
    ``raw.OTHER_note``); ``raw.section`` names the section the report's own provenance belongs to."""
    other = "live" if section == "sim" else "sim"
    out_summary: dict[str, Any] = {section: summary, other: None}
    out_raw: dict[str, Any] = {"section": section, section: raw, other: None, f"{other}_provenance": None, f"{other}_note": ""}
    if previous is not None and previous.exists():
        doc = json.loads(previous.read_text())
        if "section" not in doc.get("raw", {}):  # written before the sections: all of it was one section
            doc = {**doc, "summary": {unsectioned: doc.get("summary")}, "raw": {"section": unsectioned, unsectioned: doc.get("raw")}}
        old_raw = doc["raw"]
        out_summary[other] = doc["summary"].get(other)
        out_raw[other] = old_raw.get(other)
        own = old_raw.get("section") == other
        out_raw[f"{other}_provenance"] = doc.get("provenance") if own else old_raw.get(f"{other}_provenance")
        out_raw[f"{other}_note"] = doc.get("notes", "") if own else old_raw.get(f"{other}_note", "")
    return out_summary, out_raw


def targets(summary: Mapping[str, Any]) -> dict[str, Target]:
    """The suite's targets on the sections present (dotted keys): for every simulated workload, an oracle no system beats by
    more than 2%, no trident OOM and no item lost; DS2 at most 3 reconfigurations per block on cpu-only; trident at least
    0.97x the best static where there is no headroom."""
    out: dict[str, Target] = {}
    for workload in (summary.get("sim") or {}):
        out[f"sim.{workload}.oracle_beaten_by_more_than_2pct"] = Target("==", 0)
        out[f"sim.{workload}.trident_ooms"] = Target("==", 0)
        out[f"sim.{workload}.items_lost"] = Target("==", 0)
        if workload in NO_HEADROOM_WORKLOADS:
            out[f"sim.{workload}.trident_vs_static_hindsight"] = Target(">=", 0.97)
    if "cpu-only" in (summary.get("sim") or {}):
        out["sim.cpu-only.ds2_max_reconfigurations_per_block"] = Target("<=", 3)
    return out


NO_HEADROOM_WORKLOADS = ("docs-baseline", "video-baseline")


def _sim_notes(quick: bool) -> str:
    return (f"{'QUICK run (short streams). ' if quick else ''}The sim section is SIMULATED: the suite's streams on its node in "
            f"the discrete-event simulator. Systems: " + " ".join(f"{k}: {v}." for k, v in suite_sim.DEFINITIONS.items()))


def _run_live(quick: bool, workloads: Sequence[str], plan: Mapping[str, Mapping[str, int]], spike_plan: Mapping[str, Mapping[str, int]],
              previous: Path | None, log: Any, subset: str | None) -> BenchResult:
    unknown = sorted({s for runs in (*plan.values(), *spike_plan.values()) for s in runs} - set(SYSTEMS))
    if unknown:
        raise ValueError(f"unknown suite system(s) {unknown}; choose from {list(SYSTEMS)}")
    chosen = suite_workloads(quick, workloads)
    # A local node per workload with exactly its GPUs: the runtime and Trident read the live node, and on a
    # node with 2 GPUs cpu-only's trident planned embed onto GPUs the workload does not have. A caller's
    # own Ray session is used as it is.
    own_ray = not ray.is_initialized()
    ray.data.DataContext.get_current().enable_progress_bars = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix="trident-suite-"))
    t_start = time.perf_counter()
    results: dict[str, dict[str, Any]] = {}
    try:
        for suite in chosen:
            if own_ray:
                ray.shutdown()
                _start_ray(suite.gpus)
            profile = PipelineProfile.load(suite.profile)
            main_stream, spike_stream = suite.streams()
            rows = main_stream.rows(profile)
            baselines = suite.baselines(profile, main_stream, rows)
            bound = headroom.headroom(suite.headroom_workload(profile))
            log(f"{suite.name}: {main_stream.regimes} at time scale {suite.time_scale:g}; cost-model headroom {bound.ratio:.3f}; "
                + "; ".join(f"{n} {c.label()}" for n, c in baselines.configs.items()))
            searched = searched_allocations(previous, suite.name, main_stream)
            main = run_systems(profile, suite, main_stream, baselines, plan.get(suite.name, {}), work, log, searched)
            spikes = run_systems(profile, suite, spike_stream, baselines, spike_plan.get(suite.name, {}), work, log, searched)
            results[suite.name] = {"suite": suite, "main": main, "spikes": spikes, "headroom": bound,
                                   "baselines": baselines,
                                   "reach": float(np.prod([op.selectivity for op in profile.operators[:-1]])),
                                   "summary": summarise(main, spikes, bound.ratio)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if own_ray:
            ray.shutdown()
    summary = {name: r["summary"] for name, r in results.items()}
    raw = {name: _raw(r) for name, r in results.items()}
    before_summary, before = sections("sim", {}, {}, previous)  # the earlier live section as previous holds it, with its provenance
    same, why = same_code(before.get("live_provenance"))
    summary, raw, kept = merge_earlier(summary, raw, before_summary.get("live") if same else None, before.get("live") if same else None,
                                       before.get("live_provenance"))
    for name, records in kept.items():  # the figure shows the kept runs with this run's
        if name in results:
            results[name]["main"] = [*results[name]["main"], *(r for r in records if r.variant == "regimes")]
    raw["_run"] = {"subset": subset, "plan": {w.name: dict(plan.get(w.name, {})) for w in chosen},
                   "spike_plan": {w.name: dict(spike_plan.get(w.name, {})) for w in chosen}, "quick": quick,
                   "workloads": [w.name for w in chosen], "budget_s": SUBSETS[subset].budget_s if subset else None,
                   "bench_seconds": time.perf_counter() - t_start, "cpus": CPUS, "device_memory_bytes": DEVICE_MEMORY,
                   "definitions": DEFINITIONS, "targets": TARGETS, "ray": ray.__version__, "earlier_kept": why}
    summary, raw = sections("live", summary, raw, previous)
    return BenchResult("closed-loop-suite", summary, targets=targets(summary), raw=raw, figure=figure(results),
                       notes=_notes(results, quick, raw["live"], subset))


def same_code(earlier: Mapping[str, Any] | None, repo: Path | None = None, benchmark: str = "closed-loop-suite") -> tuple[bool, str]:
    """Whether runs of an earlier live section (its provenance ``earlier``) ran on the code this run measures: both on a clean
    tree, and no commit between theirs and this checkout's HEAD changed ``benchmark``'s code (``catalogue``'s pathspecs, the
    ones that make a result stale); with the reason, for the notes."""
    from benchmarks.catalogue import CATALOGUE

    repo = repo if repo is not None else code_repo()
    if not earlier or not earlier.get("commit"):
        return False, "the earlier live section has no provenance or commit"
    if earlier.get("dirty") is not False:
        return False, f"the earlier live section ran on a tree that differed from {str(earlier['commit'])[:10]}"
    now = git_state(repo)
    if now.commit is None or now.dirty is not False:
        return False, "this run's code is not a clean commit"
    if git(repo, "diff", "--quiet", str(earlier["commit"]), now.commit, "--", *CATALOGUE[benchmark].code) != "":
        return False, f"{benchmark}'s code changed between {str(earlier['commit'])[:10]} and {now.commit[:10]}"
    return True, f"the earlier live section ran on {str(earlier['commit'])[:10]}, the same {benchmark} code as {now.commit[:10]}"


STREAM_KEYS = ("items", "regimes", "time_scale")


def earlier_runs(old: Mapping[str, Any] | None, stream: Mapping[str, Any], measured: Mapping[str, Collection[str]]) -> list[dict[str, Any]]:
    """The runs of one workload in an earlier live section's raw (``old``) to keep beside this run's: those on the same stream
    (``STREAM_KEYS`` of ``stream``) of a system this run did not measure in that variant (``measured``: variant -> systems)."""
    if not old or any(old.get(k) != stream.get(k) for k in STREAM_KEYS):
        return []
    return [dict(r) for r in old.get("runs", []) if r.get("system") not in measured.get(r.get("variant", ""), ())]


def record_of(data: Mapping[str, Any]) -> RunRecord:
    """A ``RunRecord`` from its results-file form (``RunRecord.to_dict``; its series thinned)."""
    names = {f.name for f in fields(RunRecord)}
    return RunRecord(**{k: v for k, v in data.items() if k in names})


def merge_earlier(summary: Mapping[str, Any], raw: Mapping[str, Any], old_summary: Mapping[str, Any] | None, old: Mapping[str, Any] | None,
                  old_provenance: Mapping[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any], dict[str, list[RunRecord]]]:
    """This run's live ``summary`` and ``raw`` (per workload) with the runs of the earlier live section (``old_summary``,
    ``old``: its summary and raw) it keeps (``earlier_runs``; every run of a workload this run did not measure, with its
    summary as it was; ``old`` None: none).
    A workload that gains runs has its summary, ``per_system`` and ``per_system_spikes`` recomputed from all its runs. Every
    kept run carries ``earlier``: its index in ``_earlier``, a list of ``{"provenance", "run"}`` of the runs that measured
    them (``old_provenance`` and ``old["_run"]``, or the earlier section's own ``_earlier`` entry for runs it had kept).
    Returns the summary, the raw and the kept runs per workload."""
    summary, raw = {k: v for k, v in summary.items()}, {k: v for k, v in raw.items()}
    if not old:
        return summary, raw, {}
    sources: list[dict[str, Any]] = []
    seen: dict[int, int] = {}
    old_earlier = old.get("_earlier") or []

    def tagged(run: dict[str, Any]) -> dict[str, Any]:
        k = run.get("earlier")
        key = -1 if k is None else int(k)
        if key not in seen:
            seen[key] = len(sources)
            sources.append({"provenance": old_provenance, "run": old.get("_run")} if key < 0 else old_earlier[key])
        return {**run, "earlier": seen[key]}

    kept: dict[str, list[RunRecord]] = {}
    for name, data in old.items():
        if name.startswith("_") or not isinstance(data, Mapping):
            continue
        if name not in raw:  # a workload this run did not measure: all of it, as it was
            runs = [tagged(dict(r)) for r in data.get("runs", [])]
            raw[name], summary[name] = {**data, "runs": runs}, (old_summary or {}).get(name)
            kept[name] = [record_of(r) for r in runs]
            continue
        new = raw[name]
        measured: dict[str, set[str]] = {}
        for r in new["runs"]:
            measured.setdefault(r["variant"], set()).add(r["system"])
        runs = [tagged(r) for r in earlier_runs(data, new, measured)]
        if not runs:
            continue
        records = [record_of(r) for r in (*new["runs"], *runs)]
        main = [r for r in records if r.variant == "regimes"]
        spikes = [r for r in records if r.variant != "regimes"]
        raw[name] = {**new, "runs": [*new["runs"], *runs], "per_system": per_system(main), "per_system_spikes": per_system(spikes)}
        summary[name] = summarise(main, spikes, summary[name]["model_headroom"])
        kept[name] = [record_of(r) for r in runs]
    raw["_earlier"] = sources
    return summary, raw, kept


def _start_ray(gpus: int, attempts: int = 8) -> None:
    """``ray.init`` for the suite, tried again when the node misses Ray's fixed 30 s start-up wait (seen at load 30+: the
    raylet gives up waiting for its dashboard agent's ports); the Ray processes a failed attempt left (GCS, dashboard,
    monitors) are killed before the next."""
    for attempt in range(attempts):
        before = {(r.pid, r.create_time) for r in ray_descendants()}
        try:
            ray.init("local", num_cpus=CPUS, num_gpus=gpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
            return
        except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception for this timeout
            ray.shutdown()
            for record in ray_descendants():
                if (record.pid, record.create_time) not in before and record.alive():
                    psutil.Process(record.pid).kill()
            if "timed out during startup" not in str(exc) or attempt == attempts - 1:
                raise
            time.sleep(5.0)


TARGETS = {
    "gpu-ocr": "captured >= 0.9; trident_vs_static_hindsight >= 1.8 where headroom >= 2.0; trident_vs_static_default >= 2.5; "
               "trident_vs_ray_data_autoscaling >= 1.5",
    "cpu-only": "captured >= 0.9",
    "docs-baseline": "trident_vs_static_hindsight >= 0.97",
    "video-baseline": "trident_vs_static_hindsight >= 0.97",
    "all": "trident_ooms == 0 in every spike variant; items_lost == 0 for every system",
}


def _raw(result: Mapping[str, Any]) -> dict[str, Any]:
    suite: SuiteWorkload = result["suite"]
    main_stream, spike_stream = suite.streams()
    return {
        "note": suite.note, "profile": suite.profile, "gpus": suite.gpus, "regimes": suite.regimes, "items": main_stream.items,
        "time_scale": suite.time_scale, "memory_spikes": [list(s) for s in spike_stream.memory_spikes],
        "model_headroom": result["headroom"].to_dict(),
        "baselines": result["baselines"].to_dict(),
        "per_system": per_system(result["main"]), "per_system_spikes": per_system(result["spikes"]),
        "runs": [r.to_dict() for r in (*result["main"], *result["spikes"])],
    }


def _notes(results: Mapping[str, Mapping[str, Any]], quick: bool, raw: Mapping[str, Any], subset: str | None) -> str:
    run = raw["_run"]
    streams = "; ".join(f"{n}: {r['suite'].regimes} at time scale {r['suite'].time_scale:g}" for n, r in results.items())
    runs = "; ".join(f"{n}: " + ", ".join(f"{s} x{k}" for s, k in run["plan"].get(n, {}).items())
                     + (f" (spike variant: {', '.join(run['spike_plan'][n])})" if run["spike_plan"].get(n) else " (no spike variant)")
                     for n in results)
    workloads = {n: d for n, d in raw.items() if not n.startswith("_") and isinstance(d, Mapping)}
    errors = {f"{n}/{s}": v["errors"] for n, d in workloads.items() for s, v in (d.get("per_system") or {}).items() if v["errors"]}
    earlier = raw.get("_earlier") or []
    kept = {n: sorted({f"{r['system']} ({r['variant']})" for r in d.get("runs", []) if "earlier" in r}) for n, d in workloads.items()}
    provenances = "; ".join(f"[{k}] {str((e.get('provenance') or {}).get('commit'))[:10]} at {(e.get('provenance') or {}).get('date_utc')}, "
                            f"wall {(e.get('provenance') or {}).get('wall_s')} s, load before {(e.get('provenance') or {}).get('load_before')}"
                            for k, e in enumerate(earlier))
    kept_text = (f"Runs kept from earlier live runs on the same streams and suite code ({run['earlier_kept']}): "
                 + "; ".join(f"{n}: {', '.join(v)}" for n, v in kept.items() if v)
                 + f". Their provenance (raw.live._earlier): {provenances}. ") if earlier else \
        f"No earlier live runs kept ({run['earlier_kept']}). "
    return (f"{'QUICK run (short streams: figures are noisy and trident has too few samples to act much). ' if quick else ''}"
            + (f"Subset {subset!r}: {SUBSETS[subset].note}. " if subset else "")
            + f"Emulated pipelines from the committed cost models (GPU entries derived, not measured: see the profiles) on one "
            f"logical node of {CPUS} CPUs hosted by this machine's 2 cores; runs per system (interleaved, the most repeated "
            f"first, rotated each round; a figure is the median of a system's runs): {runs}. "
            f"Throughput = input items / (last output - first output). Streams: {streams}. The time scale multiplies every "
            f"modelled second, emulated cold starts included; Ray's own actor start-up (about 1-5 s here) is not compressed. "
            f"Live ratios are formed from live runs of the same stream in this section only, never with simulated throughputs: "
            f"headroom, t_over_oracle and gain_captured need the oracle run live (O: the sim section's per-block allocations "
            f"switched live), trident_vs_static_default needs static-default and trident_vs_ray_data_autoscaling Ray Data "
            f"autoscaling; a key whose system did not run live is None (the sim section has O and static-default for the same "
            f"streams). static-hindsight and the oracle run the allocations the sim section found for the same stream. "
            + kept_text
            + "model_headroom: whole-replica cost-model optimum per regime switched for free over the best single static in "
            "hindsight, searched over mixed configurations and fractional GPUs (headroom.py). Baselines: "
            + " ".join(f"{k}: {v}." for k, v in DEFINITIONS.items())
            + f" cosmos-xenna is not run (its autoscaler cannot start from given worker counts). Errors: {errors or 'none'}.")


# ---------------------------------------------------------------------------- figure
def figure(results: Mapping[str, Mapping[str, Any]]) -> Any:
    """The live figure, one row per workload: completed items/s over time of each system's median run, shaded by the
    regime trident's last operator works on, and trident's replicas per operator."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = max(1, len(results))
    fig, axes = plt.subplots(rows, 2, figsize=(15, 3.6 * rows), squeeze=False, gridspec_kw={"width_ratios": [2.2, 1]})
    for k, (name, result) in enumerate(results.items()):
        ax, ax_rep = axes[k]
        main, suite, s = result["main"], result["suite"], result["summary"]
        trident = closed_loop_figure.median_run(main, "trident")
        if trident is not None and trident.tail:
            colors = {**closed_loop_workload.PIPELINES["documents"].colors, **closed_loop_workload.PIPELINES["video"].colors}
            for regime, a, b in closed_loop_figure.regime_spans(trident, suite.streams()[0].blocks(), result["reach"]):
                ax.axvspan(a, b, color=colors.get(regime, "#eeeeee"), alpha=0.8, lw=0)
                ax.text((a + b) / 2, 1.0, regime, transform=ax.get_xaxis_transform(), ha="center", va="bottom", fontsize=7)
        for system in dict.fromkeys(r.system for r in main):
            run = closed_loop_figure.median_run(main, system)
            if run is None:
                continue
            span = (run.wall_s or 1.0) - (run.startup_s or 0.0)
            x, y = closed_loop_figure.completion_rate(closed_loop_figure.since_first_output(run), max(1.0, span / 60))
            ax.plot(x, y, lw=2.2 if system == "trident" else 1.0, label=f"{system} ({run.items_per_s:.1f}/s)")
        fmt = {key: ("n/a" if v is None else f"{v:.2f}") for key, v in s.items()}
        ax.set_title(f"{name}: completed items/s (median run); headroom {fmt['headroom']}x, trident vs static-hindsight "
                     f"{fmt['trident_vs_static_hindsight']}x, vs static-default {fmt['trident_vs_static_default']}x, vs Ray Data "
                     f"autoscaling {fmt['trident_vs_ray_data_autoscaling']}x", fontsize=8)
        ax.set_xlabel("seconds since the run's first output (shaded: regime at trident's last operator, approx.)", fontsize=8)
        ax.set_ylabel("items/s")
        ax.legend(fontsize=6, ncol=2)
        if trident is not None:
            t0 = trident.startup_s or 0.0
            for op, series in trident.replicas.items():
                ax_rep.step([p[0] - t0 for p in series], [p[1] for p in series], where="post", label=op)
            ax_rep.set_title(f"{name}: trident's replicas per operator ({trident.reconfigurations} changes landed)", fontsize=8)
            ax_rep.set_xlabel("seconds since first output (negative: cold start)", fontsize=8)
            ax_rep.legend(fontsize=6)
    fig.tight_layout()
    return fig
