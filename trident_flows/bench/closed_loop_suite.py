"""Benchmark ``closed-loop-suite``: trident against the baselines a user would have, on workloads
where adaptive scheduling can pay and on the two where it cannot.

Contract of ``run(quick) -> BenchResult``:
- Workloads (``suite_workloads``), each an emulated pipeline on one logical node of 16 CPUs (+ GPUs)
  fed a seeded stream of regime blocks:
  - ``gpu-ocr``: documents with RapidOCR as the OCR engine (``profiles/documents-rapidocr.json``:
    OCR measured on CPU, its GPU cost derived, see that profile), 16 CPUs + 2 GPUs, so OCR and
    embedding compete for the GPUs; blocks born-digital ``short`` -> ``scans`` -> ``long`` (long
    reports, born-digital with a few scanned pages: the mixed regime) -> ``short``;
  - ``cpu-only``: documents (tesseract) on 16 CPUs and no GPU, the same blocks;
  - ``docs-baseline`` / ``video-baseline``: the streams of ``closed-loop`` / ``closed-loop-video``
    (16 CPUs + 2 GPUs), kept as the cases with little headroom;
  - ``video``: video on 16 CPUs + 2 GPUs, blocks ``small`` -> ``hd`` -> ``long`` -> ``small``, the
    largest variation the video profile's regimes give.
  The blocks of gpu-ocr, cpu-only and video last ``BLOCK_S`` (quick: ``QUICK_BLOCK_S``) seconds of
  production time each at their own optimum (items = the regime's optimal items/s by the cost model
  x seconds), run at ``TIME_SCALE`` (every modelled second, emulated cold starts included, x the
  scale; Ray's own actor start-up is not compressed).
- Systems (``SYSTEMS``; one sentence each in ``baselines.DEFINITIONS``), every one on every
  workload, interleaved and rotated within each repeat: ``static-default``, ``static-first-n``,
  ``static-hindsight`` (``baselines``), ``trident``, ``ds2``, ``threshold`` (policies of this
  runtime, starting from static-default), ``ray-data-fixed`` and ``ray-data-autoscaling``. The
  memory-spike variant (the middle 80% of the first ``long`` block at 5x memory per item) runs
  every system in a full run, static-default and trident with ``--quick``. cosmos-xenna is not in
  the suite: its autoscaler cannot start from given worker counts (a fixed ``num_workers`` turns
  it off), so it could not start where the others do.
- Summary, per workload: ``headroom`` (``headroom.headroom``: the best single static in hindsight
  over every regime's own optimum switched for free, on the cost models, whole replicas),
  ``trident_vs_static_hindsight``, ``trident_vs_static_default``,
  ``trident_vs_ray_data_autoscaling`` (ratios of median items/s, regimes variant), ``captured``
  (``trident_vs_static_hindsight / headroom``), ``headroom_simulated`` and ``captured_simulated``
  (the same with ``sim_headroom.simulated_headroom``: the model's allocations measured in the
  simulator, where they are not what the model says: on gpu-ocr the model's per-regime optima
  ran slower than its best static), ``trident_ooms`` (trident, both variants) and
  ``items_lost`` (every run of every system). ``None`` where a system could not run (its error is
  in ``raw``). Throughput and run records are those of ``closed_loop`` (first to last output).
- The figure has one row per workload: completed items/s over time of each system's median run,
  shaded by the regime trident's last operator works on, and trident's replicas per operator.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import psutil
import ray

from trident_flows.bench import closed_loop_figure, closed_loop_workload, headroom, sim_headroom
from trident_flows.bench.baselines import DEFINITIONS, STATIC_DEFAULT, STATIC_HINDSIGHT, STATIC_SYSTEMS, Baselines, tune_baselines
from trident_flows.bench.closed_loop_runs import RunRecord, run_ray_data, run_runtime
from trident_flows.bench.closed_loop_stats import per_system
from trident_flows.bench.closed_loop_workload import Workload
from trident_flows.bench.report import BenchResult
from trident_flows.bench.sim_headroom import simulated_headroom
from trident_flows.pipelines.emulated_docs import LAYOUT as DOCS_LAYOUT
from trident_flows.pipelines.emulated_layout import EmulatedLayout
from trident_flows.pipelines.emulated_video import LAYOUT as VIDEO_LAYOUT
from trident_flows.runtime.costmodel import PipelineProfile
from trident_flows.runtime.leftovers import ray_descendants
from trident_flows.scheduler.policies import make_policy
from trident_flows.core.types import ClusterSpec

CPUS, GPUS = closed_loop_workload.CPUS, closed_loop_workload.GPUS
DEVICE_MEMORY = closed_loop_workload.DEVICE_MEMORY
SYSTEMS = (STATIC_DEFAULT, "static-first-n", STATIC_HINDSIGHT, "trident", "ds2", "threshold", "ray-data-fixed", "ray-data-autoscaling")
SPIKE_SYSTEMS = SYSTEMS
QUICK_SPIKE_SYSTEMS = (STATIC_DEFAULT, "trident")
# Production seconds per block, and the time scale they run at. A full run keeps blocks of five minutes,
# the upper end of the regime lengths of real corpora: in the simulator, trident gains 1.15x over
# static-default on cpu-only with 5-minute blocks, 1.05x with 4, 1.01x with 3 and nothing with 1-minute
# blocks, which end before a change has paid for its cold starts. The scale keeps the fastest regime
# (short born-digital documents, ~73 items/s at its optimum) within what the runtime moves on 2 cores.
BLOCK_S, QUICK_BLOCK_S = 300.0, 6.0
QUICK_SIM_EVALS = 10  # allocations one hill-climb of the simulated headroom may measure with --quick
TIME_SCALE = 0.5
FIRST_N_SHARE = 0.05  # static-first-n profiles the first 5% of the stream (at least MIN_FIRST_N items)
MIN_FIRST_N = 10
SEED = 11
SPIKE_FACTOR = closed_loop_workload.SPIKE_FACTOR


@dataclass(frozen=True)
class SuiteWorkload:
    """One workload of the suite: a profile, its default layout, GPUs on the node, a schedule and a time scale."""

    name: str
    profile: str
    layout: EmulatedLayout
    gpus: int
    regimes: str  # block schedule, "regime:items,..."
    time_scale: float
    note: str
    spike_regime: str = "long"

    def streams(self) -> tuple[Workload, Workload]:
        """The regimes stream and its memory-spike variant (the middle 80% of the first ``spike_regime`` block)."""
        base = Workload("regimes", self.regimes, seed=SEED, time_scale=self.time_scale)
        _, start, end = next(b for b in base.blocks() if b[0] == self.spike_regime)
        count = max(1, int(0.8 * (end - start)))
        return base, Workload("spikes", self.regimes, seed=SEED, time_scale=self.time_scale,
                              memory_spikes=((start + (end - start - count) // 2, count, SPIKE_FACTOR),))

    def baselines(self, profile: PipelineProfile, stream: Workload, rows: Sequence[Mapping[str, Any]]) -> Baselines:
        """The static configurations every system starts from on ``stream`` (``rows``: its rows under ``profile``)."""
        return tune_baselines(profile, self.layout, rows, stream.blocks(), cpus=CPUS, gpus=self.gpus, device_memory_bytes=DEVICE_MEMORY,
                              gpu_batches=closed_loop_workload.GPU_BATCHES, cpu_batch=closed_loop_workload.CPU_BATCH,
                              first_n=max(MIN_FIRST_N, int(len(rows) * FIRST_N_SHARE)))

    def headroom_workload(self, profile: PipelineProfile) -> headroom.Workload:
        schedule = tuple((regime, end - start) for regime, start, end in self.streams()[0].blocks())
        return headroom.Workload(self.name, profile, CPUS, self.gpus, DEVICE_MEMORY, schedule, note=self.note)


def equal_time_regimes(profile: PipelineProfile, gpus: int, regimes: Sequence[str], seconds: float) -> str:
    """A schedule whose blocks each last ``seconds`` at their regime's optimum (production speed, cost model)."""
    probe = headroom.Workload("probe", profile, CPUS, gpus, DEVICE_MEMORY, tuple((r, 1) for r in dict.fromkeys(regimes)))
    opts = headroom.options(probe)
    rate = {r: headroom.regime_optimum(probe, r, opts)[0] for r in dict.fromkeys(regimes)}
    return ",".join(f"{r}:{max(1, int(rate[r] * seconds))}" for r in regimes)


