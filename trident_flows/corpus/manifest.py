"""The manifest of a corpus: every file seen, and what a new listing changes in it.

Contract:
- A manifest is an Arrow table with ``SCHEMA``: ``path`` (relative to the input root, unique),
  ``id`` (the document id its rows carry: the path), ``size``, ``mtime_ns`` (as listed),
  ``sha256`` (of the bytes last processed), ``seen_at`` (when a run last processed or verified
  it, UTC) and ``outcome`` (``OUTCOMES``: kept, filtered, near-duplicate, dead-lettered).
- ``diff(listing, previous, retry_dead_letters)`` compares a listing (``path``, ``size``,
  ``mtime_ns``) with the previous manifest and returns a ``Diff`` of paths: ``new`` (not in the
  manifest), ``suspect`` (size or mtime differ: their bytes are hashed to tell changed from
  touched), ``unchanged`` (same size and mtime), ``retry`` (unchanged but dead-lettered, when
  ``retry_dead_letters``; otherwise they count as unchanged and are not retried) and
  ``deleted`` (in the manifest, not listed). Every listed path is in exactly one of new,
  suspect, unchanged and retry. It works on whole Arrow columns: 100,000 files diff in well under
  a second (``trident-flows bench manifest``).
- ``empty()`` is the manifest of a corpus never curated.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

SCHEMA = pa.schema([("path", pa.string()), ("id", pa.string()), ("size", pa.int64()), ("mtime_ns", pa.int64()), ("sha256", pa.string()),
                    ("seen_at", pa.timestamp("us", tz="UTC")), ("outcome", pa.string())])
KEPT, FILTERED, NEAR_DUPLICATE, DEAD_LETTERED = "kept", "filtered", "near-duplicate", "dead-lettered"
OUTCOMES = (KEPT, FILTERED, NEAR_DUPLICATE, DEAD_LETTERED)


def empty() -> pa.Table:
    return SCHEMA.empty_table()


@dataclass(frozen=True)
class Diff:
    """Paths of a listing against the previous manifest (see the module docstring)."""

    new: tuple[str, ...]
    suspect: tuple[str, ...]
    unchanged: tuple[str, ...]
    retry: tuple[str, ...]
    deleted: tuple[str, ...]


def diff(listing: pa.Table, previous: pa.Table, retry_dead_letters: bool = False) -> Diff:
    """Compare ``listing`` with ``previous`` (see the module docstring)."""
    prev = previous.select(["path", "size", "mtime_ns", "outcome"]).rename_columns(["path", "prev_size", "prev_mtime_ns", "outcome"])
    joined = listing.select(["path", "size", "mtime_ns"]).join(prev, "path", join_type="left outer")
    known = pc.is_valid(joined["prev_size"])
    same = pc.and_(known, pc.and_(pc.equal(joined["size"], joined["prev_size"]), pc.equal(joined["mtime_ns"], joined["prev_mtime_ns"])))
    same = pc.fill_null(same, False)
    dead = pc.fill_null(pc.equal(joined["outcome"], DEAD_LETTERED), False)
    retry = pc.and_(same, dead) if retry_dead_letters else pa.repeat(False, joined.num_rows)
    paths = joined["path"]

    def where(mask: pa.Array | pa.ChunkedArray) -> tuple[str, ...]:
        return tuple(sorted(pc.filter(paths, mask).to_pylist()))

    listed = pa.table({"path": listing["path"]})
    deleted = previous.select(["path"]).join(listed, "path", join_type="left anti")
    return Diff(new=where(pc.invert(known)), suspect=where(pc.and_(known, pc.invert(same))),
                unchanged=where(pc.and_(same, pc.invert(retry))), retry=where(retry),
                deleted=tuple(sorted(deleted["path"].to_pylist())))
