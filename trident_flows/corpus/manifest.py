"""The manifest of a corpus: every file seen, and what a new listing changes in it.

Contract:
- A manifest is an Arrow table with ``SCHEMA``: ``path`` (relative, unique), ``id`` (the path),
  ``size``, ``mtime_ns``, ``sha256`` (of the bytes last processed), ``seen_at`` (UTC) and
  ``outcome`` (``OUTCOMES``).
- ``diff(listing, previous, retry_dead_letters)`` returns a ``Diff`` of paths: ``new``, ``suspect``
  (size or mtime differ: hashed to tell changed from touched), ``unchanged``, ``retry`` (unchanged
  but dead-lettered, with ``retry_dead_letters``) and ``deleted``; every listed path is in exactly
  one of the first four. It works on whole Arrow columns.
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
