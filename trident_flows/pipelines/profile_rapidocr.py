"""Measure the ``ocr`` operator with RapidOCR and write ``profiles/documents-rapidocr.json``.

Contract of ``main(quick=, out=, console=) -> Path`` (``trident-flows profile documents-rapidocr``):
- The committed ``documents`` profile with its ``ocr`` operator re-measured under
  ``--quality ocr.engine=rapidocr`` as ``profile_documents`` measures operators (fresh process,
  single-threaded onnxruntime, batches of several sizes from every regime; CPU seconds fitted by
  page type: a born-digital page costs what skipping OCR costs, a scanned page that plus its OCR;
  memory on peak RSS growth).
- ``measured_on`` records the machine, the load before and during the run, the corpus by regime,
  and in ``entries`` the documents profile's entries with ``ocr/*`` replaced by this measurement.
- GPU: measured when onnxruntime has a CUDA provider; otherwise DERIVED: a scanned page's OCR with
  its measured model-forward share divided by ``GPU_FORWARD_SPEEDUP`` (the video profile's
  assumption for the same PP-OCRv4 model) and the host-side rest at CPU cost, skipping (per batch,
  per born-digital page) at CPU cost; resident bytes the three model files; cold start +
  ``GPU_CONTEXT_S_ASSUMED``. The entry's ``notes`` and ``measured_on`` say so.
"""

from __future__ import annotations

import multiprocessing as mp
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

from trident_flows.core.types import CPU, GPU
from trident_flows.pipelines.doc_ocr import RAPIDOCR
from trident_flows.pipelines.profile_documents import (
    FEATURES,
    FULL,
    GPU_CONTEXT_S_ASSUMED,
    QUICK,
    REGIMES,
    _cost,
    _measure,
    corpus_record,
    page_type_seconds,
)
from trident_flows.pipelines.profile_measure import LoadWatch, entry_record, measured_here, run_load, warn_if_loaded
from trident_flows.pipelines.profile_video import GPU_FORWARD_SPEEDUP
from trident_flows.runtime.costmodel import DeviceCost, PipelineProfile
from trident_flows.runtime.spec import DROP, ERROR, rows_to_batch

PROFILE_NAME = "documents-rapidocr"


def model_bytes() -> int:
    """Bytes of the three ONNX models RapidOCR loads (detection, angle classifier, recognition)."""
    import rapidocr_onnxruntime

    models = Path(rapidocr_onnxruntime.__file__).parent / "models"
    return sum(p.stat().st_size for p in models.glob("*.onnx"))


def _ocr_inputs(corpus_dir: Path, manifest) -> dict[str, list[dict]]:
    """OCR's input rows by regime: the corpus parsed by the real ``parse`` operator, unmarked rows only."""
    from trident_flows.pipelines.documents import operator_specs

    parse = operator_specs("profile")[0].build()
    batch = parse(rows_to_batch([{"id": r.id, "path": str(corpus_dir / r.path), DROP: "", ERROR: ""} for r in manifest.itertuples()]))
    regime_of = dict(zip(manifest.id, manifest.regime))
    live = [i for i in range(len(batch["id"])) if not batch[DROP][i] and not batch[ERROR][i]]
    return {r: [{k: v[i] for k, v in batch.items()} for i in live if regime_of[batch["id"][i]] == r] for r in REGIMES}


def derived_gpu(cpu: DeviceCost, forward_share: float, resident_bytes: int) -> DeviceCost:
    """The GPU cost derived from the CPU fit (see the module docstring): only the scanned pages' OCR speeds up."""
    scale = (1.0 - forward_share) + forward_share / GPU_FORWARD_SPEEDUP
    return DeviceCost(per_batch_s=cpu.per_batch_s, per_item_s=cpu.per_item_s,
                      per_unit_s={f: c * scale if f == "scanned_pages" else c for f, c in cpu.per_unit_s.items()},
                      resident_bytes=resident_bytes,
                      per_item_bytes=cpu.per_item_bytes, per_unit_bytes=dict(cpu.per_unit_bytes),
                      cold_start_s=cpu.cold_start_s + GPU_CONTEXT_S_ASSUMED)


