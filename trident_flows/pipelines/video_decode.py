"""Decoding videos: the ``decode`` operator (Decode) of the video pipeline.

Contract (operator shape and row marks as in ``runtime.spec``):
- ``Decode`` takes one row per video file (``id``, ``path``), decodes it with PyAV and keeps frames
  sampled at ``sample_fps``, downscaled so the long side is at most ``max_side`` px, in
  ``FRAME_COLUMNS`` (``decode_sampled``); nothing decodes twice. Its workload features are the
  source's ``pixels``, ``frames``, ``duration_s``, ``frame_pixels`` (width x height) and
  ``sampled_source_pixels`` (the source pixels of the frames it samples, each converted to RGB and
  downscaled), read from the header (``probe``; the sampled frames then ``sampled_count``).
- A file that cannot be decoded (truncated, not a video container, a still image, no video stream,
  no frames) gets ``_error = "broken video: <reason>"`` (``BrokenVideo``); so does a stream with
  damaged data (FFmpeg's ``err_detect=explode``: a frame flagged corrupt stops the decode rather than
  being concealed). Nothing raises.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from trident_flows.core.types import OpConfig
from trident_flows.pipelines.quality import QualityKnob, quality_settings, stamp
from trident_flows.pipelines.video_rows import EMPTY_FRAMES, ensure_marks, marks, objects
from trident_flows.runtime.spec import ERROR, Batch, batch_len

VIDEO_SUFFIXES = (".mp4", ".mov", ".mkv", ".webm", ".avi", ".m4v")


class BrokenVideo(Exception):
    """A file that is not a decodable video; its message is the dead-letter reason."""


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


def sampled_count(duration_s: float, sample_fps: float) -> int:
    """Frames ``decode_sampled`` keeps of a video of ``duration_s`` seconds: one per ``1/sample_fps`` s from 0."""
    return max(1, math.ceil(duration_s * sample_fps - 1e-9)) if duration_s > 0 else 0


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
        batch = ensure_marks(dict(batch))
        n = batch_len(batch)
        cols: dict[str, list[Any]] = {k: [] for k in ("frames", "frame_times", "width", "height", "fps", "src_frames", "duration_s")}
        errors = list(batch[ERROR])
        marked = marks(batch)
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
        batch[ERROR] = objects(errors)
        stamp(batch, "decode", self.quality, np.flatnonzero(~marked))
        batch["frames"], batch["frame_times"] = objects(cols["frames"]), objects(cols["frame_times"])
        for k, dtype in (("width", np.int64), ("height", np.int64), ("fps", np.float64), ("src_frames", np.int64), ("duration_s", np.float64)):
            batch[k] = np.asarray(cols[k], dtype=dtype)
        return batch

    def workload_features(self, batch: Batch) -> dict[str, float]:
        """Decoded source pixels, source frames, seconds, pixels per frame and source pixels of the sampled frames (from
        the headers when not decoded yet)."""
        pixels = frames = duration = frame_pixels = sampled_pixels = 0.0
        live = ~marks(batch)
        for i in np.flatnonzero(live):
            if "src_frames" in batch:
                meta = {"width": batch["width"][i], "height": batch["height"][i], "frames": batch["src_frames"][i],
                        "duration_s": batch["duration_s"][i], "sampled": len(batch["frames"][i])}
            else:
                meta = probe(batch["path"][i])
                meta["sampled"] = sampled_count(float(meta["duration_s"]), self.sample_fps)
            size = float(meta["width"]) * float(meta["height"])
            pixels += size * float(meta["frames"])
            frames += float(meta["frames"])
            duration += float(meta["duration_s"])
            frame_pixels += size
            sampled_pixels += size * float(meta["sampled"])
        return {"pixels": pixels, "frames": frames, "duration_s": duration, "frame_pixels": frame_pixels,
                "sampled_source_pixels": sampled_pixels}
