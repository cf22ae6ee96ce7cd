"""What a plan is for: a pipeline's cost models and the mix of items the corpus holds.

Contract:
- ``PlanWorkload``: a ``PipelineProfile`` whose ``workloads`` (regime -> mean input item) describe
  this corpus, each regime's share (``weights``) and a ``source`` line saying where they come from.
- ``from_regimes(pipeline, text)``: ``"short:500,scans:500"`` over the committed profile.
- ``from_sample(directory)``: features measured on a corpus sample by the pipeline's own first step
  (``ParsePdf``, the video ``probe``); what it cannot see comes from the profile, scaled, as the
  ``source`` line says; each item joins its nearest profile regime. A directory with no readable
  PDF or video is refused.
- ``mean_features()``: the mix's mean input item; ``regime_features(r)``: one regime alone.
- ``schedule(block)``: a regime schedule with the mix's proportions in blocks of about ``block``
  items (the simulator's input).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping

from trident_flows.planning.catalogue import PlanningError
from trident_flows.runtime.costmodel import PipelineProfile

PIPELINES = {"documents": "documents", "video": "video"}  # planner pipeline name -> profile name
SIM_PIPELINES = {"documents": "emulated-docs", "video": "emulated-video"}
PDF_SUFFIXES = (".pdf",)
VIDEO_SUFFIXES = (".mp4", ".mkv", ".mov", ".webm", ".avi")
_PARSE_BATCH = 16
# a video's sampled-frame features scale with its seconds; its per-clip features do not (a clip is a scene)
_VIDEO_PER_SECOND = ("sampled_frames", "sampled_pixels")


@dataclass(frozen=True)
class PlanWorkload:
    pipeline: str
    profile: PipelineProfile
    weights: Mapping[str, float]
    source: str

    def mean_features(self) -> dict[str, float]:
        total = sum(self.weights.values())
        out: dict[str, float] = {}
        for regime, w in self.weights.items():
            for f, v in self.profile.workloads[regime].items():
                out[f] = out.get(f, 0.0) + v * w / total
        return out

    def regime_features(self, regime: str) -> dict[str, float]:
        return dict(self.profile.workloads[regime])

    def worst_features(self) -> dict[str, float]:
        """Per feature, the largest regime mean (memory is checked at it)."""
        names = {f for r in self.weights for f in self.profile.workloads[r]}
        return {f: max(float(self.profile.workloads[r].get(f, 0.0)) for r in self.weights) for f in names}

    def schedule(self, block: int = 50) -> str:
        total = sum(self.weights.values())
        return ",".join(f"{r}:{max(1, round(block * len(self.weights) * w / total))}" for r, w in self.weights.items())

    def describe(self) -> str:
        total = sum(self.weights.values())
        mix = ", ".join(f"{r} {100 * w / total:.0f}%" for r, w in self.weights.items())
        return f"{self.pipeline}: {mix} ({self.source})"


def _check_pipeline(pipeline: str) -> PipelineProfile:
    if pipeline not in PIPELINES:
        raise PlanningError(f"unknown pipeline {pipeline!r}: choose one of {', '.join(PIPELINES)}")
    return PipelineProfile.load(PIPELINES[pipeline])


def from_regimes(pipeline: str, text: str) -> PlanWorkload:
    """A regime mix such as ``short:500,scans:500`` over the committed profile (see the module docstring)."""
    profile = _check_pipeline(pipeline)
    weights: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, amount = part.partition(":")
        try:
            count = float(amount) if sep else 1.0
        except ValueError:
            count = -1.0
        if count <= 0 or not math.isfinite(count):
            raise PlanningError(f"--regimes {text!r}: {part!r} is not REGIME:ITEMS with ITEMS > 0; write e.g. short:500,scans:500")
        if name.strip() not in profile.workloads:
            raise PlanningError(f"--regimes {text!r}: unknown regime {name.strip()!r}; the {pipeline} profile has "
                                f"{', '.join(sorted(profile.workloads))}")
        weights[name.strip()] = weights.get(name.strip(), 0.0) + count
    if not weights:
        raise PlanningError(f"--regimes {text!r} names no regime; write e.g. short:500,scans:500")
    return PlanWorkload(pipeline, profile, weights, f"regime means of the committed {profile.name} profile")


def _nearest(profile: PipelineProfile, item: Mapping[str, float], keys: tuple[str, ...]) -> str:
    def distance(regime: str) -> float:
        mean = profile.workloads[regime]
        return sum((math.log1p(float(item.get(k, 0.0))) - math.log1p(float(mean.get(k, 0.0)))) ** 2 for k in keys)
    return min(sorted(profile.workloads), key=distance)


def _document_items(files: list[Path], profile: PipelineProfile) -> tuple[list[dict[str, float]], int]:
    """Features of each readable PDF from the real parse step; the number of unreadable ones."""
    from trident_flows.core.types import OpConfig
    from trident_flows.pipelines.doc_embed import chunk_text
    from trident_flows.pipelines.doc_parse import ParsePdf
    from trident_flows.pipelines.documents import operator_specs
    from trident_flows.runtime.spec import DROP, ERROR, rows_to_batch

    params = dict(next(s for s in operator_specs("plan") if s.name == "embed").params)
    chunk_words = int(params.get("chunk_words", 128))
    parse = ParsePdf(OpConfig.make(batch_size=_PARSE_BATCH))
    # text OCR adds per scanned page: characters per page of the profile's most-scanned regime
    scans = max(profile.workloads.values(), key=lambda m: m.get("scanned_pages", 0.0) / max(m.get("pages", 1.0), 1e-9))
    ocr_chars = scans.get("chars", 0.0) / max(scans.get("pages", 1.0), 1e-9)
    words_per_char = 1.0 / 6.0  # only to turn OCR'd characters into chunks: English text averages ~6 characters per word with its space
    items, unreadable = [], 0
    for start in range(0, len(files), _PARSE_BATCH):
        chunk = files[start:start + _PARSE_BATCH]
        out = parse(rows_to_batch([{"id": str(p), "path": str(p), DROP: "", ERROR: ""} for p in chunk]))
        for i in range(len(chunk)):
            if out[ERROR][i]:
                unreadable += 1
                continue
            text = "\n".join(out["page_texts"][i])
            extra = float(out["scanned_pages"][i]) * ocr_chars
            items.append({"pages": float(out["pages"][i]), "scanned_pages": float(out["scanned_pages"][i]),
                          "bytes": float(out["bytes"][i]), "chars": float(len(text)) + extra,
                          "chunks": float(len(chunk_text(text, chunk_words))) + math.ceil(extra * words_per_char / chunk_words)})
    return items, unreadable


def _video_items(files: list[Path], profile: PipelineProfile) -> tuple[list[dict[str, float]], int]:
    """Header features of each readable video from the pipeline's probe (as its ``decode`` reads them); later-stage features
    scaled from its nearest regime."""
    from trident_flows.core.types import OpConfig
    from trident_flows.pipelines.video_decode import Decode, probe
    from trident_flows.runtime.spec import ID, rows_to_batch

    decode = Decode(OpConfig.make())
    items, unreadable = [], 0
    for path in files:
        meta = probe(path)
        if meta["frames"] <= 0 or meta["duration_s"] <= 0:
            unreadable += 1
            continue
        item = decode.workload_features(rows_to_batch([{ID: str(path), "path": str(path)}]))
        regime = profile.workloads[_nearest(profile, item, ("pixels", "frames", "duration_s"))]
        scale = item["duration_s"] / max(regime.get("duration_s", 1.0), 1e-9)
        for f, v in regime.items():
            if f not in item:
                item[f] = v * scale if f in _VIDEO_PER_SECOND else v
        items.append(item)
    return items, unreadable


def from_sample(directory: Path) -> PlanWorkload:
    """Features measured on a sample of the corpus (see the module docstring)."""
    if not directory.is_dir():
        raise PlanningError(f"--sample {directory}: no such directory; give a directory holding a sample of the corpus's PDFs or videos")
    files = sorted(p for p in directory.rglob("*") if p.is_file())
    pdfs = [p for p in files if p.suffix.lower() in PDF_SUFFIXES]
    videos = [p for p in files if p.suffix.lower() in VIDEO_SUFFIXES]
    if not pdfs and not videos:
        raise PlanningError(f"--sample {directory}: no PDF ({', '.join(PDF_SUFFIXES)}) or video ({', '.join(VIDEO_SUFFIXES)}) files in it; "
                            "give a directory holding a sample of the corpus")
    pipeline = "documents" if len(pdfs) >= len(videos) else "video"
    profile = _check_pipeline(pipeline)
    chosen = pdfs if pipeline == "documents" else videos
    items, unreadable = (_document_items if pipeline == "documents" else _video_items)(chosen, profile)
    if not items:
        raise PlanningError(f"--sample {directory}: none of its {len(chosen)} {pipeline} files could be read; give readable files")
    keys = ("pages", "scanned_pages", "chars") if pipeline == "documents" else ("pixels", "frames", "duration_s")
    groups: dict[str, list[dict[str, float]]] = {}
    for item in items:
        groups.setdefault(_nearest(profile, item, keys), []).append(item)
    workloads = {r: {f: sum(i[f] for i in rows) / len(rows) for f in rows[0]} for r, rows in groups.items()}
    how = ("parse step (pypdfium2); OCR'd text of scanned pages estimated from the profile" if pipeline == "documents"
           else "probe (PyAV headers); sampled-frame and clip features scaled from the profile's nearest regime")
    source = f"sample {directory}: {len(items)} files measured by the {how}" + (f"; {unreadable} unreadable" if unreadable else "")
    return PlanWorkload(pipeline, replace(profile, workloads={**profile.workloads, **workloads}),
                        {r: float(len(rows)) for r, rows in groups.items()}, source)
