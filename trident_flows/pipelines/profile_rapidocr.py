"""Measure the ``ocr`` operator with RapidOCR and write ``profiles/documents-rapidocr.json``.

Contract of ``main(quick=, out=, console=) -> Path`` (``trident-flows profile documents-rapidocr``):
- The committed ``documents`` profile with its ``ocr`` operator re-measured under
  ``--quality ocr.engine=rapidocr`` as ``profile_documents`` measures operators (fresh process,
  single-threaded onnxruntime, batches of several sizes from every regime; seconds fitted on CPU
  seconds per batch and scanned page, memory on peak RSS growth).
- GPU: measured when onnxruntime has a CUDA provider; otherwise DERIVED: the measured model-forward
  share divided by ``GPU_FORWARD_SPEEDUP`` (the video profile's assumption for the same PP-OCRv4
  model) plus the host-side rest at CPU cost; resident bytes the three model files; cold start +
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
from trident_flows.pipelines.profile_documents import FEATURES, FULL, GPU_CONTEXT_S_ASSUMED, QUICK, REGIMES, _cost, _measure, measured_here
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
    """The GPU cost derived from the CPU fit (see the module docstring)."""
    scale = (1.0 - forward_share) + forward_share / GPU_FORWARD_SPEEDUP
    return DeviceCost(per_batch_s=cpu.per_batch_s * scale, per_item_s=cpu.per_item_s * scale,
                      per_unit_s={f: c * scale for f, c in cpu.per_unit_s.items()}, resident_bytes=resident_bytes,
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
    with tempfile.TemporaryDirectory(prefix="trident-profile-") as tmp:
        corpus_dir = Path(tmp) / "corpus"
        console.print(f"generating the profiling corpus ({settings.corpus}) ...")
        manifest = generate(corpus_dir, n=sum(int(p.split(":")[1]) for p in settings.corpus.split(",")), regimes=settings.corpus,
                            duplicates=0.1, broken=0.05, seed=0)
        inputs = _ocr_inputs(corpus_dir, manifest)
        costs, fits, infos = {}, {}, {}
        for device in [CPU] + ([GPU] if cuda else []):
            console.print(f"measuring ocr (RapidOCR) on {device} ...")
            with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:  # a fresh process: its own cold start
                infos[device] = pool.submit(_measure, "ocr", device, inputs, settings.batch_sizes["ocr"], settings.long_cap,
                                            settings.repeats, RAPIDOCR).result()
            costs[device], fits[f"ocr/{device}"] = _cost(infos[device], FEATURES["ocr"])
    samples = infos[CPU]["samples"]
    wall = sum(s["wall_s"] for s in samples)
    forward_share = sum(s["forward_wall_s"] for s in samples) / wall if wall > 0 else 0.0
    notes = [f"engine RapidOCR (rapidocr-onnxruntime, PP-OCRv4 det + rec, angle classifier), one onnxruntime thread; "
             f"model forwards are {forward_share:.0%} of its measured wall time",
             f"seconds fitted on CPU seconds of one single-threaded replica; R^2 {fits['ocr/cpu']}",
             "measured at dpi=150, rec_batch=6 (the defaults); other values are not modelled"]
    if not cuda:
        costs[GPU] = derived_gpu(costs[CPU], forward_share, model_bytes())
        notes.insert(0, f"gpu entry NOT measured (no CUDA on the profiling machine): derived from the CPU fit, the "
                        f"model-forward share ({forward_share:.0%}) divided by an assumed {GPU_FORWARD_SPEEDUP:g}x speed-up and "
                        f"the host-side rest kept, +{GPU_CONTEXT_S_ASSUMED:g} s cold start for the CUDA context, resident bytes = "
                        f"the three model files ({model_bytes()}); working-set bytes per page as measured on CPU")
    ocr = replace(base.operator("ocr"), devices=costs, notes="; ".join(notes))
    measured_on = {
        **{k: v for k, v in base.measured_on.items() if k not in ("what", "gpu", "fit", "date", "machine")},
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
    }
    profile = PipelineProfile(PROFILE_NAME, tuple(ocr if op.name == "ocr" else op for op in base.operators), measured_on,
                              base.workloads)
    return profile.save(out)
