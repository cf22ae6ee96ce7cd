"""Benchmark ``ray-data-import``: the user's Ray Data pipeline, under trident, against the native spec.

Contract of ``run(quick) -> BenchResult``: on one local Ray cluster of 8 logical CPUs + 1 logical GPU,
the same emulated document workload (``n`` items, seed 7) runs ``repeats`` times as each system,
alternating which goes first, both under the ``trident`` policy:
- ``native`` (the baseline): the project's ``emulated-docs`` PipelineSpec under ``run_pipeline``;
- ``ray_data``: ``examples/ray_data_emulated.py:build`` (the same pipeline as plain Ray Data) through
  ``trident_flows.ray_data.run_dataset`` (plan read, input staged, run, output published).
Throughput = items / wall seconds from the call to the written output (cold starts, staging and
publishing included). Summary targets: ``ratio_ray_data_vs_native`` = median(ray_data) / median(native)
>= 0.95; ``same_rows_and_marks`` (both kept and filtered the same rows with the same reasons) == True.
Every run is checked for lost or duplicated items (``_check``).
"""

from __future__ import annotations

import logging
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import ray

from benchmarks.report import BenchResult, Target

CLUSTER_CPUS, CLUSTER_GPUS = 8, 1
SEED = 7
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "ray_data_emulated.py"


def _native(n: int, time_scale: float, out: Path, tick_s: float) -> tuple[float, Any]:
    from trident_flows.control.launch import cluster_totals, run_pipeline
    from trident_flows.core.types import ClusterSpec
    from trident_flows.pipelines.emulated_docs import build
    from trident_flows.scheduler.policies import make_policy

    start = time.perf_counter()
    spec = build(synth=n, seed=SEED, time_scale=time_scale)
    cpus, gpus = cluster_totals()  # what run_dataset gives the policy too
    policy = make_policy("trident", spec=spec, cluster=ClusterSpec.single_node(cpus, int(gpus)))
    summary = run_pipeline(spec, out, policy=policy, tick_s=tick_s, overwrite=True)
    return time.perf_counter() - start, summary


def _ray_data(n: int, time_scale: float, out: Path, tick_s: float) -> tuple[float, Any]:
    from trident_flows.ray_data import load_function, run_dataset

    build = load_function(f"{EXAMPLE}:build")
    start = time.perf_counter()
    run = run_dataset(build(synth=n, seed=SEED, time_scale=time_scale), out, policy="trident", tick_s=tick_s)
    return time.perf_counter() - start, run.summary


def _warm_up() -> None:
    """Import what both systems use once, untimed: the policy's models and solvers (about 4 s of
    imports on this machine) would otherwise be paid by the first timed run alone, always ``native``."""
    import trident_flows.ray_data  # noqa: F401 - imported for the warm-up
    from trident_flows.control.launch import cluster_totals
    from trident_flows.core.types import ClusterSpec
    from trident_flows.pipelines.emulated_docs import build
    from trident_flows.scheduler.policies import make_policy

    cpus, gpus = cluster_totals()
    make_policy("trident", spec=build(synth=1, seed=SEED), cluster=ClusterSpec.single_node(cpus, int(gpus)))


def _marks_native(out: Path) -> dict[str, str]:
    table = pq.read_table(out / "data", columns=["id", "_drop"]) if any((out / "data").glob("*.parquet")) else None
    return {} if table is None else {i: d or "" for i, d in zip(table.column("id").to_pylist(), table.column("_drop").to_pylist())}


def _marks_ray_data(out: Path) -> dict[str, str]:
    table = pq.read_table(out / "dataset", columns=["id", "_drop"])
    return {i: d or "" for i, d in zip(table.column("id").to_pylist(), table.column("_drop").to_pylist())}


def _check(system: str, summary: Any, n: int) -> None:
    if summary.error or summary.items_in != n or summary.items_missing or summary.duplicate_ids:
        raise RuntimeError(f"{system}: lost or duplicated items: in {summary.items_in}/{n}, missing {summary.items_missing}, "
                           f"duplicates {summary.duplicate_ids}, error {summary.error!r}")


def _figure(raw: dict[str, Any]) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    reps = range(1, len(raw["native_items_per_s"]) + 1)
    ax.plot(reps, raw["native_items_per_s"], "o-", label="native PipelineSpec, under trident")
    ax.plot(reps, raw["ray_data_items_per_s"], "s--", label="the user's Ray Data pipeline, under trident")
    ax.set_xticks(list(reps))
    ax.set_xlabel("repeat")
    ax.set_ylabel("items / s (wall, incl. cold start)")
    ax.set_title(f"Emulated documents, {raw['items']} items, {CLUSTER_CPUS} CPUs + {CLUSTER_GPUS} GPU, policy trident")
    ax.set_ylim(bottom=0)
    ax.legend(loc="lower right")
    fig.tight_layout()
    return fig


