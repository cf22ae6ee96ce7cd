"""Rows of a video-pipeline batch: marks, frame columns, frame features, ONNX sessions.

Contract:
- ``marks(batch)``: a boolean mask of the rows already marked ``_error`` or ``_drop`` (they skip an
  operator); ``ensure_marks(batch)`` gives a batch both mark columns ("" = unmarked).
- ``FRAME_COLUMNS`` hold a row's sampled frames (one ``uint8`` array ``(n, h, w, 3)`` RGB) and their
  times; ``EMPTY_FRAMES`` stands for none. ``frame_features(batch, level)``: ``{level}_frames``,
  ``{level}_pixels`` (and ``clip_s`` for clips) summed over the live rows.
- ``onnx_session(model_path, config, op)``: an onnxruntime session with ``config.cpus`` threads, on
  CUDA when ``config.device == "gpu"`` and CUDA is present, else on CPU (logged).
  ``objects(values)`` is a 1-D object array of ``values``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from trident_flows.core.types import GPU, OpConfig
from trident_flows.runtime.spec import DROP, ERROR, Batch, batch_len

log = logging.getLogger(__name__)


FRAME_COLUMNS = ("frames", "frame_times")
EMPTY_FRAMES = np.zeros((0, 1, 1, 3), dtype=np.uint8)


def objects(values: list[Any]) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    return arr


def marks(batch: Batch) -> np.ndarray:
    """Boolean mask of rows already marked ``_error`` or ``_drop`` (they skip this operator)."""
    n = batch_len(batch)
    marked = np.zeros(n, dtype=bool)
    for col in (ERROR, DROP):
        if col in batch:
            marked |= np.array([bool(v) and v == v for v in batch[col]], dtype=bool)
    return marked


def ensure_marks(batch: Batch) -> Batch:
    n = batch_len(batch)
    for col in (ERROR, DROP):
        if col not in batch:
            batch[col] = objects([""] * n)
        else:
            batch[col] = objects(["" if (v is None or v != v) else str(v) for v in batch[col]])
    return batch


def frame_features(batch: Batch, level: str) -> dict[str, float]:
    """``{level}_frames``, ``{level}_pixels`` (and ``clip_s`` for clips) summed over the live rows' frames."""
    live = ~marks(batch)
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


def onnx_providers(config: OpConfig, op: str) -> list[str]:
    import onnxruntime as ort

    if config.device == GPU:
        if "CUDAExecutionProvider" in ort.get_available_providers():
            return ["CUDAExecutionProvider", "CPUExecutionProvider"]
        log.warning("%s: config.device='gpu' but onnxruntime has no CUDAExecutionProvider here; running on CPU", op)
    return ["CPUExecutionProvider"]


def onnx_session(model_path: str | Path, config: OpConfig, op: str):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = max(1, int(round(config.cpus)))
    opts.inter_op_num_threads = 1
    opts.enable_cpu_mem_arena = False  # give batch memory back, so memory follows the batch
    opts.log_severity_level = 3
    return ort.InferenceSession(str(model_path), sess_options=opts, providers=onnx_providers(config, op))
