"""The document pipeline's OCR engines (tesseract, RapidOCR) on scanned pages generated here."""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import pytest

from trident_flows.core.types import CPU, GPU
from trident_flows.pipelines import doc_parse, documents
from trident_flows.pipelines.quality import apply_quality
from trident_flows.runtime.spec import ERROR, rows_to_batch

SENTENCE = ("The quarterly report describes shipping delays across northern warehouses and proposes "
            "cheaper packaging for fragile electronics before winter")


def _scan(text: str) -> bytes:
    """A grey, noisy JPEG 'scan' of ``text`` (Pillow), as a page image at about 150 dpi."""
    from PIL import Image, ImageDraw, ImageFont

    width, height = 1240, 1754
    image = Image.new("L", (width, height), 255)
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=34)
    y, line = 160, ""
    for word in text.split():
        if draw.textlength(f"{line} {word}", font=font) > width - 220 and line:
            draw.text((110, y), line, fill=25, font=font)
            y, line = y + 52, word
        else:
            line = f"{line} {word}".strip()
    draw.text((110, y), line, fill=25, font=font)
    noisy = np.clip(np.asarray(image, dtype=np.float32) + np.random.default_rng(0).normal(0, 12, (height, width)), 0, 255)
    out = io.BytesIO()
    Image.fromarray(noisy.astype(np.uint8)).save(out, format="JPEG", quality=75)
    return out.getvalue()


def _pdf(path: Path, jpeg: bytes, corrupt: bool = False) -> Path:
    """A one-page image-only PDF (fpdf2); ``corrupt`` overwrites the image's JPEG data inside the file."""
    from fpdf import FPDF

    pdf = FPDF(format="A4")
    pdf.add_page()
    pdf.image(io.BytesIO(jpeg), x=0, y=0, w=210, h=297)
    data = bytearray(pdf.output())
    if corrupt:
        at = data.find(jpeg[:64])
        data[at + 2:at + len(jpeg) - 2] = b"\x00" * (len(jpeg) - 4)  # same length: the PDF's offsets stay valid
    path.write_bytes(bytes(data))
    return path


def _ocr(tmp_path: Path, engine: str, files: list[Path]) -> dict[str, np.ndarray]:
    specs = {s.name: s for s in apply_quality("documents", documents.operator_specs(), {"ocr.engine": engine})}
    batch = rows_to_batch([{"id": p.stem, "path": str(p)} for p in files])
    return specs["ocr"].build()(specs["parse"].build()(batch))


def _letters(text: str) -> str:
    return re.sub(r"[^a-z]", "", text.lower())


@pytest.mark.models
def test_rapidocr_reads_the_words_of_a_scanned_page(tmp_path):
    out = _ocr(tmp_path, "rapidocr", [_pdf(tmp_path / "scan.pdf", _scan(SENTENCE))])
    assert not out[ERROR][0] and out["ocr_pages"][0] == 1
    # RapidOCR's recognition model often drops the spaces between words: compare letters only
    read = _letters(out["text"][0])
    words = [w for w in re.findall(r"[a-z]+", SENTENCE.lower()) if len(w) >= 4]
    found = [w for w in words if w in read]
    assert len(found) >= 0.8 * len(words), sorted(set(words) - set(found))
    assert out["cfg_ocr_engine"][0].startswith("rapidocr-onnxruntime")
    assert "cfg_ocr_lang" not in out and out["cfg_ocr_rec_batch"][0] == 6


@pytest.mark.models
@pytest.mark.parametrize("engine", ["rapidocr", "tesseract"])
def test_a_corrupt_scanned_page_is_dead_lettered_and_the_batch_goes_on(tmp_path, engine):
    jpeg = _scan(SENTENCE)
    out = _ocr(tmp_path, engine, [_pdf(tmp_path / "bad.pdf", jpeg, corrupt=True), _pdf(tmp_path / "good.pdf", jpeg)])
    assert re.search(r"OCR failed on page 1: .*corrupt scanned page: its image data cannot be decoded", out[ERROR][0]), out[ERROR][0]
    assert out["text"][0] == ""
    assert not out[ERROR][1] and "quarterly" in _letters(out["text"][1])


def test_the_engine_is_chosen_for_the_run_and_decides_where_ocr_may_run():
    default = {s.name: s for s in documents.operator_specs()}
    assert default["ocr"].space.devices == (CPU,)
    with pytest.raises(ValueError, match="engines write different text.*--quality ocr.engine=NAME"):
        apply_quality("documents", documents.operator_specs(), tune={"ocr.engine": "tesseract|rapidocr"})
    with pytest.raises(ValueError, match=r"engine='easyocr' is not allowed: choose one of tesseract\|rapidocr"):
        apply_quality("documents", documents.operator_specs(), {"ocr.engine": "easyocr"})


@pytest.mark.models
def test_rapidocr_may_run_on_a_gpu_and_refuses_a_tesseract_language(tmp_path):
    spec = documents.build(input=_pdf(tmp_path / "scan.pdf", _scan(SENTENCE)).parent, quality={"ocr.engine": "rapidocr"})
    ocr = spec.operator("ocr")
    assert ocr.space.devices == (CPU, GPU) and ocr.config.device == CPU  # starts on the CPU; a policy may move it
    with pytest.raises(ValueError, match="lang='deu' applies to tesseract only.*leave ocr.lang at 'eng'"):
        doc_parse.OcrPages(ocr.config, engine="rapidocr", lang="deu")