def main(*, quick: bool, out: Path | None, console) -> Path:
    """Profile the ``ocr`` operator with RapidOCR and write the ``documents-rapidocr`` profile; returns its path."""
    import onnxruntime as ort

    from trident_flows.pipelines.synth_documents import generate

    settings = QUICK if quick else FULL
    base = PipelineProfile.load("documents")
    cuda = "CUDAExecutionProvider" in ort.get_available_providers()
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="trident-profile-") as tmp, LoadWatch() as run_watch:
        warn_if_loaded(run_watch, console)
        corpus_dir = Path(tmp) / "corpus"
        console.print(f"generating the profiling corpus ({settings.corpus}) ...")
        manifest = generate(corpus_dir, n=sum(int(p.split(":")[1]) for p in settings.corpus.split(",")), regimes=settings.corpus,
                            duplicates=0.1, broken=0.05, seed=0)
        inputs = _ocr_inputs(corpus_dir, manifest)
        costs, fits, infos, entries = {}, {}, {}, {}
        for device in [CPU] + ([GPU] if cuda else []):
            console.print(f"measuring ocr (RapidOCR) on {device} ...")
            # a fresh process: its own cold start
            with LoadWatch() as watch, ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
                infos[device] = pool.submit(_measure, "ocr", device, inputs, settings.batch_sizes["ocr"], settings.long_cap,
                                            settings.repeats, RAPIDOCR).result()
            costs[device], fits[f"ocr/{device}"] = _cost(infos[device], FEATURES["ocr"])
            entries[f"ocr/{device}"] = entry_record(watch, infos[device]["samples"])
    scanned = [s for s in infos[CPU]["samples"] if s["features"].get("scanned_pages", 0) > 0]
    wall = sum(s["wall_s"] for s in scanned)
    forward_share = sum(s["forward_wall_s"] for s in scanned) / wall if wall > 0 else 0.0
    by_page = page_type_seconds(costs[CPU])
    notes = [f"engine RapidOCR (rapidocr-onnxruntime, PP-OCRv4 det + rec, angle classifier), one onnxruntime thread; "
             f"model forwards are {forward_share:.0%} of its measured wall time on batches with scanned pages",
             f"seconds fitted on CPU seconds of one single-threaded replica by page type; on CPU {by_page} (a born-digital "
             f"page costs what skipping OCR costs); R^2 {fits['ocr/cpu']}",
             "measured at dpi=150, rec_batch=6 (the defaults); other values are not modelled"]
    if not cuda:
        costs[GPU] = derived_gpu(costs[CPU], forward_share, model_bytes())
        notes.insert(0, f"gpu entry NOT measured (no CUDA on the profiling machine): derived from the CPU fit, a scanned page's "
                        f"model-forward share ({forward_share:.0%}) divided by an assumed {GPU_FORWARD_SPEEDUP:g}x speed-up and "
                        f"the host-side rest kept, skipping (per batch, per born-digital page) at CPU cost, "
                        f"+{GPU_CONTEXT_S_ASSUMED:g} s cold start for the CUDA context, resident bytes = "
                        f"the three model files ({model_bytes()}); working-set bytes per page as measured on CPU")
    ocr = replace(base.operator("ocr"), devices=costs, features=FEATURES["ocr"], notes="; ".join(notes))
    measured_on = {
        **{k: v for k, v in base.measured_on.items() if k not in ("what", "gpu", "fit", "date", "machine", "load", "corpus",
                                                                   "entries", "ocr_seconds_by_page_type")},
        **measured_here(),
        "what": (f"the documents profile (measured {base.measured_on.get('date')}) with its ocr operator re-measured with "
                 f"RapidOCR on a synthetic corpus {settings.corpus} (seed 0), batch sizes {settings.batch_sizes['ocr']}, "
                 f"{settings.repeats} repeat(s), {'quick' if quick else 'full'} profile, {time.time() - started:.0f} s"),
        "cuda": cuda,
        "gpu": ("ocr measured on CUDA" if cuda else
                f"NOT measured: no CUDA; ocr gpu entry derived from CPU (model forwards {forward_share:.0%} of its time, "
                f"assumed {GPU_FORWARD_SPEEDUP:g}x faster on a GPU); embed gpu entry as in the documents profile (derived)"),
        "fit": {**base.measured_on.get("fit", {}), **fits},
        "ocr_forward_share": round(forward_share, 4),
        "load": run_load(run_watch),
        "corpus": corpus_record(manifest),
        "entries": {**{k: v for k, v in base.measured_on.get("entries", {}).items() if not k.startswith("ocr/")}, **entries},
        "ocr_seconds_by_page_type": {device: page_type_seconds(cost) for device, cost in costs.items()},
    }
    profile = PipelineProfile(PROFILE_NAME, tuple(ocr if op.name == "ocr" else op for op in base.operators), measured_on,
                              base.workloads)
    return profile.save(out)