WORKLOADS = ("gpu-ocr", "cpu-only", "docs-baseline", "video-baseline", "video")


def suite_workloads(quick: bool, names: Sequence[str] = WORKLOADS) -> list[SuiteWorkload]:
    """The workloads called ``names``, in the suite's order (see the module docstring)."""
    unknown = sorted(set(names) - set(WORKLOADS))
    if unknown:
        raise ValueError(f"unknown suite workload(s) {unknown}; choose from {list(WORKLOADS)}")
    seconds = QUICK_BLOCK_S if quick else BLOCK_S
    doc_blocks, video_blocks = ("short", "scans", "long", "short"), ("small", "hd", "long", "small")
    old_docs, old_video = closed_loop_workload.PIPELINES["documents"], closed_loop_workload.PIPELINES["video"]
    each = f"blocks of {seconds:g} s each at their optimum (production time), time scale {TIME_SCALE:g}"

    def equal_time(profile: str, gpus: int, blocks: Sequence[str]) -> str:
        return equal_time_regimes(PipelineProfile.load(profile), gpus, blocks, seconds)

    build = {
        "gpu-ocr": lambda: SuiteWorkload(
            "gpu-ocr", "documents-rapidocr", DOCS_LAYOUT, GPUS, equal_time("documents-rapidocr", GPUS, doc_blocks), TIME_SCALE,
            f"documents, OCR by RapidOCR (CPU measured, GPU derived), {CPUS} CPUs + {GPUS} GPUs, {each}"),
        "cpu-only": lambda: SuiteWorkload(
            "cpu-only", "documents", DOCS_LAYOUT, 0, equal_time("documents", 0, doc_blocks), TIME_SCALE,
            f"documents (tesseract) on {CPUS} CPUs, no GPU, {each}"),
        "docs-baseline": lambda: SuiteWorkload(
            "docs-baseline", "documents", DOCS_LAYOUT, GPUS, old_docs.quick_regimes if quick else old_docs.regimes,
            old_docs.quick_time_scale if quick else old_docs.time_scale, "the closed-loop benchmark's documents stream"),
        "video-baseline": lambda: SuiteWorkload(
            "video-baseline", "video", VIDEO_LAYOUT, GPUS, old_video.quick_regimes if quick else old_video.regimes,
            old_video.quick_time_scale if quick else old_video.time_scale, "the closed-loop-video benchmark's stream"),
        "video": lambda: SuiteWorkload(
            "video", "video", VIDEO_LAYOUT, GPUS, equal_time("video", GPUS, video_blocks), TIME_SCALE,
            f"video on {CPUS} CPUs + {GPUS} GPUs, {each}; the profile's regimes (small, hd, long) bound the variation"),
    }
    return [build[name]() for name in WORKLOADS if name in names]


