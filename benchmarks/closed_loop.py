"""Benchmark ``closed-loop``: Trident against static, per-regime-oracle, DS2, threshold, plain Ray
Data autoscaling and cosmos-xenna, side by side on an emulated pipeline.

Contract of ``run(quick, pipeline="documents") -> BenchResult`` (``closed_loop_video`` runs
``pipeline="video"`` as ``closed-loop-video``):
- Workload (``closed_loop_workload.PIPELINES``): the emulated document or video pipeline on one
  logical node of 16 CPUs + 2 emulated GPUs (``DEVICE_MEMORY`` each), a seeded regime stream, and
  a memory-``spikes`` variant; systems (``SYSTEMS``) as ``run`` lists them.
- Per run: throughput, accelerator busy fraction, OOMs, items lost (``lineage.items_lost``),
  reconfigurations, controller milliseconds per tick and step, and the ticks that acted. Medians.
- Summary: ``speedup_vs_static_avg`` / ``_ray_data`` / ``_xenna``, ``ratio_to_oracle``,
  ``trident_ooms``, ``trident_items_lost``, ``tick_ms_p95``, ``applies_refused``,
  ``refused_repeated`` (must be 0) and ``oracle_headroom_model`` (the workload's ceiling by the cost
  model). A system that could not run has ``None`` figures and its error in ``raw``. Parts:
  ``closed_loop_runs``, ``closed_loop_stats``, ``closed_loop_figure``.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import ray

from benchmarks.closed_loop_figure import figure
from benchmarks.closed_loop_runs import TICK_S, XENNA_AUTOSCALE_S, XENNA_WINDOW_S, run_matrix
from benchmarks.closed_loop_stats import per_system, summarise
from benchmarks.closed_loop_workload import CPU_BATCH, CPUS, DEVICE_MEMORY, GPU_BATCHES, GPUS, PIPELINES, BenchPipeline, model_headroom, tune, workloads
from benchmarks.report import BenchResult, Target
from trident_flows.core.types import GPU
from trident_flows.runtime.costmodel import PipelineProfile

OURS = ("static-avg", "static-large", "oracle", "ds2", "threshold", "trident")
SYSTEMS = OURS + ("ray-data", "xenna")
SPIKE_SYSTEMS = ("static-avg", "static-large", "trident")


# ---------------------------------------------------------------------------- entry point
def run(quick: bool = False, *, pipeline: str = "documents", systems: Sequence[str] = SYSTEMS,
        spike_systems: Sequence[str] = SPIKE_SYSTEMS, repeats: int | None = None, log: Any = print) -> BenchResult:
    """The benchmark on ``pipeline`` (a key of ``PIPELINES``); ``quick``: a smaller stream at a quarter of the time
    scale, one repeat.

    Systems, each on the same items and seed, interleaved round-robin within each repeat: ``static-avg``
    (``static_search.search_static`` on the mean features of a random 10% sample of the stream: the cost model's
    prediction, not a trial run), ``static-large`` (the same replicas, GPU operators at the largest batch that fits
    the device for the mean item of every regime: the hand-tuned "max batch size"), ``oracle`` (switches each
    operator to its regime's best static configuration when the block reaches it, ``oracle_policy.OraclePolicy``),
    ``ds2``, ``threshold``, ``trident`` (the registry's policies in the runtime's control loop every ``TICK_S``,
    starting from static-avg), ``ray-data`` (a ``map_batches`` chain with ``ActorPoolStrategy(min_size=1,
    max_size, initial_size=static-avg replicas)``) and ``xenna`` (``xenna_adapter``, streaming, its autoscaler).
    Variant ``spikes``: the same stream with the middle 80% of the spike regime's first block at 5x memory per
    item. Throughput = input items / (last output - first output): the initial cold start (which differs by system
    and machine load) is left out, the cold starts of reconfigurations are in."""
    if pipeline not in PIPELINES:
        raise ValueError(f"unknown closed-loop pipeline {pipeline!r}; choose one of {sorted(PIPELINES)}")
    bench = PIPELINES[pipeline]
    profile = PipelineProfile.load(bench.profile)
    main_wl, spike_wl = workloads(quick, bench)
    repeats = repeats if repeats is not None else (1 if quick else 2)
    tuning = tune(profile, main_wl)
    started = not ray.is_initialized()
    if started:
        # the dashboard serves Ray's state API, which xenna's monitor calls
        ray.init("local", num_cpus=CPUS, num_gpus=GPUS, include_dashboard="xenna" in systems, log_to_driver=False,
                 configure_logging=False)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix="trident-closed-loop-"))
    t_start = time.perf_counter()
    try:
        main = run_matrix(profile, main_wl, tuning, systems, repeats, work, log)
        spikes = run_matrix(profile, spike_wl, tuning, spike_systems, 1, work, log) if spike_systems else []
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if started:
            ray.shutdown()
    summary = summarise(main, spikes)
    headroom = model_headroom(profile, main_wl, tuning)
    summary["oracle_headroom_model"] = headroom["ratio"]
    targets = {"speedup_vs_static_avg": Target(">=", 1.8), "speedup_vs_ray_data": Target(">=", 1.3), "speedup_vs_xenna": Target(">=", 1.2),
               "ratio_to_oracle": Target(">=", 0.9), "trident_ooms": Target("==", 0), "trident_items_lost": Target("==", 0),
               "tick_ms_p95": Target("<=", TICK_S * 1000), "refused_repeated": Target("==", 0)}
    raw = {
        "workloads": {w.variant: {"regimes": w.regimes, "items": w.items, "seed": w.seed, "time_scale": w.time_scale,
                                  "memory_spikes": [list(s) for s in w.memory_spikes]} for w in (main_wl, spike_wl)},
        "cluster": {"cpus": CPUS, "gpus": GPUS, "device_memory_bytes": DEVICE_MEMORY, "tick_s": TICK_S, "cpu_batch": CPU_BATCH,
                    "gpu_batches": list(GPU_BATCHES)},
        "tuning": {"static_avg": tuning.static_avg.to_dict(), "static_large": tuning.static_large.to_dict(),
                   "per_regime": {r: c.to_dict() for r, c in tuning.per_regime.items()}, "sample_items": tuning.sample_items,
                   "sample_mean_features": dict(tuning.sample_features), "large_batch": tuning.large_batch,
                   "method": "cost-model prediction on the mean features of a seeded random 10% sample of the stream"},
        "pipeline": pipeline, "model_headroom": headroom, "repeats": repeats, "bench_seconds": time.perf_counter() - t_start,
        "per_system": per_system(main), "per_system_spikes": per_system(spikes),
        "runs": [r.to_dict() for r in (*main, *spikes)],
        "versions": {"ray": ray.__version__, "cosmos_xenna": _xenna_version()},
    }
    notes = _notes(bench, raw)
    # the last operator's items taken per input item: upstream filters (< 1) and splits (> 1)
    reach = float(np.prod([op.selectivity for op in profile.operators[:-1]]))
    name = "closed-loop" if pipeline == "documents" else f"closed-loop-{pipeline}"
    fig = figure(main, spikes, main_wl, summary, reach, bench.colors, f"{pipeline}: ")
    return BenchResult(name, summary, targets, raw, fig, notes)


def _xenna_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("cosmos-xenna")
    except Exception:  # noqa: BLE001 - not installed
        return None


def _notes(bench: BenchPipeline, raw: Mapping[str, Any]) -> str:
    errors = {s: v["errors"] for s, v in raw["per_system"].items() if v["errors"]}
    gpu_batches = {n: o["config"]["batch_size"] for n, o in raw["tuning"]["static_avg"]["operators"].items() if o["config"]["device"] == GPU}
    headroom = raw["model_headroom"]
    return (f"{bench.label[0].upper()}{bench.label[1:]}, cost models from the measured {bench.profile} profile (GPU entries derived "
            f"from CPU, see the profile), on one logical node of {CPUS} CPUs + {GPUS} emulated GPUs hosted by this machine's "
            f"cores; time scale {raw['workloads']['regimes']['time_scale']}. Throughput = input items / (last output - first "
            f"output): the initial cold start is excluded (raw: startup_s, items_per_s_total), reconfiguration cold starts are "
            f"not; median of {raw['repeats']} interleaved repeats. Static configs from the cost model on a 10% sample "
            f"(static-avg GPU batches: {gpu_batches or 'none'}; static-large: {raw['tuning']['large_batch']}). Model headroom: "
            f"the per-regime configs switched for free would reach {headroom['ratio']:.3f}x static-avg by the cost model "
            f"({headroom['oracle_items_per_s']:.2f} vs {headroom['static_avg_items_per_s']:.2f} items/s at time scale 1). "
            f"Ray Data: ActorPoolStrategy(min 1, max, initial = static-avg). xenna: streaming, autoscaler every "
            f"{XENNA_AUTOSCALE_S:g} s over a {XENNA_WINDOW_S:g} s window (its defaults, 180 s, never fire in a run this short). "
            f"Errors: {errors or 'none'}.")
