"""The ``corrupt-inputs`` and ``corrupt-video`` cases of the ``faults`` benchmark: adversarial
files through the real document and video operators.

Contract: ``adversarial_pdfs(directory, good_example)`` writes the adversarial PDFs (name -> what
it is) next to good documents from ``synth_documents``; ``case_corrupt_inputs(work)`` runs the
``documents`` pipeline (trident policy) over them on the benchmark's cluster. ``broken_stream_video()``
is a valid MP4 whose H.264 data is damaged mid-stream; ``case_corrupt_video(work)`` runs the
``video`` pipeline (trident policy) over it, a truncated video and good ones. Each returns a
``FaultRow``: every adversarial file must end up exactly once in the dead-letter table with its
reason (``details.outcomes`` gives each file's outcome), no good input lost, and
``peak_rss_mib``, the largest replica process seen, within ``faults.MEMORY_BOUND_MIB`` (memory
bounded: a decompression bomb must not take the node).
"""

from __future__ import annotations

import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow.parquet as pq

from benchmarks import faults
from trident_flows.runtime.spec import DROP, ID, SOURCE_ID

GOOD_DOCUMENTS = 6
GOOD_VIDEOS = 3


def _bomb_pdf(pixels: int) -> bytes:
    """One page drawing a ``pixels`` x ``pixels`` 8-bit image stored as a few kB of Flate data."""
    image = zlib.compress(b"\0" * (pixels * pixels), 9)
    content = b"q 612 0 0 792 0 0 cm /Im0 Do Q"
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /XObject << /Im0 4 0 R >> >> /Contents 5 0 R >>",
        b"<< /Type /XObject /Subtype /Image /Width %d /Height %d /ColorSpace /DeviceGray /BitsPerComponent 8 "
        b"/Filter /FlateDecode /Length %d >>\nstream\n" % (pixels, pixels, len(image)) + image + b"\nendstream",
        b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for k, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % k + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def _blank_pages_pdf(pages: int) -> bytes:
    from fpdf import FPDF

    pdf = FPDF()
    for _ in range(pages):
        pdf.add_page()
    return bytes(pdf.output())


def _encrypted_pdf() -> bytes:
    from fpdf import FPDF

    pdf = FPDF()
    pdf.add_page()
    pdf.set_font("helvetica", size=12)
    pdf.multi_cell(0, 8, "A confidential report. " * 80)
    pdf.set_encryption(owner_password="owner-secret", user_password="user-secret")
    return bytes(pdf.output())


