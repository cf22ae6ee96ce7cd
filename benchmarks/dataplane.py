"""Benchmark ``dataplane``: what moving large intermediates costs this runtime's runner, against plain Ray Data.

Contract of ``run(quick) -> BenchResult``: the same static pipeline of four trivial operators
(``make`` gives each item a payload of 1 KB, 1 MB or 8 MB; two ``touch`` operators read one byte
of it; ``digest`` replaces it by a checksum, so the output written is small and the payload only
travels between operators), the same items, replicas and batch sizes, run alternately on this
runtime (``start_runner`` -> committed output) and on Ray Data (``map_batches`` with an actor
pool per operator -> ``write_parquet``), on one local node, then on a local 3-node cluster
(``ray.cluster_utils.Cluster``, one raylet per node) when it starts. Per payload size: items/s
(wall from submission to written output, cold starts included for both), and for this runtime
the bytes its runner process serialised per item, its CPU seconds per 1,000 items and its peak
RSS since it started (``summary()["runner"]``; Ray may start the runner in a worker process that
ran Ray Data tasks before, whose lifetime peak is not the runner's: ``runtime.peak_memory``). Headlines: ``runner_bytes_per_item_max`` (target <= 1 KB) and
``ratio_vs_ray_data_8mb_1node`` / ``_3nodes`` = median items/s of this runtime / of Ray Data at
8 MB (target >= 0.95).
"""

from __future__ import annotations

import logging
import shutil
import statistics
import tempfile
import time
import uuid
import zlib
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import ray

from benchmarks.local_ray import start_local_ray
from benchmarks.overhead import run_ray_data
from benchmarks.report import BenchResult, Target
from trident_flows.control.launch import start_runner
from trident_flows.core.state import RunnerSettings
from trident_flows.core.types import OpConfig
from trident_flows.runtime.sink import account
from trident_flows.runtime.spec import Batch, OperatorSpec, PipelineSpec

KB, MB = 1024, 2**20
# payload per item -> (batch size, items, quick items): batches of ~64 KB, 8 MB and 16 MB; items
# sized so a run takes seconds to tens of seconds on a 2-core machine
SIZES = {"1kb": (KB, 64, 3000, 600), "1mb": (MB, 8, 400, 80), "8mb": (8 * MB, 2, 120, 24)}
# one node of 6 CPUs or three of 2: one replica of 1 CPU per operator, and CPUs left for Ray Data's read/write tasks
NODE_CPUS = 2
OBJECT_STORE_BYTES = 512 * MB  # per node: room for the queues' bound (64 MB each) and Ray Data's blocks
GiB = 2**30


class Make:
    """Gives each item its payload: ``payload_bytes`` bytes (a row of a 2-D uint8 column)."""

    def __init__(self, config: OpConfig, payload_bytes: int) -> None:
        self.payload_bytes = int(payload_bytes)

    def __call__(self, batch: Batch) -> Batch:
        n = len(batch["id"])
        payload = np.empty((n, self.payload_bytes), dtype=np.uint8)
        payload[:] = (np.arange(n, dtype=np.uint8) % 251)[:, None]
        return {"id": np.asarray(batch["id"], dtype=object), "payload": payload}


class Touch:
    """Reads the first byte of each payload (the payload passes through unchanged); ``delay_s``
    seconds per batch make it a slow operator (0 in this benchmark)."""

    def __init__(self, config: OpConfig, name: str, delay_s: float = 0.0) -> None:
        self.column = f"{name}_first"
        self.delay_s = float(delay_s)

    def __call__(self, batch: Batch) -> Batch:
        if self.delay_s:
            time.sleep(self.delay_s)
        return {**batch, self.column: np.asarray([int(np.asarray(p)[0]) for p in batch["payload"]], dtype=np.int64)}


class Digest:
    """Replaces the payload by a checksum of its first 4 KB (the written output stays small)."""

    def __init__(self, config: OpConfig) -> None:
        pass

    def __call__(self, batch: Batch) -> Batch:
        out = {k: v for k, v in batch.items() if k != "payload"}
        out["checksum"] = np.asarray([zlib.crc32(np.asarray(p)[:4096].tobytes()) for p in batch["payload"]], dtype=np.int64)
        return out