def run(quick: bool = False, items: int | None = None, repeats: int | None = None) -> BenchResult:
    """``items`` / ``repeats`` override the sizes of ``quick`` (a partial run on a busy machine). The one-time imports
    of the policy's models are done before the first timed run (``_warm_up``), so neither system's first run pays them
    alone; the 1-minute load average at each run's start and end is recorded. ``ratio_runner_only`` compares the
    runners' own throughput (``RunSummary.throughput_items_per_s``), staging and publishing left out."""
    n, reps, time_scale = (120, 1, 0.25) if quick else (400, 3, 0.5)
    n, repeats = items or n, repeats or reps
    tick_s = 2.0
    started = not ray.is_initialized()
    if started:
        ray.init("local", num_cpus=CLUSTER_CPUS, num_gpus=CLUSTER_GPUS, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    _warm_up()
    work = Path(tempfile.mkdtemp(prefix="trident-ray-data-import-"))
    tp: dict[str, list[float]] = {"native": [], "ray_data": []}
    runner_tp: dict[str, list[float]] = {"native": [], "ray_data": []}
    reconfigurations: dict[str, list[int]] = {"native": [], "ray_data": []}
    load: dict[str, list[tuple[float, float]]] = {"native": [], "ray_data": []}  # 1-minute load average at each run's start and end
    same_marks: list[bool] = []
    try:
        for rep in range(repeats):
            order = ("native", "ray_data") if rep % 2 == 0 else ("ray_data", "native")
            outs = {}
            for system in order:
                out = work / f"{system}-{rep}"
                load_start = os.getloadavg()[0]
                wall, summary = (_native if system == "native" else _ray_data)(n, time_scale, out, tick_s)
                load[system].append((round(load_start, 2), round(os.getloadavg()[0], 2)))
                _check(system, summary, n)
                tp[system].append(n / wall)
                runner_tp[system].append(summary.throughput_items_per_s)
                reconfigurations[system].append(summary.reconfigurations)
                outs[system] = out
            same_marks.append(_marks_native(outs["native"]) == _marks_ray_data(outs["ray_data"]))
            for out in outs.values():
                shutil.rmtree(out, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if started:
            ray.shutdown()
    ratio = statistics.median(tp["ray_data"]) / statistics.median(tp["native"])
    raw = {"items": n, "repeats": repeats, "time_scale": time_scale, "seed": SEED, "policy": "trident", "tick_s": tick_s,
           "cluster": {"cpus": CLUSTER_CPUS, "gpus": CLUSTER_GPUS}, "native_items_per_s": tp["native"],
           "ray_data_items_per_s": tp["ray_data"], "native_runner_items_per_s": runner_tp["native"],
           "ray_data_runner_items_per_s": runner_tp["ray_data"], "reconfigurations": reconfigurations,
           "same_rows_and_marks": same_marks, "load_average_1min": load, "ray_version": ray.__version__}
    summary = {"ratio_ray_data_vs_native": ratio, "ray_data_items_per_s_median": statistics.median(tp["ray_data"]),
               "native_items_per_s_median": statistics.median(tp["native"]),
               "ratio_runner_only": statistics.median(runner_tp["ray_data"]) / statistics.median(runner_tp["native"]),
               "same_rows_and_marks": all(same_marks),
               "load_average_1min_range": [min(x for runs in load.values() for run in runs for x in run),
                                           max(x for runs in load.values() for run in runs for x in run)]}
    notes = (f"Emulated documents (measured cost model, time scale {time_scale}), {n} items, {CLUSTER_CPUS} logical CPUs + "
             f"{CLUSTER_GPUS} emulated GPU, policy trident (tick {tick_s:g} s) for both. native = `emulated-docs` PipelineSpec via "
             "run_pipeline; ray_data = examples/ray_data_emulated.py:build (the same stages and static layout as plain Ray Data "
             "map_batches) via trident_flows.ray_data.run_dataset, input staging and Parquet publishing included. Throughput = "
             f"items / wall seconds of the whole call (the policy's one-time imports done before the first timed run); alternating "
             f"order, medians over {repeats} repeats. ratio_runner_only: "
             "the runner's own items/s (from the runner's start, replica cold starts included, to its last commit: "
             "staging and publishing left out). load_average_1min: the machine's 1-minute load average at the start and end of each run "
             "(other jobs share its cores).")
    return BenchResult("ray-data-import", summary, {"ratio_ray_data_vs_native": Target(">=", 0.95),
                                                    "same_rows_and_marks": Target("==", True)}, raw, _figure(raw), notes)