def adversarial_pdfs(directory: Path, good_example: Path) -> dict[str, str]:
    """Write the adversarial files into ``directory``; returns id -> what it is."""
    directory.mkdir(parents=True, exist_ok=True)
    good = good_example.read_bytes()
    files = {
        "adv-zero-byte": (b"", "zero-byte file"),
        "adv-truncated": (good[: len(good) // 2], "truncated PDF (first half)"),
        "adv-encrypted": (_encrypted_pdf(), "password-encrypted PDF"),
        "adv-not-a-pdf": (b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 64, "not a PDF (PNG bytes)"),
        "adv-decompression-bomb": (_bomb_pdf(faults.BOMB_PIXELS), f"decompression bomb ({faults.BOMB_PIXELS}^2-pixel image)"),
        "adv-blank-pages": (_blank_pages_pdf(faults.BLANK_PAGES), f"{faults.BLANK_PAGES} blank pages"),
    }
    for name, (data, _) in files.items():
        (directory / f"{name}.pdf").write_bytes(data)
    return {name: what for name, (_, what) in files.items()}


def broken_stream_video() -> bytes:
    """A tiny synthetic MP4 (container intact, so it opens and probes as a video) with 64 bytes of its
    H.264 data overwritten mid-stream: FFmpeg conceals the damage unless asked to detect it."""
    from trident_flows.pipelines import synth_video

    plan = synth_video.plan_videos(n=1, regimes="tiny:1", broken=0.0, seed=3)[0]
    data = bytearray(synth_video.encode(plan))
    start, end = data.find(b"mdat") + 8, data.find(b"moov")  # the stream's data, before the index at the end
    rng = np.random.default_rng(0)
    at = int(rng.integers(start, end - 72))
    data[at:at + 64] = rng.integers(0, 256, 64, dtype=np.uint8).tobytes()
    return bytes(data)


def _outcomes(out: Path, ids: set[str]) -> dict[str, list[str]]:
    """Per input id: where it ended ('dead-lettered by OP: reason' / 'filtered: reason' / 'kept'), once per
    output row of it (a video's clips are rows with its id as ``source_id``)."""
    found: dict[str, list[str]] = {i: [] for i in ids}
    for path in sorted((out / "dead_letter").glob("*.parquet")):
        for rec in pq.read_table(path).to_pylist():
            item = rec.get(SOURCE_ID) or rec["id"]
            if item in found:
                found[item].append(f"dead-lettered by {rec['operator']}: {rec['error'][:160]}")
    for path in sorted((out / "data").glob("*.parquet")):
        table = pq.read_table(path)
        drops = table.column(DROP).to_pylist() if DROP in table.column_names else [None] * table.num_rows
        sources = table.column(SOURCE_ID).to_pylist() if SOURCE_ID in table.column_names else [None] * table.num_rows
        for rid, source, drop in zip(table.column(ID).to_pylist(), sources, drops):
            if (source or rid) in found:
                found[source or rid].append(f"filtered: {drop[:160]}" if drop else "kept")
    return found


def _run_watching_memory(row: faults.FaultRow, spec: Any, adversarial: dict[str, str], work: Path) -> faults.FaultRow:
    """Run ``spec`` as a case (trident policy), sampling replica memory, and judge the adversarial inputs' outcomes."""
    run = faults.CaseRun(spec, work / row.case).start()
    t0 = time.monotonic()
    peak = 0
    while run.alive():
        for proc in faults._ray_procs(faults.REPLICA_TITLE):
            try:
                peak = max(peak, proc.memory_info().rss)
            except psutil.Error:
                continue
        time.sleep(0.2)
    faults._finish(row, run, t0)
    outcomes = _outcomes(run.out, set(adversarial))
    row.details["outcomes"] = {f"{k} ({adversarial[k]})": v for k, v in outcomes.items()}
    row.details["peak_rss_mib"] = round(peak / 2**20)
    once_dead_lettered = all(len(v) == 1 and v[0].startswith("dead-lettered") for v in outcomes.values())
    bounded = 0 < row.details["peak_rss_mib"] <= faults.MEMORY_BOUND_MIB
    row.ok = row.ok and once_dead_lettered and bounded
    row.notes = (f"peak replica RSS {row.details['peak_rss_mib']} MiB (bound {faults.MEMORY_BOUND_MIB}); "
                 + "; ".join(f"{k}: {v[0] if len(v) == 1 else v or 'MISSING'}" for k, v in outcomes.items()))
    return row


def case_corrupt_inputs(work: Path) -> faults.FaultRow:
    from trident_flows.pipelines import documents
    from trident_flows.pipelines.doc_dedup import release_index
    from trident_flows.pipelines.synth_documents import generate

    row = faults.FaultRow("corrupt-inputs", "zero-byte, truncated, encrypted, not-a-PDF, decompression bomb, "
                                            f"{faults.BLANK_PAGES} blank pages (real document operators)")
    corpus = work / "corrupt-corpus"
    generate(corpus, n=GOOD_DOCUMENTS, broken=0.0, duplicates=0.0, seed=18)
    adversarial = adversarial_pdfs(corpus, sorted(corpus.glob("*.pdf"))[0])
    row.faults_injected = len(adversarial)
    spec = documents.build(input=corpus)
    try:
        return _run_watching_memory(row, spec, adversarial, work)
    finally:
        release_index(documents.dedup_index_name(spec))


def case_corrupt_video(work: Path) -> faults.FaultRow:
    from trident_flows.pipelines import synth_video, video

    row = faults.FaultRow("corrupt-video", "a video with a broken stream, a truncated video (real video operators)")
    corpus = work / "corrupt-videos"
    synth_video.generate(corpus, n=GOOD_VIDEOS + 1, regimes=f"tiny:{GOOD_VIDEOS + 1}", broken=1 / (GOOD_VIDEOS + 1), seed=18,
                         cache_dir=None)
    manifest = pq.read_table(corpus / "manifest.parquet").to_pylist()
    adversarial = {r["id"]: f"{r['kind'].removeprefix('broken:')} video" for r in manifest if r["kind"] != "ok"}
    (corpus / "adv-broken-stream.mp4").write_bytes(broken_stream_video())
    adversarial["adv-broken-stream"] = "MP4 with 64 bytes of its H.264 stream overwritten"
    row.faults_injected = len(adversarial)
    return _run_watching_memory(row, video.build(input=corpus), adversarial, work)