def build_spec(payload_bytes: int, batch_size: int, items: int) -> PipelineSpec:
    config = OpConfig.make("cpu", batch_size=batch_size)

    def source() -> Iterator[dict[str, Any]]:
        return ({"id": f"item-{k:06d}"} for k in range(items))

    ops = (OperatorSpec("make", Make, config, params={"payload_bytes": payload_bytes}),
           OperatorSpec("touch1", Touch, config, params={"name": "touch1"}),
           OperatorSpec("touch2", Touch, config, params={"name": "touch2"}),
           OperatorSpec("digest", Digest, config))
    return PipelineSpec("dataplane", ops, source, items)


def run_runtime(spec: PipelineSpec, out: Path) -> dict[str, float]:
    """Items/s and the runner's figures for one run on this runtime."""
    start = time.perf_counter()
    handle = start_runner(spec, out, name=f"dataplane-{uuid.uuid4().hex[:6]}", namespace="bench", settings=RunnerSettings())
    at_start = ray.get(handle.summary.remote())["runner"]
    summary = ray.get(handle.wait.remote(None))
    wall = time.perf_counter() - start
    ray.get(handle.stop.remote())
    ray.kill(handle)
    acc = account(out)
    if summary["error"] or acc.items_written != spec.items or acc.duplicate_ids:
        raise RuntimeError(f"runtime run lost or duplicated items: {acc} {summary['error']}")
    runner = summary["runner"]
    n = spec.items or 1
    return {"items_per_s": n / wall, "runner_bytes_per_item": runner["bytes_serialised"] / n,
            "runner_cpu_s_per_1000_items": 1000 * (runner["cpu_s"] - at_start["cpu_s"]) / n,
            "runner_peak_rss_mb": runner["peak_rss_bytes"] / MB, "bytes_from_other_nodes_per_item": runner["bytes_from_other_nodes"] / n}


def _compare(label: str, quick: bool, repeats: int, work: Path) -> dict[str, Any]:
    """Every payload size, alternating which system goes first per repeat."""
    results: dict[str, Any] = {}
    for size, (payload_bytes, batch, items, quick_items) in SIZES.items():
        spec = build_spec(payload_bytes, batch, quick_items if quick else items)
        runtime: list[dict[str, float]] = []
        ray_data: list[float] = []
        for rep in range(repeats):
            for system in (("runtime", "ray_data") if rep % 2 == 0 else ("ray_data", "runtime")):
                out = work / f"{label}-{size}-{system}-{rep}"
                if system == "runtime":
                    runtime.append(run_runtime(spec, out))
                else:
                    ray_data.append(spec.items / run_ray_data(spec, out))
                shutil.rmtree(out, ignore_errors=True)
        med = lambda key, runtime=runtime: statistics.median(r[key] for r in runtime)  # noqa: E731
        results[size] = {"items": spec.items, "batch_size": batch, "runtime_runs": runtime, "ray_data_items_per_s": ray_data,
                         "runtime_items_per_s": med("items_per_s"), "ray_data_items_per_s_median": statistics.median(ray_data),
                         "ratio_vs_ray_data": med("items_per_s") / statistics.median(ray_data),
                         "runner_bytes_per_item": max(r["runner_bytes_per_item"] for r in runtime),
                         "runner_cpu_s_per_1000_items": med("runner_cpu_s_per_1000_items"),
                         "runner_peak_rss_mb": max(r["runner_peak_rss_mb"] for r in runtime),
                         "bytes_from_other_nodes_per_item": med("bytes_from_other_nodes_per_item")}
        print(f"dataplane {label} {size}: {results[size]['runtime_items_per_s']:.1f} items/s vs Ray Data "
              f"{results[size]['ray_data_items_per_s_median']:.1f}; runner {results[size]['runner_bytes_per_item']:.0f} B/item", flush=True)
    return results


def _on_one_node(quick: bool, repeats: int, work: Path) -> dict[str, Any]:
    start_local_ray(3 * NODE_CPUS, 0, attempts=3)
    try:
        _quiet_ray_data()
        return _compare("1node", quick, repeats, work)
    finally:
        ray.shutdown()


def _on_three_nodes(quick: bool, repeats: int, work: Path) -> tuple[dict[str, Any] | None, str]:
    """The comparison on a local 3-node cluster; (None, why) when the cluster does not start."""
    from ray.cluster_utils import Cluster

    node = {"num_cpus": NODE_CPUS, "memory": 2 * GiB, "object_store_memory": OBJECT_STORE_BYTES}
    try:
        cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
        for _ in range(2):
            cluster.add_node(**node)
        cluster.wait_for_nodes()
        cluster.connect()
    except Exception as exc:  # noqa: BLE001 - reported in the result as not measured, with the reason
        return None, f"the 3-node cluster did not start: {type(exc).__name__}: {exc}"
    try:
        _quiet_ray_data()
        return _compare("3nodes", quick, repeats, work), ""
    finally:
        ray.shutdown()
        cluster.shutdown()


