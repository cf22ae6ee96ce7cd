"""Batches by reference: an operator's output stays in Ray's object store; the runner holds its outline.

Contract:
- A replica returns its output batch as a second return value (so it stays in the object store
  of the replica's node, owned by the runner, the caller, and outlives the replica that made it)
  and an ``Outline``: per output row its id, ``source_id``, ``_drop``/``_error`` marks and size;
  the runner adds the reference. The runner routes rows, traces lineage, dead-letters and bounds
  its queues with outlines only; it never deserialises a payload. Ray returns an object under
  ``INLINE_BYTES`` inline to its caller, so a small batch does pass through the runner's memory
  (``Outline.inline_bytes`` says how many bytes).
- ``Piece(ref, rows)``: rows ``rows`` of the stored batch ``ref``. A batch sent to a replica is a
  list of pieces (several upstream outputs, or the rows of a retried half) or rows by value (the
  source's rows, which the runner reads itself). ``assemble(pieces)`` (in the replica, where the
  data goes) fetches them and builds the batch exactly as ``rows_to_batch`` of the routed rows.
- ``clean_row(batch, j)`` is the one definition of a routed row: scalars unwrapped, ``id`` a
  str, ``_error`` removed, ``_drop`` kept only when set (the sink writes it as the reason).
- A piece whose object is gone (its node died) raises ``LostPieces`` naming the pieces, so the
  runner can produce those rows again from their input items.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import ray

from trident_flows.runtime.spec import DROP, ERROR, ID, SOURCE_ID, Batch, rows_to_batch

# Bytes of one reference as the runner sends it: the 28-byte object id plus its owner's address
# (worker id, node IP, port: ~80 bytes in Ray 2.x's serialised ObjectRef), rounded up.
REF_WIRE_BYTES = 128
# Ray returns an object smaller than this inline to the caller instead of through the object store
# (its ``max_direct_call_object_size``, 100 KiB unless set in the environment of the cluster).
INLINE_BYTES = int(os.environ.get("RAY_max_direct_call_object_size", 100 * 1024))


@dataclass(frozen=True)
class Piece:
    """Rows ``rows`` (indices) of the batch stored at ``ref``."""

    ref: Any
    rows: tuple[int, ...]


@dataclass(frozen=True)
class Outline:
    """What the runner knows of an output batch: the reference and per row its id, lineage,
    marks (``drop``: filtered; ``error``: the reason it failed, or empty) and size in bytes.
    ``wire_bytes``: the pickled size of this outline (what it costs to return); ``inline_bytes``:
    the pickled size of the batch when Ray returns it inline to the runner, else 0."""

    ref: Any
    ids: tuple[str, ...]
    source_ids: tuple[str | None, ...]
    drop: tuple[bool, ...]
    error: tuple[str, ...]
    nbytes: tuple[int, ...]
    wire_bytes: int = 0
    inline_bytes: int = 0

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
    fields = (tuple(ids), tuple(sources), tuple(drops), tuple(errors), tuple(sizes))
    inline = len(pickle.dumps(out, protocol=5)) if sum(sizes) < 2 * INLINE_BYTES else 0
    return Outline(None, *fields, wire_bytes=len(pickle.dumps(fields, protocol=5)) + REF_WIRE_BYTES,
                   inline_bytes=inline if inline < INLINE_BYTES else 0)


def fetch(pieces: Sequence[Piece]) -> list[Batch]:
    """The stored batch of each piece (one fetch per distinct object); ``LostPieces`` for the gone ones."""
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
    by_ref = {ref.binary(): value for ref, value in zip(refs, values)}
    return [by_ref[p.ref.binary()] for p in pieces]


def assemble(inputs: Sequence[Piece] | Batch) -> Batch:
    """The batch a replica runs: ``inputs`` itself when sent by value, else the pieces' rows in order."""
    if isinstance(inputs, dict):
        return inputs
    rows = [clean_row(batch, j) for piece, batch in zip(inputs, fetch(inputs)) for j in piece.rows]
    return rows_to_batch(rows)


def rows_of(pieces: Sequence[Piece]) -> list[dict[str, Any]]:
    """The routed rows of pieces, in order (what the sink writes); ``LostPieces`` for gone ones."""
    return [clean_row(batch, j) for piece, batch in zip(pieces, fetch(pieces)) for j in piece.rows]
