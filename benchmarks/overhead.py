"""Benchmark ``overhead``: this runtime against plain Ray Data on the same emulated pipeline.

Contract of ``run(quick) -> BenchResult``: one local Ray cluster (8 logical CPUs); the same
4-operator emulated pipeline (parse, langid, quality, embed on CPU from the documents cost
model when ``profiles/documents.json`` exists, otherwise a benchmark-local cost model, said so
in the notes), the same static configuration (replicas, batch size, CPUs per replica) and the
same items, run alternately on this runtime (``start_runner`` -> outputs committed) and on
Ray Data (``from_items -> map_batches(..., compute=ActorPoolStrategy(size=n)) -> write_parquet``),
``repeats`` times each, alternating which goes first. Throughput = items / wall seconds from
submission to written output, cold starts included for both. Headline: ``ratio_vs_ray_data``
= median(runtime throughput) / median(Ray Data throughput), target >= 0.95.
"""

from __future__ import annotations

import logging
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import ray

from benchmarks.report import BenchResult, Target
from trident_flows.control.launch import start_runner
from trident_flows.core.state import RunnerSettings
from trident_flows.core.types import OpConfig
from trident_flows.pipelines.emulated import Stage, emulated_pipeline, regime_plan
from trident_flows.runtime.costmodel import DeviceCost, OperatorCost, PipelineProfile
from trident_flows.runtime.sink import account
from trident_flows.runtime.spec import PipelineSpec

OPERATORS = ("parse", "langid", "quality", "embed")
REPLICAS = {"parse": 2, "langid": 1, "quality": 1, "embed": 2}
BATCH_SIZE = 8
CLUSTER_CPUS = 8


def _local_profile() -> PipelineProfile:
    """Used only when no documents profile exists: an illustrative cost model, not a measurement."""
    return PipelineProfile("overhead-local", (
        OperatorCost("parse", {"cpu": DeviceCost(per_batch_s=0.002, per_item_s=0.002, per_unit_s={"pages": 0.001})}, features=("pages",)),
        OperatorCost("langid", {"cpu": DeviceCost(per_item_s=0.001)}),
        OperatorCost("quality", {"cpu": DeviceCost(per_item_s=0.001)}, selectivity=0.9),
        OperatorCost("embed", {"cpu": DeviceCost(per_batch_s=0.004, per_item_s=0.004)}),
    ), workloads={"short": {"pages": 2.0}, "long": {"pages": 20.0}})


def _profile() -> tuple[PipelineProfile, str]:
    try:
        profile = PipelineProfile.load("documents")
    except FileNotFoundError:
        return _local_profile(), "benchmark-local cost model (profiles/documents.json was not present): illustrative, not measured"
    if all(op in {o.name for o in profile.operators} and "cpu" in profile.operator(op).devices for op in OPERATORS):
        return profile, "documents cost model (profiles/documents.json), CPU devices, time-scaled"
    return _local_profile(), "benchmark-local cost model (the documents profile lacks a CPU cost for one of the operators)"


def _time_scale(profile: PipelineProfile, n: int, target_items_per_s: float) -> float:
    """Scale the modelled seconds so the static configuration's bottleneck runs ``target_items_per_s``."""
    blocks = regime_plan(profile.workloads, n, None)
    total = sum(c for _, c in blocks)
    features: dict[str, float] = {}
    for regime, count in blocks:
        for f, mean in profile.workloads.get(regime, {}).items():
            features[f] = features.get(f, 0.0) + mean * count / total
    per_item = []
    reach = 1.0
    for name in OPERATORS:
        op = profile.operator(name)
        cost = op.device("cpu")
        per_item.append(reach * (cost.seconds(BATCH_SIZE, {f: v * BATCH_SIZE for f, v in features.items()}) / BATCH_SIZE) / REPLICAS[name])
        reach *= op.selectivity
    return (1.0 / target_items_per_s) / max(per_item)


def build_spec(profile: PipelineProfile, n: int, time_scale: float) -> PipelineSpec:
    stages = [Stage(o, OpConfig.make("cpu", batch_size=BATCH_SIZE), REPLICAS[o]) for o in OPERATORS]
    return emulated_pipeline(profile, stages, name="overhead", items=n, seed=7, time_scale=time_scale)


