"""Synthetic PDF corpus with regime changes, near-duplicates, low-quality and broken files.

Contract of ``generate(out, n=, regimes=, duplicates=, broken=, seed=)``:
- Writes ``n`` real PDFs ``out/doc-NNNNN.pdf`` and ``out/manifest.parquet``; returns the manifest
  (one row per file, schedule order). Born-digital pages carry prose in en/de/fr/es; scanned pages
  are image-only (only OCR reads them), their words kept in ``scanned_words``.
- ``regimes``: a schedule "name:count,..." over ``REGIMES`` (short, long, scans), scaled to ``n``.
- ``duplicates`` / ``broken``: shares of near-duplicates and broken files (truncated, not-a-PDF,
  encrypted); about 8% of short documents are low quality. ``kind`` says which: "ok",
  "duplicate-of:<id>", "broken:<reason>" or "low-quality:<reason>".
- Deterministic by ``seed``: the same arguments give byte-identical files.
"""

from __future__ import annotations

import datetime as dt
import io
import random
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from trident_flows.pipelines.doc_text import LANGUAGES, PHRASEBOOKS, paragraph, title

REGIMES: dict[str, str] = {
    "short": "1-3 born-digital pages",
    "long": "15-40 page reports, a few scanned pages",
    "scans": "2-6 pages, mostly scanned (image-only)",
}
DEFAULT_REGIMES = "short:2,long:1,scans:1"
BROKEN_KINDS = ("truncated", "not-a-pdf", "encrypted")
LOW_QUALITY_SHARE = 0.08
SCAN_DPI = 150
_CREATION_DATE = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
_A4_MM = (210.0, 297.0)


@dataclass(frozen=True)
class Page:
    text: str
    scanned: bool


@dataclass(frozen=True)
class DocContent:
    title: str
    language: str
    pages: tuple[Page, ...]


def parse_schedule(regimes: str | None, n: int) -> list[str]:
    """The regime of each of the ``n`` documents, in order."""
    spec = regimes or DEFAULT_REGIMES
    parts: list[tuple[str, int]] = []
    for item in spec.split(","):
        name, sep, count = item.strip().partition(":")
        if not sep or name not in REGIMES or not count.strip().isdigit():
            raise ValueError(f"bad regime schedule item {item!r} in {spec!r}: expected NAME:COUNT with NAME in {sorted(REGIMES)}")
        parts.append((name, int(count)))
    total = sum(c for _, c in parts)
    if total == 0:
        raise ValueError(f"regime schedule {spec!r} has no documents")
    if total != n:  # scale proportionally to n (largest remainder)
        exact = [c * n / total for _, c in parts]
        counts = [int(x) for x in exact]
        for i in sorted(range(len(parts)), key=lambda i: exact[i] - counts[i], reverse=True)[: n - sum(counts)]:
            counts[i] += 1
        parts = [(name, c) for (name, _), c in zip(parts, counts)]
    return [name for name, c in parts for _ in range(c)]


def _content(rng: random.Random, regime: str) -> DocContent:
    language = rng.choice(LANGUAGES)
    if regime == "short":
        kinds = [False] * rng.randint(1, 3)
    elif regime == "long":
        pages = rng.randint(15, 40)
        scanned = set(rng.sample(range(pages), rng.randint(0, 2)))
        kinds = [i in scanned for i in range(pages)]
    else:
        pages = rng.randint(2, 6)
        kinds = [rng.random() < 0.85 for _ in range(pages)]
        kinds[0] = True
    return DocContent(title(rng, language), language,
                      tuple(Page(paragraph(rng, language, rng.randint(60, 100) if s else rng.randint(250, 420)), s) for s in kinds))


def _low_quality(rng: random.Random, content: DocContent) -> tuple[DocContent, str]:
    reason = rng.choice(("too-short", "repetitive", "symbols"))
    if reason == "too-short":
        pages = (Page(content.title, False),)
    elif reason == "repetitive":
        line = paragraph(rng, content.language, 8)
        pages = (Page("\n".join([line] * 60), False),)
    else:
        pages = (Page("\n".join(" ".join(f"{rng.randint(0, 99999):>5} |#| {rng.choice('$%&*+=<>')}{rng.random():.3f}"
                                         for _ in range(6)) for _ in range(40)), False),)
    return replace(content, pages=pages), reason


def _near_duplicate(rng: random.Random, content: DocContent) -> DocContent:
    """Replace 1-3 words of each born-digital page with other words of the same language."""
    book = PHRASEBOOKS[content.language]
    vocabulary = sorted({w for group in (book.subjects, book.objects, book.adverbials) for p in group for w in p.split()})
    pages = []
    for page in content.pages:
        if page.scanned:
            pages.append(page)
            continue
        words = page.text.split(" ")
        for i in rng.sample(range(len(words)), min(len(words), rng.randint(1, 3))):
            words[i] = rng.choice(vocabulary)
        pages.append(Page(" ".join(words), False))
    return replace(content, pages=tuple(pages))


