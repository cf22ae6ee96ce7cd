"""The video pipeline's clip operators: ``scenes`` (Scenes), ``motion`` (Motion), ``dedup_frames`` (DedupFrames).

Contract (operator shape and row marks as in ``runtime.spec``):
- ``Scenes`` is the splitter: PySceneDetect's ``ContentDetector`` over the sampled frames finds hard
  cuts; each video row becomes one row per clip with ``id = f"{video_id}/{k}"``, ``source_id``,
  ``clip_start_s`` / ``clip_end_s`` and that clip's frames. Marked rows pass through with
  ``source_id`` set.
- ``Motion``: ``motion``, the mean Farneback optical-flow magnitude between consecutive sampled frames
  (OpenCV), in frame widths per second.
- ``DedupFrames``: drops frames whose pHash (imagehash) is within ``max_distance`` bits of a kept
  frame of the same clip, so the model operators see fewer frames.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trident_flows.core.types import OpConfig
from trident_flows.pipelines.quality import QualityKnob, quality_settings, stamp
from trident_flows.pipelines.video_rows import ensure_marks, frame_features, marks, objects
from trident_flows.runtime.spec import ID, SOURCE_ID, Batch, batch_len


class Scenes:
    """Split each video into clips at the hard cuts ContentDetector finds in its sampled frames."""

    QUALITY_KNOBS = (QualityKnob("threshold", 27.0, "ContentDetector score from which a frame starts a new clip", 1.0, 255.0),)
    EXECUTION_KNOBS: tuple[str, ...] = ()

    def __init__(self, config: OpConfig, **params: Any) -> None:
        self.quality = quality_settings("scenes", Scenes, config, params)
        self.threshold = float(self.quality["threshold"])

    def cuts(self, frames: np.ndarray, sample_fps: float) -> list[int]:
        """Indices of the sampled frames that start a new scene."""
        from scenedetect import FrameTimecode
        from scenedetect.detector import FlashFilter
        from scenedetect.detectors import ContentDetector

        detector = ContentDetector(threshold=self.threshold, min_scene_len=1, filter_mode=FlashFilter.Mode.SUPPRESS)
        found: list[int] = []
        for k, frame in enumerate(frames):
            hits = detector.process_frame(FrameTimecode(k, fps=sample_fps), np.ascontiguousarray(frame[..., ::-1]))
            found.extend(tc.frame_num for tc in hits)
        return sorted({k for k in found if 0 < k < len(frames)})

    def __call__(self, batch: Batch) -> Batch:
        batch = ensure_marks(dict(batch))
        marked = marks(batch)
        stamp(batch, "scenes", self.quality, np.flatnonzero(~marked))  # before the split: every clip inherits it
        rows: list[dict[str, Any]] = []
        for i in range(batch_len(batch)):
            row = {k: v[i] for k, v in batch.items()}
            vid = str(row[ID])
            if marked[i]:
                rows.append({**row, SOURCE_ID: row.get(SOURCE_ID) or vid, "clip_index": -1, "clip_start_s": 0.0, "clip_end_s": 0.0})
                continue
            frames, times = row["frames"], row["frame_times"]
            sample_fps = 1.0 / float(np.median(np.diff(times))) if len(times) > 1 else 1.0
            bounds = [0, *self.cuts(frames, sample_fps), len(frames)]
            for k in range(len(bounds) - 1):
                a, b = bounds[k], bounds[k + 1]
                end = float(times[b]) if b < len(times) else float(row["duration_s"])
                rows.append({**row, ID: f"{vid}/{k}", SOURCE_ID: vid, "clip_index": k, "clip_start_s": float(times[a]), "clip_end_s": end,
                             "frames": frames[a:b], "frame_times": times[a:b]})
        return _rows_to_batch(rows, batch)

    @staticmethod
    def workload_features(batch: Batch) -> dict[str, float]:
        return frame_features(batch, "sampled")


def _rows_to_batch(rows: list[dict[str, Any]], like: Batch) -> Batch:
    """Column-stack rows, keeping numeric columns numeric and the rest as object arrays."""
    keys = list(dict.fromkeys([*like.keys(), *(k for r in rows for k in r)]))
    out: Batch = {}
    for k in keys:
        values = [r.get(k) for r in rows]
        if k in like and like[k].dtype != object and all(v is not None for v in values):
            out[k] = np.asarray(values, dtype=like[k].dtype)
        elif values and all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) for v in values):
            out[k] = np.asarray(values)
        else:
            out[k] = objects(values)
    return out


class Motion:
    """Mean optical-flow magnitude (frame widths per second) between consecutive sampled frames."""

    QUALITY_KNOBS = (QualityKnob("flow_width", 160, "width in pixels the optical flow is computed at", 16, 4096),)
    EXECUTION_KNOBS: tuple[str, ...] = ()

    def __init__(self, config: OpConfig, **params: Any) -> None:
        self.quality = quality_settings("motion", Motion, config, params)
        self.flow_width = int(self.quality["flow_width"])

    def score(self, frames: np.ndarray, times: np.ndarray) -> float:
        import cv2

        if len(frames) < 2:
            return 0.0
        h, w = frames.shape[1:3]
        size = (self.flow_width, max(2, int(round(h * self.flow_width / w))))
        grays = [cv2.cvtColor(cv2.resize(f, size, interpolation=cv2.INTER_AREA), cv2.COLOR_RGB2GRAY) for f in frames]
        rates = []
        for k in range(1, len(grays)):
            flow = cv2.calcOpticalFlowFarneback(grays[k - 1], grays[k], None, 0.5, 3, 15, 3, 5, 1.2, 0)
            dt = max(float(times[k] - times[k - 1]), 1e-3)
            rates.append(float(np.linalg.norm(flow, axis=2).mean()) / size[0] / dt)
        return float(np.mean(rates))

    @staticmethod
    def workload_features(batch: Batch) -> dict[str, float]:
        return frame_features(batch, "clip")

    def __call__(self, batch: Batch) -> Batch:
        batch = ensure_marks(dict(batch))
        marked = marks(batch)
        batch["motion"] = np.array([0.0 if marked[i] else self.score(batch["frames"][i], batch["frame_times"][i]) for i in range(batch_len(batch))])
        stamp(batch, "motion", self.quality, np.flatnonzero(~marked))
        return batch


class DedupFrames:
    """Drop near-duplicate frames of a clip (pHash within ``max_distance`` bits of a kept frame)."""

    QUALITY_KNOBS = (QualityKnob("max_distance", 6, "pHash bits within which a frame is a duplicate of a kept one", 0, 64),)
    EXECUTION_KNOBS: tuple[str, ...] = ()

    def __init__(self, config: OpConfig, **params: Any) -> None:
        self.quality = quality_settings("dedup_frames", DedupFrames, config, params)
        self.max_distance = int(self.quality["max_distance"])

    def keep(self, frames: np.ndarray) -> list[int]:
        import imagehash
        from PIL import Image

        kept: list[int] = []
        hashes: list[Any] = []
        for k, frame in enumerate(frames):
            h = imagehash.phash(Image.fromarray(frame))
            if all(h - other > self.max_distance for other in hashes):
                kept.append(k)
                hashes.append(h)
        return kept

    def __call__(self, batch: Batch) -> Batch:
        batch = ensure_marks(dict(batch))
        marked = marks(batch)
        frames, times, sampled = list(batch["frames"]), list(batch["frame_times"]), []
        for i in range(batch_len(batch)):
            sampled.append(len(frames[i]))
            if not marked[i] and len(frames[i]):
                idx = self.keep(frames[i])
                frames[i], times[i] = frames[i][idx], times[i][idx]
        batch["frames"], batch["frame_times"] = objects(frames), objects(times)
        batch["frames_sampled"] = np.asarray(sampled, dtype=np.int64)
        batch["frames_kept"] = np.asarray([len(f) for f in frames], dtype=np.int64)
        stamp(batch, "dedup_frames", self.quality, np.flatnonzero(~marked))
        return batch

    @staticmethod
    def workload_features(batch: Batch) -> dict[str, float]:
        return frame_features(batch, "clip")
