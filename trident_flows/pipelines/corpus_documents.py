"""A document corpus drawn from published statistics of real PDF corpora, as feature rows for the document cost model.

Contract:
- ``FIGURES``: every number the model uses, each a ``corpus_model.Figure`` (published, derived or
  ASSUMED, with its source or reason); ``SOURCES``: the pages of the published ones.
- Sources (regimes): ``web`` (PDFs of a web crawl) and ``archive`` (digitised scans, every page
  image-only); ``SHARES`` from olmOCR's published mix (ASSUMED to be how such a corpus is assembled).
- ``draw(source, n, rng)``: per-document ``pages``, ``chars``, ``scanned_pages``, ``chunks`` and
  ``bytes``.
- Arrangement: shards of ``SHARD_ITEMS`` documents of one source, in a source-blind order
  (``corpus_model.arrange``); ``MEAN_BLOCK_ITEMS`` per source follow from ``SHARES``.
- ``blocks(shards, seed)``, ``rows(blocks, seed)`` and ``profile(base, seed)`` make it a workload for
  the simulator and the cost-model headroom; ``OUTSIDE_PROFILE`` says where these items lie beyond
  ``profiles/documents.json`` (the cost model extrapolates linearly there).
"""

from __future__ import annotations

import math
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from trident_flows.pipelines import corpus_model
from trident_flows.pipelines.corpus_model import ASSUMED, DERIVED, PUBLISHED, Figure
from trident_flows.runtime.costmodel import PipelineProfile

WEB, ARCHIVE = "web", "archive"
FEATURES = ("pages", "scanned_pages", "chars", "chunks", "bytes")

PDFA = "https://huggingface.co/datasets/pixparse/pdfa-eng-wds"
FINEPDFS_AUDIT = "https://github.com/marin-community/marin/issues/4735"
SAFEDOCS_SIZE = "https://pdfa.org/new-large-scale-pdf-corpus-now-publicly-available/"
SAFEDOCS_META = ("https://digitalcorpora.org/corpora/file-corpora/cc-main-2021-31-pdf-untruncated/"
                 "cc-main-2021-31-pdf-untruncated-metadata/")
SAFEDOCS = "https://digitalcorpora.org/corpora/file-corpora/cc-main-2021-31-pdf-untruncated/"
OLMOCR_MIX = "https://huggingface.co/datasets/allenai/olmOCR-mix-1025"
DOCPIPE = "https://roger1024-docpipe.hf.space/"

_PDFA_PAGES, _PDFA_DOCS = 18.6e6, 2.16e6
_CHARS_P50, _CHARS_P90, _CHARS_P99 = 8_775.0, 102_657.0, 707_362.0
_SAFEDOCS_BYTES, _SAFEDOCS_FILES = 8e12, 7_932_878
_TRUNCATED, _URLS = 2_020_913, 8_410_703
_MIX = {"00_documents": 232_790, "01_books": 17_474, "02_loc_transcripts": 9_989, "03_national_archives": 9_997}
_PROFILE_CHARS_PER_CHUNK = 4124.266666666666 / 5.4  # profiles/documents.json, regime short: chars / chunks

PAGES_SIGMA = 1.2
WEB_SCANNED_SHARE = 0.10
SHARD_ITEMS = 1000
MAX_PAGES, MAX_CHARS = 2000, 2_000_000

PAGES_MEAN = _PDFA_PAGES / _PDFA_DOCS
CHARS_SIGMA = corpus_model.sigma_from_quantiles(_CHARS_P50, _CHARS_P90, 0.90)
PAGES_MEDIAN = corpus_model.median_from_mean(PAGES_MEAN, PAGES_SIGMA)
CPP_SIGMA = math.sqrt(CHARS_SIGMA**2 - PAGES_SIGMA**2)
CPP_MEDIAN = _CHARS_P50 / PAGES_MEDIAN
BYTES_MEAN = _SAFEDOCS_BYTES / _SAFEDOCS_FILES
OVER_1MIB = _TRUNCATED / _URLS


def _bytes_sigma() -> float:
    """The larger log-sd of a lognormal with mean ``BYTES_MEAN`` and ``OVER_1MIB`` of its mass above 1 MiB:
    ln(2^20) - mu = z * s with mu = ln(mean) - s^2 / 2, a quadratic in s."""
    zz = corpus_model.z(1.0 - OVER_1MIB)
    c = math.log(2**20) - math.log(BYTES_MEAN)
    return zz + math.sqrt(zz * zz - 2 * c)


