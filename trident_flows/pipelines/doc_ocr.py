"""The OCR engines of the document pipeline's ``ocr`` operator: tesseract and RapidOCR.

The engine is the user's choice (the ``engine`` quality knob of ``doc_parse.OcrPages``): engines
write different text, so no policy switches it; device and threads are execution knobs.

Contract:
- ``ENGINES`` names the engines; ``open_engine(name, config, *, lang, rec_batch)`` cold-starts one
  and returns an ``OcrEngine``.
- ``engine.read(image)``: the text of one grayscale uint8 page image, lines joined by newlines (""
  without text); it raises on an image it cannot read.
- ``engine.description`` (the ``cfg_ocr_engine`` audit column), ``engine.device`` ("cpu" or
  "cuda") and ``engine.forward_s`` (seconds in model forwards; 0 for tesseract).
- tesseract: CPU, one single-threaded process per page, ``lang`` its language model. RapidOCR:
  CUDA or CPU, ``rec_batch`` a quality setting, ``lang`` "eng" only (``RapidOcrEngine``).
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import time
from typing import Any, Protocol

import numpy as np

from trident_flows.core.types import GPU, OpConfig

log = logging.getLogger(__name__)

TESSERACT, RAPIDOCR = "tesseract", "rapidocr"
ENGINES = (TESSERACT, RAPIDOCR)


class OcrEngine(Protocol):
    description: str
    device: str

    @property
    def forward_s(self) -> float: ...

    def read(self, image: np.ndarray) -> str: ...


class TesseractEngine:
    """tesseract through pytesseract, one single-threaded process per page."""

    device = "cpu"
    forward_s = 0.0

    def __init__(self, lang: str) -> None:
        import pytesseract

        os.environ["OMP_THREAD_LIMIT"] = "1"
        try:
            version = pytesseract.get_tesseract_version()
        except pytesseract.TesseractNotFoundError as exc:
            raise RuntimeError("operator 'ocr' needs the tesseract binary: install tesseract-ocr "
                               "(scripts/ensure-system-deps.sh does), or choose --quality ocr.engine=rapidocr") from exc
        installed = pytesseract.get_languages(config="")
        if any(part not in installed for part in lang.split("+")):
            raise ValueError(f"operator 'ocr': quality knob lang={lang!r} is not installed for tesseract (installed: "
                             f"{sorted(installed)}); install its traineddata (e.g. apt-get install tesseract-ocr-deu) or choose another")
        self.lang = lang
        self.description = f"tesseract {version}"

    def read(self, image: np.ndarray) -> str:
        import pytesseract
        from PIL import Image

        return pytesseract.image_to_string(Image.fromarray(image), lang=self.lang).strip()


class TimedSession:
    """Wraps an onnxruntime session and adds up the seconds its ``run`` takes (the model forward)."""

    def __init__(self, session: Any) -> None:
        self.session, self.seconds = session, 0.0

    def run(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.session.run(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session, name)


class RapidOcrEngine:
    """RapidOCR (PP-OCRv4 det + angle classifier + rec, onnxruntime) on the CPU or on CUDA.

    The models ship as ONNX files in the ``rapidocr-onnxruntime`` wheel (nothing is downloaded). It runs on
    CUDA through onnxruntime's CUDAExecutionProvider when ``config.device == "gpu"`` and the provider is
    present, else on the CPU (with a warning when a GPU was asked for); its sessions use one intra-op thread
    (the operator's ``threads`` knob reads that many pages at once; sessions may run concurrently).
    ``rec_batch`` is the number of text lines per recognition pass: a pass pads its lines to the widest one,
    which changes the recognised text (word spacing differs between 1 and 6 lines per pass on the same
    page), so it is a quality setting, not a speed knob. The recognition model reads Latin script without
    accents and Chinese and has no language setting, so ``lang`` must stay "eng"."""

    def __init__(self, config: OpConfig, *, rec_batch: int) -> None:
        import onnxruntime as ort
        from rapidocr_onnxruntime import RapidOCR

        cuda = config.device == GPU and "CUDAExecutionProvider" in ort.get_available_providers()
        if config.device == GPU and not cuda:
            log.warning("ocr: config.device='gpu' but onnxruntime has no CUDAExecutionProvider here; RapidOCR runs on CPU")
        self._ocr = RapidOCR(intra_op_num_threads=1, inter_op_num_threads=1, rec_batch_num=int(rec_batch),
                             det_use_cuda=cuda, cls_use_cuda=cuda, rec_use_cuda=cuda)
        holders = (self._ocr.text_det.infer, self._ocr.text_cls.infer, self._ocr.text_rec.session)
        self._timed = []
        for holder in holders:  # time every model forward (the share a GPU speeds up)
            holder.session = TimedSession(holder.session)
            self._timed.append(holder.session)
        self.device = "cuda" if cuda and all(h.use_cuda for h in holders) else "cpu"
        self.description = (f"rapidocr-onnxruntime {importlib.metadata.version('rapidocr-onnxruntime')} "
                            f"(PP-OCRv4 det+rec, onnxruntime {ort.__version__})")
        self.read(np.full((64, 256), 255, dtype=np.uint8))  # warm up: first forwards allocate (cold start)

    @property
    def forward_s(self) -> float:
        return sum(t.seconds for t in self._timed)

    def read(self, image: np.ndarray) -> str:
        rgb = np.ascontiguousarray(np.repeat(image[:, :, np.newaxis], 3, axis=2)) if image.ndim == 2 else image
        result, _ = self._ocr(rgb)
        return "\n".join(str(line[1]) for line in result or ()).strip()


def open_engine(name: str, config: OpConfig, *, lang: str, rec_batch: int) -> OcrEngine:
    """Cold-start the OCR engine ``name`` (see the module docstring)."""
    if name == TESSERACT:
        return TesseractEngine(lang)
    if name == RAPIDOCR:
        if lang != "eng":
            raise ValueError(f"operator 'ocr': quality knob lang={lang!r} applies to tesseract only; RapidOCR's recognition model "
                             f"has no language setting: leave ocr.lang at 'eng' or choose --quality ocr.engine=tesseract")
        return RapidOcrEngine(config, rec_batch=rec_batch)
    raise ValueError(f"operator 'ocr': quality knob engine={name!r} is not an OCR engine; choose one of {'|'.join(ENGINES)}")