def _scan_image(rng: random.Random, text: str) -> bytes:
    """A noisy, slightly rotated grayscale 'scan' of ``text`` as JPEG bytes."""
    from PIL import Image, ImageDraw, ImageFont

    width, height = int(_A4_MM[0] / 25.4 * SCAN_DPI), int(_A4_MM[1] / 25.4 * SCAN_DPI)
    image = Image.new("L", (width, height), 255)
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=30)
    margin, y, line = 110, 140, ""
    for word in text.split():
        candidate = f"{line} {word}".strip()
        if draw.textlength(candidate, font=font) > width - 2 * margin and line:
            draw.text((margin, y), line, fill=20, font=font)
            y, line = y + 44, word
        else:
            line = candidate
    if line:
        draw.text((margin, y), line, fill=20, font=font)
    image = image.rotate(rng.uniform(-1.2, 1.2), resample=Image.Resampling.BILINEAR, fillcolor=255)
    noise = np.random.default_rng(rng.getrandbits(32)).normal(0.0, 18.0, (height, width))
    noisy = np.clip(np.asarray(image, dtype=np.float32) + noise, 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(noisy).save(buffer, format="JPEG", quality=70)
    return buffer.getvalue()


def _render(rng: random.Random, content: DocContent, password: str | None = None) -> bytes:
    from fpdf import FPDF

    pdf = FPDF(format="A4")
    pdf.set_creation_date(_CREATION_DATE)
    pdf.set_title(content.title)
    pdf.set_auto_page_break(True, margin=15)
    for number, page in enumerate(content.pages):
        pdf.add_page()
        if page.scanned:
            pdf.image(io.BytesIO(_scan_image(rng, page.text)), x=0, y=0, w=_A4_MM[0], h=_A4_MM[1])
            continue
        if number == 0:
            pdf.set_font("Helvetica", style="B", size=15)
            pdf.multi_cell(0, 8, content.title)
            pdf.ln(3)
        pdf.set_font("Helvetica", size=10)
        pdf.multi_cell(0, 5, page.text)
    if password:
        pdf.set_encryption(owner_password=password + "-owner", user_password=password)
    return bytes(pdf.output())


def _broken_bytes(rng: random.Random, content: DocContent, reason: str) -> bytes:
    if reason == "truncated":
        data = _render(rng, content)
        return data[: max(64, len(data) // 3)]
    if reason == "not-a-pdf":
        return ("<html><body>" + paragraph(rng, content.language, 40) + "</body></html>\n").encode("utf-8")
    return _render(rng, content, password=f"pw{rng.randint(1000, 9999)}")


def generate(out: Path, *, n: int, regimes: str | None = None, duplicates: float = 0.1, broken: float = 0.05,
             seed: int = 0) -> pd.DataFrame:
    """Write the corpus and its manifest into ``out``; return the manifest (see module docstring)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    for name, share in (("duplicates", duplicates), ("broken", broken)):
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"{name} must be a share in [0, 1], got {share}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    schedule = parse_schedule(regimes, n)
    plan_rng = random.Random(f"plan:{seed}")
    n_dup = min(int(round(duplicates * n)), max(0, n - 1))
    n_broken = min(int(round(broken * n)), n - n_dup)
    # Duplicates need an earlier original of the same regime; broken files go anywhere else.
    dup_candidates = [i for i in range(1, n) if schedule[i] in schedule[:i]]
    dup_at = set(plan_rng.sample(dup_candidates, min(n_dup, len(dup_candidates))))
    broken_at = sorted(plan_rng.sample([i for i in range(n) if i not in dup_at], n_broken))
    broken_reason = {i: BROKEN_KINDS[k % len(BROKEN_KINDS)] for k, i in enumerate(broken_at)}

    contents: dict[int, DocContent] = {}
    rows = []
    for i, regime in enumerate(schedule):
        doc_id = f"doc-{i:05d}"
        rng = random.Random(f"doc:{seed}:{i}")
        content = _content(rng, regime)
        kind = "ok"
        originals = [j for j in range(i) if schedule[j] == regime and j in contents]
        if i in dup_at and originals:
            j = rng.choice(originals)
            content, kind = _near_duplicate(rng, contents[j]), f"duplicate-of:doc-{j:05d}"
        elif i in broken_reason:
            kind = f"broken:{broken_reason[i]}"
        elif regime == "short" and rng.random() < LOW_QUALITY_SHARE:
            content, reason = _low_quality(rng, content)
            kind = f"low-quality:{reason}"
        if kind == "ok":
            contents[i] = content
        data = _broken_bytes(rng, content, broken_reason[i]) if i in broken_reason else _render(rng, content)
        path = out / f"{doc_id}.pdf"
        path.write_bytes(data)
        scanned = [k for k, p in enumerate(content.pages) if p.scanned]
        rows.append({"id": doc_id, "path": path.name, "regime": regime, "pages": len(content.pages), "scanned_pages": len(scanned),
                     "language": content.language, "kind": kind, "bytes": len(data), "scanned_page_numbers": scanned,
                     "scanned_words": [content.pages[k].text for k in scanned]})
    manifest = pd.DataFrame(rows)
    manifest.to_parquet(out / "manifest.parquet", index=False)
    return manifest
