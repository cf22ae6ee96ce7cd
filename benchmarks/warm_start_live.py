"""The live part of ``bench warm-start --live``: trident cold and warm against the best static allocation in
hindsight (S*) on Ray. Every figure here is LIVE (emulated operators on their measured cost models).

Contract of ``run(quick, results, log) -> (summary, raw)``:
- The closed-loop suite's live setting: its ``cpu-only`` stream (documents, tesseract cost model, 16 logical
  CPUs, no GPU, time scale 0.5) on one local Ray node (started here unless the caller has one), each run by
  ``closed_loop_runs.run_runtime``; throughput is input items / (first to last output). S* is the allocation
  the suite's sim section (``results``) found for the same stream; another stream is refused. ``quick``: the
  suite's quick stream with the full stream's S*, one repeat: a smoke test, not a measurement.
- Per repeat r (``REPEATS``), in order: ``static-hindsight`` (S*, no policy change), trident ``cold`` (no
  memory), an ``earlier`` trident run over the regime blocks rotated by r + 1 writing a memory, trident ``warm``
  from a copy of that memory; trident starts from static-default, as in the suite.
- ``summary``: ``live_cold_vs_static_hindsight``, ``live_warm_vs_static_hindsight`` (medians over repeats of
  trident's rate over the same repeat's S* rate; none for a run that lost items), ``live_trident_ooms``,
  ``live_items_lost``, ``live_runs_failed``; ``raw``: every run's figures and the duration estimate logged first.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import ray

from benchmarks import allocation, closed_loop_suite, suite_workloads
from benchmarks.baselines import STATIC_HINDSIGHT, Baselines
from benchmarks.closed_loop_runs import RunRecord, run_runtime
from benchmarks.closed_loop_workload import Workload
from benchmarks.local_ray import start_local_ray
from benchmarks.report import Target
from benchmarks.warm_start import REFRESH, WORKLOAD, rotated
from trident_flows.core.types import ClusterSpec
from trident_flows.runtime.costmodel import PipelineProfile
from trident_flows.scheduler.policies import make_policy

REPEATS, QUICK_REPEATS = 2, 1
RUNS = (STATIC_HINDSIGHT, "cold", "earlier", "warm")  # each repeat's runs, in this order
TRIDENT_RUNS = ("cold", "earlier", "warm")
START_STOP_S = 30.0  # a live run's own start and stop beside its items (the suite's runs: 17-27 s to the first output)
RAY_ATTEMPTS = 3
TARGETS = {"live_cold_vs_static_hindsight": Target(">=", 1.30), "live_warm_vs_static_hindsight": Target(">=", 1.40),
           "live_trident_ooms": Target("==", 0), "live_items_lost": Target("==", 0), "live_runs_failed": Target("==", 0)}


@dataclass(frozen=True)
class LiveStream:
    """The stream the live part runs, and what its runs start from."""

    suite: suite_workloads.SuiteWorkload
    profile: PipelineProfile
    stream: Workload
    baselines: Baselines
    searched: Mapping[str, Any]  # the suite's sim section for the workload: S* is its ``static_hindsight``

    @property
    def cluster(self) -> ClusterSpec:
        return ClusterSpec.single_node(suite_workloads.CPUS, self.suite.gpus, gpu_memory_bytes=suite_workloads.DEVICE_MEMORY)


def prepare(quick: bool, results: Mapping[str, Any]) -> LiveStream:
    """The suite's ``cpu-only`` stream (its quick one with ``quick``) and S* from the suite's sim section of ``results``."""
    suite = suite_workloads.suite_workloads(quick, [WORKLOAD])[0]
    profile = PipelineProfile.load(suite.profile)
    stream, _ = suite.streams()
    searched = (results.get("raw", {}).get("sim") or {}).get(WORKLOAD)
    if searched is None:
        raise ValueError(f"the closed-loop suite's results have no sim section for {WORKLOAD!r}: run `{REFRESH}` first")
    if not quick and (searched.get("regimes"), searched.get("items")) != (stream.regimes, stream.items):
        raise ValueError(f"the closed-loop suite's sim section for {WORKLOAD!r} ran another stream ({searched.get('regimes')!r}, not "
                         f"{stream.regimes!r}): run `{REFRESH}` to refresh it")
    return LiveStream(suite, profile, stream, suite.baselines(profile, stream, stream.rows(profile)), searched)


def static_hindsight_rate(results: Mapping[str, Any], w: LiveStream) -> tuple[float, str]:
    """S*'s rate in the suite's results, for the duration estimate: its live run where the suite measured one, else its
    simulated run; and which it is."""
    live = (results.get("raw", {}).get("live") or {}).get(WORKLOAD) or {}
    measured = live.get("per_system", {}).get(STATIC_HINDSIGHT, {}).get("items_per_s_median")
    if measured:
        return float(measured), "the suite's live run"
    return float(w.searched["runs"][STATIC_HINDSIGHT]["items_per_s"]), "the suite's simulated run"


def figures(record: RunRecord) -> dict[str, Any]:
    """What the results keep of one run."""
    return {"items_per_s": record.items_per_s, "wall_s": record.wall_s, "startup_s": record.startup_s, "ooms": record.ooms,
            "items_lost": record.items_lost, "lost_ids": record.lost_ids[:20], "reconfigurations": record.reconfigurations,
            "applies_refused": record.applies_refused, "error": record.error}


def trident_run(w: LiveStream, stream: Workload, label: str, repeat: int, work: Path, memory: Path | None) -> dict[str, Any]:
    """One trident run on ``stream`` from static-default (the suite's start), reading and writing ``memory`` (None: no
    memory); a failure is recorded in ``error``."""
    record = RunRecord("trident", stream.variant, repeat, stream.items)
    spec = stream.spec(w.profile, w.baselines.start("trident"), f"suite-{w.suite.name}-{stream.variant}")  # one name: one memory
    out = work / f"{label}-{repeat}"
    policy: Any = None
    try:
        policy = make_policy("trident", spec=spec, cluster=w.cluster, memory=str(memory) if memory is not None else None)
        run_runtime("trident", spec, policy, out, record)
    except Exception as exc:  # noqa: BLE001 - a run that fails is reported with its error; the others still run
        record.error = f"{type(exc).__name__}: {exc}"
    finally:
        shutil.rmtree(out, ignore_errors=True)
    remembered = getattr(policy, "memory", None)
    return {**figures(record), "memory_loaded": getattr(remembered, "loaded", None) is not None,
            "memory_regimes_known": getattr(remembered, "regimes_known", 0), "memory_writes": getattr(remembered, "writes", 0),
            "memory_warning": getattr(remembered, "warning", None), "started_from": getattr(policy, "started_from", None),
            "prepositioned": getattr(getattr(policy, "preposition", None), "moves", 0)}


def one_repeat(w: LiveStream, repeat: int, repeats: int, work: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """The repeat's four runs (module docstring), each logged as it starts and ends."""
    memory, kept = work / f"memory-{repeat}.json", work / f"memory-{repeat}-warm.json"
    earlier = rotated(w.stream, repeat + 1)
    entry: dict[str, Any] = {"earlier_regimes": earlier.regimes}
    for label in RUNS:
        log(f"warm-start live repeat {repeat + 1}/{repeats}: {label} starting")
        if label == STATIC_HINDSIGHT:
            run = figures(closed_loop_suite.run_one(STATIC_HINDSIGHT, w.profile, w.suite, w.stream, w.baselines, repeat, work, w.searched))
        elif label == "cold":
            run = trident_run(w, w.stream, label, repeat, work, None)
        elif label == "earlier":
            run = trident_run(w, earlier, label, repeat, work, memory)
        else:
            if memory.exists():
                shutil.copy(memory, kept)
            run = trident_run(w, w.stream, label, repeat, work, kept)
        entry[label] = run
        memory_note = (f"; memory {'loaded' if run['memory_loaded'] else 'NOT loaded: ' + str(run['memory_warning'])}"
                       if label == "warm" else "")
        log(f"warm-start live repeat {repeat + 1}/{repeats}: {label}: {_shown(run['items_per_s'])} items/s in {_shown(run['wall_s'])} s, "
            f"ooms {run['ooms']}, lost {run['items_lost']}{memory_note}{', error ' + run['error'] if run['error'] else ''}")
    for label in ("cold", "warm"):
        entry[f"{label}_vs_static_hindsight"] = _over_static(entry, label)
    return entry