# ---------------------------------------------------------------------------- runs
def run_one(system: str, profile: PipelineProfile, suite: SuiteWorkload, stream: Workload, baselines: Baselines, repeat: int,
            work: Path) -> RunRecord:
    """One run of ``system`` on ``stream``; a failure is recorded in ``error`` (its figures stay None)."""
    record = RunRecord(system, stream.variant, repeat, stream.items)
    spec = stream.spec(profile, baselines.start(system), f"suite-{suite.name}-{stream.variant}")
    out = work / f"{suite.name}-{stream.variant}-{system}-{repeat}"
    try:
        if system.startswith("ray-data"):
            return run_ray_data(spec, record, autoscale=system == "ray-data-autoscaling")
        policy = None if system in STATIC_SYSTEMS else make_policy(
            system, spec=spec, cluster=ClusterSpec.single_node(CPUS, suite.gpus, gpu_memory_bytes=DEVICE_MEMORY))
        return run_runtime(system, spec, policy, out, record)
    except Exception as exc:  # noqa: BLE001 - a system that cannot run is reported, not fatal for the others
        record.error = f"{type(exc).__name__}: {exc}"
        record.timeline, record.replicas = [], {}
        logging.getLogger(__name__).warning("closed-loop-suite: %s on %s failed: %s\n%s", system, suite.name, exc, traceback.format_exc())
        return record
    finally:
        shutil.rmtree(out, ignore_errors=True)


