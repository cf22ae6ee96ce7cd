"""Batches by reference: an operator's output stays in Ray's object store; the runner holds its outline.

Contract:
- A replica returns its output batch as a second return value (it stays in its node's object
  store, owned by the runner, and outlives the replica) and an ``Outline``: per output row its id,
  ``source_id``, ``_drop``/``_error`` marks and size. The runner routes, traces lineage,
  dead-letters and bounds its queues with outlines only; it never deserialises a payload.
- ``stored(batch, rows_bytes)`` keeps even a small batch out of Ray's inline returns; ``fetch``
  reads a ``Stored`` or a plain stored batch.
- ``Piece(ref, rows)``: rows of a stored batch. A batch sent to a replica is a list of pieces or
  of rows by value (the source's); ``assemble(inputs)`` builds it exactly as ``rows_to_batch`` of
  the routed rows. ``clean_row(batch, j)`` is the one definition of a routed row.
- A piece whose object is gone (its node died) raises ``LostPieces`` naming the pieces, so the
  runner can produce those rows again from their input items.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from typing import Any, NamedTuple, Sequence

import numpy as np
import ray

from trident_flows.runtime.spec import DROP, ERROR, ID, SOURCE_ID, Batch, rows_to_batch

# Ray returns an object smaller than this inline to the caller instead of through the object store.
# With the 1 KB payloads of ``bench dataplane`` (batches of 64 KB) that was 6.6 KB per item through
# the runner before batches were filled up to it.
INLINE_BYTES = int(os.environ.get("RAY_max_direct_call_object_size", 100 * 1024))
# Filled beyond INLINE_BYTES by this much: Ray's serialised size differs from the pickled size by
# tens of bytes (its msgpack frame).
_FILLER_MARGIN = 4096


class Piece(NamedTuple):
    """Rows ``rows`` (indices) of the batch stored at ``ref``."""

    ref: Any
    rows: Sequence[int]


@dataclass(frozen=True)
class Outline:
    """What the runner knows of an output batch: the reference and per row its id, lineage,
    marks (``drop``: filtered; ``error``: the reason it failed, or empty) and size in bytes.
    ``stored_bytes``: the size of the stored object (the rows' sizes and the filler)."""

    ref: Any
    ids: tuple[str, ...]
    source_ids: tuple[str | None, ...]
    drop: tuple[bool, ...]
    error: tuple[str, ...]
    nbytes: tuple[int, ...]
    stored_bytes: int = 0

    def __len__(self) -> int:
        return len(self.ids)


class LostPieces(Exception):
    """Pieces of an input batch whose stored object is gone (indices into the piece list)."""

    def __init__(self, lost: Sequence[int], reason: str) -> None:
        super().__init__(f"{len(lost)} input piece(s) lost: {reason}")
        self.lost = tuple(lost)


def _scalar(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def clean_row(batch: Batch, j: int) -> dict[str, Any]:
    """Row ``j`` of ``batch`` as it is routed on (see the module docstring)."""
    row = {k: _scalar(v[j]) for k, v in batch.items()}
    row[ID] = str(row[ID])
    row.pop(ERROR, None)
    if not row.get(DROP):
        row.pop(DROP, None)
    return row


def row_bytes(row: dict[str, Any]) -> int:
    """Rough in-memory size of one row (what queue byte bounds count)."""
    total = 64
    for value in row.values():
        if isinstance(value, np.ndarray):
            total += value.nbytes
        elif isinstance(value, (str, bytes)):
            total += len(value)
        else:
            total += 8
    return total


def check_batch(operator: str, out: Batch) -> int:
    """The row count of an operator's output batch; refuses one without ids or with ragged columns."""
    if ID not in out:
        raise ValueError(f"operator {operator!r} returned a batch without the {ID!r} column")
    n = len(out[ID])
    if any(len(v) != n for v in out.values()):
        raise ValueError(f"operator {operator!r} returned columns of different lengths")
    return n


def outline(operator: str, out: Batch) -> Outline:
    """The outline of an output batch, without its reference yet (validated by ``check_batch``)."""
    n = check_batch(operator, out)
    ids, sources, drops, errors, sizes = [], [], [], [], []
    for j in range(n):
        source = out[SOURCE_ID][j] if SOURCE_ID in out else None
        error = out[ERROR][j] if ERROR in out else None
        ids.append(str(_scalar(out[ID][j])))
        sources.append(None if source is None else str(_scalar(source)))
        errors.append(str(error) if error else "")
        drops.append(not errors[-1] and bool(out[DROP][j]) if DROP in out else False)
        sizes.append(row_bytes(clean_row(out, j)))
    return Outline(None, tuple(ids), tuple(sources), tuple(drops), tuple(errors), tuple(sizes))


@dataclass(frozen=True)
class Stored:
    """An output batch as it stays in the object store (see ``stored``)."""

    batch: Batch
    filler: np.ndarray | None = None

    @property
    def filler_bytes(self) -> int:
        return 0 if self.filler is None else int(self.filler.nbytes)


def stored(out: Batch, rows_bytes: int) -> Stored:
    """``out`` as a replica returns it: with zeros enough to stay out of Ray's inline returns.

    Ray returns a value smaller than its ``max_direct_call_object_size`` (``INLINE_BYTES``, 100 KiB by default)
    inline to the caller instead of through the object store; the filler keeps every batch in the object store of
    the replica's node however small (it then moves between nodes as an object of at least ``INLINE_BYTES``:
    ``Outline.stored_bytes``). Where a cluster's ``_system_config`` raises the setting beyond what the replica's
    environment says, small batches do pass through the runner."""
    if rows_bytes >= 2 * INLINE_BYTES:
        return Stored(out)
    short = INLINE_BYTES + _FILLER_MARGIN - len(pickle.dumps(out, protocol=5))
    return Stored(out, np.zeros(short, np.uint8) if short > 0 else None)


def fetch(pieces: Sequence[Piece]) -> list[Batch]:
    """The stored batch of each piece (one fetch per distinct object); ``LostPieces`` for the gone ones."""
    pieces = [Piece(*p) for p in pieces]
    refs = list({id(p.ref): p.ref for p in pieces}.values())
    try:
        values = ray.get(refs)
    except ray.exceptions.ObjectLostError as exc:
        gone = set()
        for ref in refs:
            try:
                ray.get(ref)
            except ray.exceptions.ObjectLostError:
                gone.add(ref.binary())
        raise LostPieces([k for k, p in enumerate(pieces) if p.ref.binary() in gone], f"{type(exc).__name__}") from None
    by_ref = {ref.binary(): value.batch if isinstance(value, Stored) else value for ref, value in zip(refs, values)}
    return [by_ref[p.ref.binary()] for p in pieces]


def assemble(inputs: Sequence[Piece] | Sequence[dict[str, Any]] | Batch) -> Batch:
    """The batch a replica runs: ``inputs`` itself when it is a batch, the batch of rows sent by
    value, else the pieces' rows in order."""
    if isinstance(inputs, dict):
        return inputs
    if inputs and isinstance(inputs[0], dict):
        return rows_to_batch(list(inputs))
    return rows_to_batch(rows_of(inputs))


def rows_of(pieces: Sequence[Piece]) -> list[dict[str, Any]]:
    """The routed rows of pieces, in order (what the sink writes); ``LostPieces`` for gone ones."""
    return [clean_row(batch, j) for (_, rows), batch in zip(pieces, fetch(pieces)) for j in rows]