BYTES_SIGMA = _bytes_sigma()
BYTES_MEDIAN = corpus_model.median_from_mean(BYTES_MEAN, BYTES_SIGMA)
ARCHIVE_SHARE = (_MIX["01_books"] + _MIX["02_loc_transcripts"] + _MIX["03_national_archives"]) / sum(_MIX.values())
SHARES = {WEB: 1.0 - ARCHIVE_SHARE, ARCHIVE: ARCHIVE_SHARE}
MEAN_BLOCK_ITEMS = {s: corpus_model.mean_block_items(q, SHARD_ITEMS) for s, q in SHARES.items()}

FIGURES: tuple[Figure, ...] = (
    Figure("pages per document, mean", PAGES_MEAN, DERIVED, PDFA,
           "the PDFA card (SafeDocs CC-MAIN-2021-31, filtered to files under 100 MB that render in under 500 ms, English by "
           f"XLM-RoBERTa) states 18.6 million pages over 2.16 million documents: {PAGES_MEAN:.2f} pages per document"),
    Figure("pages per document, log-sd", PAGES_SIGMA, ASSUMED, "",
           "no published spread of pages per PDF was found (SafeDocs publishes pdfinfo page counts per file, not a summary); "
           f"1.2 puts the median at {PAGES_MEDIAN:.1f} pages and keeps it below the spread of characters per document "
           "(chars per page vary too)"),
    Figure("characters per document, median", _CHARS_P50, PUBLISHED, FINEPDFS_AUDIT,
           "an audit of 32,768 documents sampled from FinePDFs eng_Latn (206,917,202 documents) reports char p50/p90/p99 "
           "8,775 / 102,657 / 707,362"),
    Figure("characters per document, 90th percentile", _CHARS_P90, PUBLISHED, FINEPDFS_AUDIT, "as above: p90 102,657"),
    Figure("characters per document, log-sd", CHARS_SIGMA, DERIVED, FINEPDFS_AUDIT,
           f"ln(102,657 / 8,775) / z(0.90) = {CHARS_SIGMA:.3f}; the lognormal then puts p99 at "
           f"{corpus_model.lognormal_quantile(_CHARS_P50, CHARS_SIGMA, 0.99):,.0f} against the published 707,362"),
    Figure("characters per page, median", CPP_MEDIAN, DERIVED, "",
           f"chars = pages x chars-per-page, independent lognormals: median 8,775 / {PAGES_MEDIAN:.2f} pages; "
           f"log-sd sqrt({CHARS_SIGMA:.3f}^2 - {PAGES_SIGMA}^2) = {CPP_SIGMA:.3f}"),
    Figure("file bytes, mean", BYTES_MEAN, DERIVED, SAFEDOCS_SIZE,
           f"'nearly 8 million PDFs totaling about 8 TB' (7,932,878 files numbered 0000000-7932877 on {SAFEDOCS}): "
           f"{BYTES_MEAN / 1e6:.2f} MB per file"),
    Figure("file bytes, share over 1 MiB", OVER_1MIB, DERIVED, SAFEDOCS_META,
           "Common Crawl truncates files at 1 MB; the metadata lists cc_truncated = length for 2,020,913 of 8,410,703 URLs: "
           f"{OVER_1MIB:.3f} (URLs, not distinct files)"),
    Figure("file bytes, log-sd", BYTES_SIGMA, DERIVED, "",
           f"the lognormal with that mean and that share over 2^20 bytes: median {BYTES_MEDIAN / 1e6:.2f} MB"),
    Figure("items from scanned archives (books, LoC transcripts, National Archives)", ARCHIVE_SHARE, DERIVED, OLMOCR_MIX,
           "olmOCR-mix-1025 pages: 00_documents 232,790, 01_books 17,474, 02_loc_transcripts 9,989, 03_national_archives 9,997 "
           f"of 270,250: {ARCHIVE_SHARE:.4f}; a curated training mix, ASSUMED to be how a corpus joins web PDFs and scans, and "
           "pages share ASSUMED equal to documents share (archive documents ASSUMED to have the web pages distribution)"),
    Figure("scanned (image-only) share of web documents", WEB_SCANNED_SHARE, ASSUMED, DOCPIPE,
           "no corpus-level share of image-only PDFs was found published for SafeDocs, FinePDFs or olmOCR; 10% ASSUMED, in "
           "line with a FinePDFs-style router's demo stating that roughly 90% of a typical PDF corpus takes the text fast "
           "path (not a measurement of a named corpus)"),
    Figure("chars per embedded chunk", _PROFILE_CHARS_PER_CHUNK, DERIVED, "",
           "profiles/documents.json, regime short: 4,124 chars / 5.4 chunks (chunks of 128 words)"),
    Figure("documents per shard", SHARD_ITEMS, ASSUMED, SAFEDOCS,
           "the corpus page says it is packaged in ZIP files 'the same as GovDocs1', whose zips hold 1,000 files each; "
           "the count per zip is not stated for this corpus in the text found"),
    Figure("largest document (pages, chars)", MAX_PAGES, ASSUMED, "",
           f"draws are cut at {MAX_PAGES} pages and {MAX_CHARS:,} chars (~0.3% of documents; the lognormals have no upper "
           "end, FinePDFs marks truncated documents with is_truncated): the embed cost model's memory is linear in chunks "
           "(fitted on up to ~100 chunks), so one document of 4.2M chars (5,500 chunks) would need more than an 8 GiB "
           "device and be dead-lettered in the simulator, where the real operator encodes chunks encode_batch at a time"),
)
SOURCES = corpus_model.sources_of(FIGURES)

