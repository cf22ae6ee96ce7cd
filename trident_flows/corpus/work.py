"""What one corpus run has to do: list the input, diff it against the manifest, and fetch the files
to process into a local cache, hashing their bytes.

Contract:
- ``plan_work(source, previous, cache_dir, retry_dead_letters, originals)`` lists ``source``'s
  ``*.pdf`` files (recursively), diffs them against the ``previous`` manifest, and fetches and
  hashes what is to be processed into ``cache_dir`` (content-addressed); unchanged documents whose
  near-duplicate original is processed again are ``requeued``.
- ``Work.rows()``: the pipeline's input rows (``id`` = the path relative to the input root,
  ``path`` = the cached copy); ``Work.counts()``: the run's file figures;
  ``Work.next_manifest(outcomes, seen_at)``: the manifest after the run.
- A source holding no ``*.pdf`` file, on a first run, is refused (``LocationError``) saying so.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Mapping

import pyarrow as pa
import pyarrow.compute as pc

from trident_flows.corpus import manifest
from trident_flows.corpus.location import Location, LocationError

SUFFIX = ".pdf"
FETCH_THREADS = 8
NEW, CHANGED, RETRIED, REQUEUED = "new", "changed", "retried", "requeued"


@dataclass(frozen=True)
class WorkItem:
    """A file this run processes: why (``kind``), its listing and the hash of the bytes cached."""

    path: str
    size: int
    mtime_ns: int
    sha256: str
    local_path: str
    kind: str


@dataclass(frozen=True)
class Work:
    items: tuple[WorkItem, ...]
    previous: pa.Table
    listing: pa.Table
    unchanged: int
    deleted: tuple[str, ...]

    def rows(self) -> list[dict[str, str]]:
        return [{"id": item.path, "path": item.local_path} for item in sorted(self.items, key=lambda i: i.path)]

    def counts(self) -> dict[str, int]:
        kinds = [item.kind for item in self.items]
        return {"files_new": kinds.count(NEW), "files_changed": kinds.count(CHANGED), "files_unchanged": self.unchanged,
                "files_deleted": len(self.deleted), "files_retried": kinds.count(RETRIED), "files_requeued": kinds.count(REQUEUED)}

    def hashes(self) -> dict[str, str]:
        """Document id -> sha256 of the bytes processed."""
        return {item.path: item.sha256 for item in self.items}

    def next_manifest(self, outcomes: Mapping[str, str], seen_at: datetime) -> pa.Table:
        """The manifest after this run (see the module docstring)."""
        listed = self.listing.select(["path", "size", "mtime_ns"])
        kept = self.previous.select(["path", "id", "sha256", "seen_at", "outcome"]).join(listed, "path", join_type="inner")
        processed = {item.path: item for item in self.items}
        keep = pc.invert(pc.is_in(kept["path"], pa.array(list(processed), pa.string())))
        kept = kept.filter(keep)
        done = pa.table({"path": [i.path for i in processed.values()], "id": [i.path for i in processed.values()],
                         "sha256": [i.sha256 for i in processed.values()],
                         "seen_at": pa.array([seen_at] * len(processed), pa.timestamp("us", tz="UTC")),
                         "outcome": [outcomes.get(i.path, manifest.DEAD_LETTERED) for i in processed.values()],
                         "size": pa.array([i.size for i in processed.values()], pa.int64()),
                         "mtime_ns": pa.array([i.mtime_ns for i in processed.values()], pa.int64())})
        table = pa.concat_tables([kept.select(manifest.SCHEMA.names).cast(manifest.SCHEMA),
                                  done.select(manifest.SCHEMA.names).cast(manifest.SCHEMA)])
        return table.sort_by("path")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def plan_work(source: Location, previous: pa.Table, cache_dir: Path, retry_dead_letters: bool = False,
              originals: Mapping[str, str] | None = None) -> Work:
    """The run's work. Every new, suspect and retried file is read once (threads: reading an object store is
    I/O) and hashed (sha256); a suspect file whose bytes hash as recorded was only touched: it is unchanged, and
    the next manifest takes its new size and mtime. Processed bytes go to ``cache_dir/<sha256>.pdf``,
    content-addressed: a file rewritten while the run goes on cannot change what the run curates, and a re-run
    finds the same paths. An unchanged document whose original (``originals``) is processed again is
    ``requeued``: whether it is still a near-duplicate, and of what, depends on what its original now is."""
    listing = source.list_files(SUFFIX)
    if listing.num_rows == 0 and previous.num_rows == 0:
        raise LocationError(f"input {source.uri} holds no *{SUFFIX} files; give the directory (or URL) where the documents land")
    found = manifest.diff(listing, previous, retry_dead_letters)
    recorded = dict(zip(previous["path"].to_pylist(), previous["sha256"].to_pylist()))
    stat = {p: (s, m) for p, s, m in zip(listing["path"].to_pylist(), listing["size"].to_pylist(), listing["mtime_ns"].to_pylist())}
    cache_dir.mkdir(parents=True, exist_ok=True)

    def fetch(path: str) -> tuple[str, str, Path]:
        data = source.read_bytes(path)
        digest = _sha256(data)
        local = cache_dir / f"{digest}{SUFFIX}"
        if not local.exists():
            tmp = local.with_name(f".{local.name}.{hashlib.sha256(path.encode()).hexdigest()[:12]}.tmp")
            tmp.write_bytes(data)
            tmp.replace(local)
        return path, digest, local

    wanted = [(p, NEW) for p in found.new] + [(p, CHANGED) for p in found.suspect] + [(p, RETRIED) for p in found.retry]
    with ThreadPoolExecutor(FETCH_THREADS) as pool:
        fetched = list(pool.map(fetch, [p for p, _ in wanted]))
    items = [WorkItem(path, *stat[path], digest, str(local), kind)
             for (path, kind), (_, digest, local) in zip(wanted, fetched) if not (kind == CHANGED and recorded.get(path) == digest)]
    touched = len(wanted) - len(items)
    again = {item.path for item in items if item.kind in (CHANGED, RETRIED)}
    unchanged = set(found.unchanged)
    requeue = sorted(doc for doc, original in (originals or {}).items() if original in again and doc in unchanged)
    with ThreadPoolExecutor(FETCH_THREADS) as pool:
        items += [WorkItem(path, *stat[path], digest, str(local), REQUEUED) for path, digest, local in pool.map(fetch, requeue)]
    return Work(tuple(items), previous, listing, unchanged=len(unchanged) - len(requeue) + touched, deleted=found.deleted)