def run_runtime(spec: PipelineSpec, out: Path) -> float:
    """Seconds from submission to committed output on this runtime."""
    start = time.perf_counter()
    handle = start_runner(spec, out, name=f"overhead-{uuid.uuid4().hex[:6]}", namespace="bench",
                          settings=RunnerSettings(max_inflight_per_replica=2))
    summary = ray.get(handle.wait.remote(None))
    wall = time.perf_counter() - start
    ray.get(handle.stop.remote())
    ray.kill(handle)
    acc = account(out)
    if summary["error"] or acc.items_written + acc.items_dead_lettered != spec.items or acc.duplicate_ids:
        raise RuntimeError(f"runtime run lost or duplicated items: {acc} {summary['error']}")
    return wall


def run_ray_data(spec: PipelineSpec, out: Path) -> float:
    """Seconds from submission to written Parquet on plain Ray Data, same operators and config."""
    from ray.data import ActorPoolStrategy

    start = time.perf_counter()
    ds = ray.data.from_items(list(spec.source()))
    for op in spec.operators:
        ds = ds.map_batches(op.cls, fn_constructor_kwargs={"config": op.config, **dict(op.params)}, batch_size=op.config.batch_size,
                            compute=ActorPoolStrategy(size=op.replicas), num_cpus=op.config.cpus, batch_format="numpy")
    ds.write_parquet(str(out))
    wall = time.perf_counter() - start
    written = ray.data.read_parquet(str(out)).count()
    if written != spec.items:
        raise RuntimeError(f"Ray Data wrote {written} rows, expected {spec.items}")
    return wall


def _figure(raw: dict[str, Any]) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    reps = range(1, len(raw["runtime_items_per_s"]) + 1)
    ax.plot(reps, raw["runtime_items_per_s"], "o-", label="trident-flows runtime")
    ax.plot(reps, raw["ray_data_items_per_s"], "s--", label="plain Ray Data")
    ax.set_xticks(list(reps))
    ax.set_xlabel("repeat")
    ax.set_ylabel("items / s (wall, incl. cold start)")
    ax.set_title(f"Same emulated pipeline, same static config ({raw['items']} items)")
    ax.set_ylim(bottom=0)
    ax.legend()
    fig.tight_layout()
    return fig


def run(quick: bool = False) -> BenchResult:
    n, repeats, target = (200, 2, 40.0) if quick else (2000, 5, 40.0)
    profile, source_note = _profile()
    time_scale = _time_scale(profile, n, target)
    spec = build_spec(profile, n, time_scale)
    started = not ray.is_initialized()
    if started:
        ray.init("local", num_cpus=CLUSTER_CPUS, num_gpus=0, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix="trident-overhead-"))
    runtime_tp: list[float] = []
    ray_data_tp: list[float] = []
    try:
        for rep in range(repeats):
            order = ("runtime", "ray_data") if rep % 2 == 0 else ("ray_data", "runtime")
            for system in order:
                out = work / f"{system}-{rep}"
                if system == "runtime":
                    runtime_tp.append(n / run_runtime(spec, out))
                else:
                    ray_data_tp.append(n / run_ray_data(spec, out))
                shutil.rmtree(out, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if started:
            ray.shutdown()
    ratio = statistics.median(runtime_tp) / statistics.median(ray_data_tp)
    raw = {"items": n, "repeats": repeats, "time_scale": time_scale, "operators": list(OPERATORS), "replicas": REPLICAS,
           "batch_size": BATCH_SIZE, "cluster_cpus": CLUSTER_CPUS, "modelled_bottleneck_items_per_s": target,
           "runtime_items_per_s": runtime_tp, "ray_data_items_per_s": ray_data_tp, "ray_version": ray.__version__}
    summary = {"ratio_vs_ray_data": ratio, "runtime_items_per_s_median": statistics.median(runtime_tp),
               "ray_data_items_per_s_median": statistics.median(ray_data_tp)}
    notes = (f"{source_note}. Static config {REPLICAS}, batch {BATCH_SIZE}, {CLUSTER_CPUS} logical CPUs; emulated CPU work sleeps "
             f"while holding its logical CPU. Alternating order per repeat; medians over {repeats} repeats.")
    return BenchResult("overhead", summary, {"ratio_vs_ray_data": Target(">=", 0.95)}, raw, _figure(raw), notes)