def run_systems(profile: PipelineProfile, suite: SuiteWorkload, stream: Workload, baselines: Baselines, systems: Sequence[str],
                repeats: int, work: Path, log: Any) -> list[RunRecord]:
    """``repeats`` rounds over ``systems``, the order rotated each round so load noise hits all alike."""
    records = []
    for rep in range(repeats):
        order = list(systems[rep % len(systems):]) + list(systems[:rep % len(systems)])
        for system in order:
            rec = run_one(system, profile, suite, stream, baselines, rep, work)
            records.append(rec)
            log(f"{suite.name} {stream.variant} rep {rep} {system}: {rec.items_per_s} items/s, ooms {rec.ooms}, lost {rec.items_lost}, "
                f"reconfigurations {rec.reconfigurations}{', error ' + rec.error if rec.error else ''}")
    return records


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summarise(main: Sequence[RunRecord], spikes: Sequence[RunRecord], headroom_ratio: float,
              simulated_ratio: float | None = None) -> dict[str, Any]:
    """The summary keys of one workload (see the module docstring)."""
    tp = {s: v["items_per_s_median"] for s, v in per_system(main).items()}
    vs_hindsight = _ratio(tp.get("trident"), tp.get(STATIC_HINDSIGHT))
    trident = [r for r in (*main, *spikes) if r.system == "trident" and not r.error]
    finished = [r for r in (*main, *spikes) if r.items_lost is not None]
    return {
        "headroom": headroom_ratio,
        "captured": _ratio(vs_hindsight, headroom_ratio),
        "headroom_simulated": simulated_ratio,
        "captured_simulated": _ratio(vs_hindsight, simulated_ratio),
        "trident_vs_static_hindsight": vs_hindsight,
        "trident_vs_static_default": _ratio(tp.get("trident"), tp.get(STATIC_DEFAULT)),
        "trident_vs_ray_data_autoscaling": _ratio(tp.get("trident"), tp.get("ray-data-autoscaling")),
        "trident_ooms": sum(r.ooms or 0 for r in trident) if trident else None,
        "items_lost": sum(r.items_lost or 0 for r in finished) if finished else None,
    }