def summarise(repeats: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The live summary keys (module docstring)."""
    every = [rep[label] for rep in repeats for label in RUNS]

    def median(key: str) -> float | None:
        kept = [rep[key] for rep in repeats if rep[key] is not None]
        return statistics.median(kept) if kept else None

    return {"live_cold_vs_static_hindsight": median("cold_vs_static_hindsight"),
            "live_warm_vs_static_hindsight": median("warm_vs_static_hindsight"),
            "live_trident_ooms": sum(rep[label]["ooms"] or 0 for rep in repeats for label in TRIDENT_RUNS),
            "live_items_lost": sum(run["items_lost"] or 0 for run in every),
            "live_runs_failed": sum(1 for run in every if run["error"])}


def run(quick: bool, results: Mapping[str, Any], log: Callable[[str], None] = print) -> tuple[dict[str, Any], dict[str, Any]]:
    """The live part (module docstring): its summary keys and its raw figures."""
    w = prepare(quick, results)
    repeats = QUICK_REPEATS if quick else REPEATS
    rate, rate_from = static_hindsight_rate(results, w)
    estimate_s = repeats * len(RUNS) * (w.stream.items / rate + START_STOP_S)
    log(f"warm-start live{' (QUICK)' if quick else ''}: {WORKLOAD}, {w.stream.items} items ({w.stream.regimes}) at time scale "
        f"{w.suite.time_scale:g} on {suite_workloads.CPUS} CPUs; {repeats} repeat(s) of {', '.join(RUNS)}; about "
        f"{estimate_s / 60:.0f} min (every run at S*'s {rate:.2f} items/s in {rate_from}, plus {START_STOP_S:g} s to start "
        "and stop it; trident's runs should take less)")
    own_ray = not ray.is_initialized()
    work = Path(tempfile.mkdtemp(prefix="trident-warm-start-live-"))
    t0 = time.perf_counter()
    try:
        if own_ray:
            start_local_ray(suite_workloads.CPUS, w.suite.gpus, RAY_ATTEMPTS)
        out = [one_repeat(w, r, repeats, work, log) for r in range(repeats)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if own_ray:
            ray.shutdown()
    raw = {"workload": WORKLOAD, "quick": quick, "regimes": w.stream.regimes, "items": w.stream.items,
           "time_scale": w.suite.time_scale, "cpus": suite_workloads.CPUS, "gpus": w.suite.gpus,
           "static_hindsight_allocation": allocation.label(allocation.from_data(w.searched["static_hindsight"])),
           "static_hindsight_searched_on": {"regimes": w.searched.get("regimes"), "items": w.searched.get("items")},
           "static_default": w.baselines.start("trident").label(), "repeats": out,
           "estimate_s": round(estimate_s), "estimate_rate_from": rate_from, "bench_seconds": round(time.perf_counter() - t0, 1),
           "ray": ray.__version__}
    return summarise(out), raw


def notes(raw: Mapping[str, Any]) -> str:
    """The live part's sentence for the report's notes."""
    quick = ("QUICK live part: the suite's quick stream with the full stream's S*, 1 repeat: a smoke test of the code path, "
             "not a measurement. " if raw["quick"] else "")
    return (f"{quick}LIVE part (live_*): the closed-loop suite's {raw['workload']} stream ({raw['items']} items, "
            f"{raw['regimes']}) at time scale {raw['time_scale']:g} on one Ray node of {raw['cpus']} logical CPUs; "
            f"{len(raw['repeats'])} repeat(s), each in the order {', '.join(RUNS)}; S* = {raw['static_hindsight_allocation']} "
            "(the suite's sim section); ratios are trident's rate over the same repeat's S* rate, medians over repeats; "
            "throughput = input items / (last output - first output).")


def _over_static(entry: Mapping[str, Any], label: str) -> float | None:
    run, static = entry[label], entry[STATIC_HINDSIGHT]
    if run["items_lost"] or static["items_lost"] or not run["items_per_s"] or not static["items_per_s"]:
        return None
    return run["items_per_s"] / static["items_per_s"]


def _shown(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"