def _quiet_ray_data() -> None:
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)


def _figure(raw: dict[str, Any]) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layouts = [k for k in ("1node", "3nodes") if raw.get(k)]
    fig, axes = plt.subplots(1, len(layouts) + 1, figsize=(4.2 * (len(layouts) + 1), 3.6))
    sizes = list(SIZES)
    x = np.arange(len(sizes))
    for ax, layout in zip(axes, layouts):
        res = raw[layout]
        ax.bar(x - 0.2, [res[s]["runtime_items_per_s"] for s in sizes], 0.4, label="trident-flows runtime")
        ax.bar(x + 0.2, [res[s]["ray_data_items_per_s_median"] for s in sizes], 0.4, label="plain Ray Data")
        ax.set_xticks(x, sizes)
        ax.set_yscale("log")
        ax.set_ylabel("items / s (median)")
        ax.set_title(layout)
        ax.legend(fontsize=7)
    ax = axes[-1]
    for layout in layouts:
        ax.plot(sizes, [raw[layout][s]["runner_bytes_per_item"] for s in sizes], "o-", label=layout)
    ax.axhline(KB, color="grey", ls=":", label="target 1 KB")
    ax.set_yscale("log")
    ax.set_ylabel("bytes the runner serialised / item")
    ax.set_xlabel("payload per item")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def run(quick: bool = False) -> BenchResult:
    repeats = 1 if quick else 3
    if ray.is_initialized():
        raise RuntimeError("bench dataplane starts its own Ray clusters (one node, then three); run it without a connected Ray")
    work = Path(tempfile.mkdtemp(prefix="trident-dataplane-"))
    try:
        one = _on_one_node(quick, repeats, work)
        three, why = _on_three_nodes(quick, repeats, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    raw = {"1node": one, "3nodes": three, "sizes": {k: v[0] for k, v in SIZES.items()}, "repeats": repeats, "node_cpus": NODE_CPUS,
           "ray_version": ray.__version__}
    layouts = [r for r in (one, three) if r]
    summary = {"runner_bytes_per_item_max": max(r[s]["runner_bytes_per_item"] for r in layouts for s in SIZES),
               "ratio_vs_ray_data_8mb_1node": one["8mb"]["ratio_vs_ray_data"],
               "ratio_vs_ray_data_8mb_3nodes": three["8mb"]["ratio_vs_ray_data"] if three else float("nan")}
    for label, res in (("1node", one), ("3nodes", three)):
        for size in SIZES if res else ():
            summary[f"ratio_vs_ray_data_{size}_{label}"] = res[size]["ratio_vs_ray_data"]
            summary[f"runner_bytes_per_item_{size}_{label}"] = res[size]["runner_bytes_per_item"]
            summary[f"bytes_from_other_nodes_per_item_{size}_{label}"] = res[size]["bytes_from_other_nodes_per_item"]
            summary[f"runner_cpu_s_per_1000_items_{size}_{label}"] = res[size]["runner_cpu_s_per_1000_items"]
            summary[f"runner_peak_rss_mb_{size}_{label}"] = res[size]["runner_peak_rss_mb"]
    targets = {"runner_bytes_per_item_max": Target("<=", KB), "ratio_vs_ray_data_8mb_1node": Target(">=", 0.95),
               "ratio_vs_ray_data_8mb_3nodes": Target(">=", 0.95)}
    notes = (f"Four trivial operators, one replica of 1 CPU each, {NODE_CPUS * 3} CPUs on one node or {NODE_CPUS} on each of three "
             f"(one raylet each, same machine); batch sizes {({k: v[1] for k, v in SIZES.items()})}; medians over {repeats} "
             "alternating repeats. Runner bytes: what Ray's serialiser writes for every argument the runner sends replicas and "
             "the sink writer (references included) and every reply it gets back (runtime.wire); Ray's per-call envelope is not "
             "counted. A batch under Ray's 100 KiB inline limit is stored with zeros up to it (runtime.payload.stored), so no output "
             "batch returns inline to the runner; bytes from other nodes count each stored object read from another node once."
             + (f" 3 nodes: not measured ({why})." if why else ""))
    return BenchResult("dataplane", summary, targets, raw, _figure(raw), notes)
