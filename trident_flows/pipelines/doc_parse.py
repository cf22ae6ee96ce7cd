"""Text out of PDFs: the ``parse`` (ParsePdf) and ``ocr`` (OcrPages) operators of the document pipeline.

Contract (operator shape as in ``runtime.spec``; marks and columns as in ``documents``):
- ``ParsePdf`` (pypdfium2) adds ``pages``, ``page_texts``, ``scanned_page_numbers`` (image-only
  pages), ``scanned_pages``, ``bytes``. Unreadable files (corrupt, truncated, not a PDF,
  password-protected, missing) get ``_error`` with the reason, and so do files beyond the input
  limits (quality knobs ``max_pages``, ``max_image_megapixels``: ``InputLimit``), checked from the
  file's structure before anything is decoded.
- ``OcrPages`` renders every image-only page at ``dpi`` and OCRs it with the run's engine
  (``doc_ocr``); it replaces ``page_texts`` by ``text`` and adds ``ocr_pages``, ``chars``. A page
  whose image cannot be decoded, or whose render would exceed ``max_page_megapixels``, gets
  ``_error`` naming the page.
"""

from __future__ import annotations

import importlib.metadata
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import numpy as np

from trident_flows.core.types import OpConfig
from trident_flows.pipelines.doc_ocr import ENGINES, TESSERACT, open_engine
from trident_flows.pipelines.doc_rows import live_rows, live_sum, objects, require_columns, with_marks
from trident_flows.pipelines.quality import QualityKnob, quality_settings, stamp
from trident_flows.runtime.spec import ERROR, ID, Batch, batch_len


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
        require_columns(batch, "parse", ID, "path")
        out = with_marks(batch)
        n = batch_len(out)
        pages, texts, scanned, sizes = [0] * n, [[] for _ in range(n)], [[] for _ in range(n)], [0] * n
        for i in live_rows(out):
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
        out["page_texts"] = objects(texts)
        out["scanned_page_numbers"] = objects(scanned)
        out["scanned_pages"] = np.asarray([len(s) for s in scanned], dtype=np.int64)
        out["bytes"] = np.asarray(sizes, dtype=np.int64)
        stamp(out, "parse", self.audit, live_rows(out))
        return out

    @staticmethod
    def workload_features(batch: Batch) -> dict[str, float]:
        """``pages`` and file ``bytes`` of the batch; on an input batch (the runtime's call) pages
        are counted by opening each file (unreadable files count 0)."""
        if "pages" in batch:
            return {"pages": live_sum(batch, "pages"), "bytes": live_sum(batch, "bytes")}
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
        require_columns(batch, "ocr", ID, "path", "page_texts", "scanned_page_numbers")
        out = with_marks(batch)
        n = batch_len(out)
        texts, ocr_pages = [""] * n, [0] * n
        jobs = [(i, k) for i in live_rows(out) for k in out["scanned_page_numbers"][i]]
        mapper: Callable = self._pool.map if self._pool else map
        results = list(mapper(lambda job: _try(self._ocr_page, str(out["path"][job[0]]), int(job[1])), jobs))
        pages = {i: list(out["page_texts"][i]) for i in live_rows(out)}
        for (i, k), (text, error) in zip(jobs, results):
            if error:
                out[ERROR][i] = f"OCR failed on page {k + 1}: {error}"
            else:
                pages[i][k] = text
                ocr_pages[i] += 1
        for i, page_list in pages.items():
            texts[i] = "\n\n".join(p for p in page_list if p) if not out[ERROR][i] else ""
        del out["page_texts"]
        out["text"] = objects(texts)
        out["ocr_pages"] = np.asarray(ocr_pages, dtype=np.int64)
        out["chars"] = np.asarray([len(t) for t in texts], dtype=np.int64)
        stamp(out, "ocr", self.audit, live_rows(out))
        return out

    @staticmethod
    def workload_features(batch: Batch) -> dict[str, float]:
        return {"pages": live_sum(batch, "pages"), "scanned_pages": live_sum(batch, "scanned_pages")}


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