def run(quick: bool = False, *, workloads: Sequence[str] = WORKLOADS, repeats: int | None = None, systems: Sequence[str] = SYSTEMS,
        spike_systems: Sequence[str] | None = None, log: Any = print) -> BenchResult:
    """The benchmark (see the module docstring); ``quick``: blocks of ``QUICK_BLOCK_S`` s, the baseline workloads'
    quick streams, one repeat, the spike variant for static-default and trident only. ``systems`` /
    ``spike_systems`` run a subset (the others' figures are then None)."""
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        raise ValueError(f"unknown suite system(s) {unknown}; choose from {list(SYSTEMS)}")
    chosen = suite_workloads(quick, workloads)
    repeats = repeats if repeats is not None else (1 if quick else 2)
    if spike_systems is None:
        spike_systems = [s for s in (QUICK_SPIKE_SYSTEMS if quick else SYSTEMS) if s in systems]
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
            simulated = simulated_headroom(suite.headroom_workload(profile), main_stream,
                                           ClusterSpec.single_node(CPUS, suite.gpus, gpu_memory_bytes=DEVICE_MEMORY),
                                           max_evals=QUICK_SIM_EVALS if quick else sim_headroom.MAX_EVALS)
            log(f"{suite.name}: {main_stream.regimes} at time scale {suite.time_scale:g}; headroom {bound.ratio:.3f} "
                f"(simulated {simulated.ratio:.3f}); "
                + "; ".join(f"{n} {c.label()}" for n, c in baselines.configs.items()))
            main = run_systems(profile, suite, main_stream, baselines, tuple(systems), repeats, work, log)
            spikes = run_systems(profile, suite, spike_stream, baselines, spike_systems, 1, work, log)
            results[suite.name] = {"suite": suite, "main": main, "spikes": spikes, "headroom": bound, "simulated_headroom": simulated,
                                   "baselines": baselines,
                                   "reach": float(np.prod([op.selectivity for op in profile.operators[:-1]])),
                                   "summary": summarise(main, spikes, bound.ratio, simulated.ratio)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if own_ray:
            ray.shutdown()
    summary = {name: r["summary"] for name, r in results.items()}
    raw = {name: _raw(r) for name, r in results.items()}
    raw["_run"] = {"repeats": repeats, "systems": list(systems), "spike_systems": list(spike_systems), "quick": quick,
                   "workloads": [w.name for w in chosen],
                   "bench_seconds": time.perf_counter() - t_start, "cpus": CPUS, "device_memory_bytes": DEVICE_MEMORY,
                   "definitions": DEFINITIONS, "targets": TARGETS, "ray": ray.__version__}
    return BenchResult("closed-loop-suite", summary, raw=raw, figure=figure(results), notes=_notes(results, quick, repeats))


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
        "headroom": result["headroom"].to_dict(), "headroom_simulated": result["simulated_headroom"].to_dict(),
        "baselines": result["baselines"].to_dict(),
        "per_system": per_system(result["main"]), "per_system_spikes": per_system(result["spikes"]),
        "runs": [r.to_dict() for r in (*result["main"], *result["spikes"])],
    }


def _notes(results: Mapping[str, Mapping[str, Any]], quick: bool, repeats: int) -> str:
    streams = "; ".join(f"{n}: {r['suite'].regimes} at time scale {r['suite'].time_scale:g}" for n, r in results.items())
    errors = {f"{n}/{s}": v["errors"] for n, r in results.items() for s, v in per_system(r["main"]).items() if v["errors"]}
    return (f"{'QUICK run (short streams: figures are noisy and trident has too few samples to act much). ' if quick else ''}"
            f"Emulated pipelines from the committed cost models (GPU entries derived, not measured: see the profiles) on one "
            f"logical node of {CPUS} CPUs hosted by this machine's 2 cores; median of {repeats} interleaved repeat(s); "
            f"throughput = input items / (last output - first output). Streams: {streams}. The time scale multiplies every "
            f"modelled second, emulated cold starts included; Ray's own actor start-up (about 1-5 s here) is not compressed. "
            f"Headroom: whole-replica cost-model optimum per regime switched for free over the best single static in hindsight, "
            f"searched over mixed configurations and fractional GPUs (headroom.py); static-hindsight as run is searched over "
            f"one configuration per operator and whole GPUs (static_search.py), so captured can exceed what the run's "
            f"static-hindsight leaves. Simulated headroom: the model's allocations (batches capped at 8, 16 and 64) and their "
            f"hill-climbed neighbours, each measured at steady state in the simulator; the best per regime over the best static "
            f"(sim_headroom.py). Baselines: " + " ".join(f"{k}: {v}." for k, v in DEFINITIONS.items())
            + f" cosmos-xenna is not run (its autoscaler cannot start from given worker counts). Errors: {errors or 'none'}.")


# ---------------------------------------------------------------------------- figure
def figure(results: Mapping[str, Mapping[str, Any]]) -> Any:
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