OUTSIDE_PROFILE = (
    "profiles/documents.json was measured on 30 synthetic documents of 1-~40 pages (regime means 1.8 / 4.1 / 32.8 pages, "
    "up to 72k chars); corpus documents reach hundreds of pages and 10^5-10^6 chars (p99 ~700k chars): every cost there "
    "is the linear fit extrapolated. OCR was measured on one page size at 150 dpi; archive scans (books, records) are "
    "ASSUMED to cost what those pages cost. Re-profiling the real operators on corpus-like documents is a later step.")


def draw(source: str, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Features of ``n`` documents of ``source``.

    ``pages`` lognormal, mean from PDFA (SafeDocs, English), log-sd ASSUMED; ``chars`` = pages x chars-per-page
    with chars-per-page lognormal, so that ``chars`` is the lognormal through FinePDFs' published median and 90th
    percentile (its 99th is the check); ``scanned_pages`` = pages for a scanned document (a share of ``web``,
    ASSUMED; every ``archive`` document) else 0; ``chunks`` = chars / the chars per chunk the profile measured
    (``embed`` chunks 128 words); ``bytes`` lognormal through SafeDocs' mean file size and its share over 1 MiB
    (the files Common Crawl truncated). Languages are not drawn: no profiled operator's cost depends on the
    language. Page size is not drawn: not published for these corpora, and the OCR cost was measured per page
    at 150 dpi on one page size."""
    if source not in SHARES:
        raise ValueError(f"unknown document source {source!r}; the model has {sorted(SHARES)}")
    pages_cont = np.minimum(rng.lognormal(math.log(PAGES_MEDIAN), PAGES_SIGMA, n), MAX_PAGES)
    pages = np.maximum(1.0, np.round(pages_cont))
    chars = np.minimum(pages_cont * rng.lognormal(math.log(CPP_MEDIAN), CPP_SIGMA, n), MAX_CHARS)
    scanned = np.ones(n, dtype=bool) if source == ARCHIVE else rng.random(n) < WEB_SCANNED_SHARE
    return {"pages": pages, "scanned_pages": np.where(scanned, pages, 0.0), "chars": np.round(chars),
            "chunks": np.maximum(1.0, np.ceil(chars / _PROFILE_CHARS_PER_CHUNK)),
            "bytes": np.round(rng.lognormal(math.log(BYTES_MEDIAN), BYTES_SIGMA, n))}


def blocks(shards: int, seed: int) -> list[tuple[str, int]]:
    """The (source, documents) blocks of ``shards`` shards (module docstring)."""
    return corpus_model.arrange(SHARES, SHARD_ITEMS, shards, seed)


def rows(schedule: Sequence[tuple[str, int]], seed: int) -> Iterator[dict[str, Any]]:
    return corpus_model.rows(schedule, draw, seed)


def profile(base: PipelineProfile, seed: int = 0, sample: int = 20_000) -> PipelineProfile:
    """``base`` (the documents profile) with each source's mean document, from a seeded sample, as its workloads."""
    from dataclasses import replace

    means = corpus_model.regime_means(list(rows([(s, sample) for s in SHARES], seed)), FEATURES)
    return replace(base, workloads=means)


def summary(sample: Mapping[str, np.ndarray]) -> dict[str, float]:
    """The statistics the cited figures fix, measured on drawn features (for tests and the docs)."""
    pages, chars, b = sample["pages"], sample["chars"], sample["bytes"]
    return {"pages_mean": float(pages.mean()), "chars_p50": float(np.quantile(chars, 0.5)),
            "chars_p90": float(np.quantile(chars, 0.9)), "chars_p99": float(np.quantile(chars, 0.99)),
            "bytes_mean": float(b.mean()), "over_1mib": float((b > 2**20).mean()),
            "scanned_share": float((sample["scanned_pages"] > 0).mean())}
