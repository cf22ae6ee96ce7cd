"""Benchmark ``manifest``: listing a corpus of 100,000 files and diffing it against its manifest.

Contract of ``run(quick) -> BenchResult``:
- Writes ``FILES`` small ``*.pdf`` files (``QUICK_FILES`` with ``--quick``) in folders of 1,000 into
  a temporary directory and a manifest of them as the last run left it (``corpus.sidecar``, one
  Parquet file), then changes the corpus as a night does: ``CHURN`` of the files each added, rewritten
  (another size) and deleted.
- Measures, in a fresh process per repeat (``REPEATS``), what a corpus run does before it reads any
  file: list the directory (``corpus.location``), read the manifest, diff (``corpus.manifest.diff``).
  Per repeat: seconds of each phase and of all three, and the process's peak resident memory (the
  whole interpreter, its imports included) and its growth over the three phases.
- Summary: ``files``, ``list_s``, ``read_manifest_s``, ``diff_s``, ``total_s`` and ``peak_rss_mb``
  (each the worst repeat), ``rss_growth_mb``; targets ``total_s <= 10`` and ``peak_rss_mb <= 500``.
  The diff's counts are checked against the changes made (a wrong diff fails the run).
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks.report import BenchResult, Target

FILES = 100_000
QUICK_FILES = 10_000
CHURN = 0.01  # share of the files added, of those rewritten and of those deleted
REPEATS = 3
PER_FOLDER = 1000


def _make_corpus(root: Path, files: int) -> tuple[Path, dict[str, int]]:
    """The corpus and its last manifest; returns the table location and the expected diff counts."""
    import pyarrow as pa

    from trident_flows.corpus import manifest, sidecar
    from trident_flows.corpus.location import open_location

    source = root / "corpus"
    for k in range(files):
        folder = source / f"d{k // PER_FOLDER:04d}"
        if k % PER_FOLDER == 0:
            folder.mkdir(parents=True)
        (folder / f"doc-{k:07d}.pdf").write_bytes(b"%%PDF-1.4 %d" % k)
    listing = open_location(source).list_files(".pdf")
    n = listing.num_rows
    last = pa.table({"path": listing["path"], "id": listing["path"], "size": listing["size"], "mtime_ns": listing["mtime_ns"],
                     "sha256": pa.array(["0" * 64] * n), "seen_at": pa.array([datetime.now(timezone.utc)] * n, pa.timestamp("us", tz="UTC")),
                     "outcome": pa.array([manifest.KEPT] * n)}, schema=manifest.SCHEMA)
    table = root / "table"
    sidecar.write(open_location(table), "manifest", 1, last)
    churn = max(1, int(files * CHURN))
    paths = listing["path"].to_pylist()
    for k in range(churn):
        (source / paths[2 * k]).write_bytes(b"%PDF-1.4 rewritten, longer than before")
        (source / paths[2 * k + 1]).unlink()
        (source / "new" / f"n{k:06d}.pdf").parent.mkdir(exist_ok=True)
        (source / "new" / f"n{k:06d}.pdf").write_bytes(b"%PDF-1.4 new")
    return table, {"new": churn, "suspect": churn, "deleted": churn, "unchanged": files - 2 * churn}


def _measure(source: str, table: str, queue: Any) -> None:
    """One repeat, in a fresh process: the phases' seconds and the memory figures."""
    from trident_flows.corpus import manifest, sidecar
    from trident_flows.corpus.location import open_location

    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    listing = open_location(source).list_files(".pdf")
    t1 = time.perf_counter()
    previous = sidecar.read(open_location(table), "manifest", 1)
    t2 = time.perf_counter()
    found = manifest.diff(listing, previous)
    t3 = time.perf_counter()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    queue.put({"list_s": t1 - t0, "read_manifest_s": t2 - t1, "diff_s": t3 - t2, "total_s": t3 - t0, "peak_rss_mb": peak / 1024,
               "rss_growth_mb": (peak - rss_before) / 1024, "listed": listing.num_rows,
               "counts": {"new": len(found.new), "suspect": len(found.suspect), "deleted": len(found.deleted),
                          "unchanged": len(found.unchanged)}})


def run(quick: bool = False) -> BenchResult:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = QUICK_FILES if quick else FILES
    repeats = []
    with tempfile.TemporaryDirectory(prefix="bench-manifest-") as tmp:
        start = time.monotonic()
        table, expected = _make_corpus(Path(tmp), files)
        setup_s = time.monotonic() - start
        context = multiprocessing.get_context("spawn")
        for _ in range(REPEATS):
            queue = context.Queue()
            child = context.Process(target=_measure, args=(str(Path(tmp) / "corpus"), str(table), queue))
            child.start()
            repeats.append(queue.get(timeout=600))
            child.join()
    for r in repeats:
        if r["counts"] != expected:
            raise RuntimeError(f"the manifest diff found {r['counts']}, the corpus changed by {expected}")
    worst = {key: max(r[key] for r in repeats) for key in ("list_s", "read_manifest_s", "diff_s", "total_s", "peak_rss_mb", "rss_growth_mb")}
    summary = {"files": files, **{k: round(v, 3) for k, v in worst.items()}}
    fig, ax = plt.subplots(figsize=(6, 3))
    phases = ("list_s", "read_manifest_s", "diff_s")
    bottom = [0.0] * len(repeats)
    for phase in phases:
        values = [r[phase] for r in repeats]
        ax.bar(range(1, len(repeats) + 1), values, bottom=bottom, label=phase)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.axhline(10.0, color="red", linestyle="--", label="target 10 s")
    ax.set_xlabel("repeat (fresh process)")
    ax.set_ylabel("seconds")
    ax.set_title(f"list + diff of a {files:,}-file manifest")
    ax.legend(fontsize=7)
    return BenchResult("manifest", summary, targets={"total_s": Target("<=", 10.0), "peak_rss_mb": Target("<=", 500.0)},
                       raw={"repeats": repeats, "expected": expected, "setup_s": setup_s, "cpus": os.cpu_count()}, figure=fig,
                       notes=f"{files:,} files in folders of {PER_FOLDER} on the local disk, {CHURN:.0%} each added, rewritten and "
                             "deleted since the manifest; each repeat in a fresh process (peak RSS includes the interpreter and its imports)")
