"""What the runner and a replica send each other per batch, compactly, and what it costs in bytes.

Contract:
- Inputs (runner -> replica): ``source_message(rows)`` (the source's rows by value),
  ``piece_message(pieces)`` (``(ref, rows)`` pairs, runs of rows as ``range``s); each returns the
  message and its size. ``items_message(items)`` picks between them for queued items.
- Reply (replica -> runner): ``encode_reply`` packs the outline (relative to the input ids), the
  measurements, the error and lost pieces into one ``bytes``; ``decode_reply`` unpacks it into a
  ``ReplicaResult`` whose ``BatchSample`` the runner completes with what it knows itself.
- ``serialised_size(value)``: exactly what Ray's serialiser writes for ``value`` as one call
  argument; ``bytes`` count as their length. Ray's per-call envelope is not counted.
"""

from __future__ import annotations

import array
import pickle
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import ray

from trident_flows.core.types import BatchSample, OpConfig, Outcome
from trident_flows.runtime.payload import Outline, Piece

if TYPE_CHECKING:
    from trident_flows.runtime.work_queue import Item

# A run of row indices longer than this travels as a range (about 30 bytes) instead of a tuple
# (about 2 bytes a row).
_RUN_MIN = 12


@dataclass(frozen=True)
class ReplicaResult:
    """A replica's reply as the runner reads it: the output's outline (``None`` when the batch
    failed), its sample, the error, and the input pieces whose object is gone (``lost``)."""

    output: Outline | None
    sample: BatchSample
    error: str = ""
    lost: tuple[int, ...] = ()

    @property
    def ok(self) -> bool:
        return self.output is not None


@dataclass(frozen=True)
class Measured:
    """What a replica measured on one batch (the rest of a ``BatchSample`` the runner knows)."""

    start: float
    busy_s: float
    items_in: int
    items_out: int
    features: dict[str, float]
    peak_host_mem_bytes: int
    peak_device_mem_bytes: int
    outcome: Outcome
    error: str = ""


def serialised_size(value: Any) -> int:
    """Bytes Ray's serialiser writes for ``value`` as one call argument or return value (Ray has
    no public call for this; its version is pinned)."""
    if isinstance(value, bytes):
        return len(value)
    return ray._private.worker.global_worker.get_serialization_context().serialize(value).total_bytes


def source_message(rows: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """The source's rows as sent by value, and their size."""
    message = list(rows)
    return message, serialised_size(message)


def _compact_rows(rows: Sequence[int]) -> range | tuple[int, ...]:
    if len(rows) > _RUN_MIN and all(b == a + 1 for a, b in zip(rows, rows[1:])):
        return range(rows[0], rows[-1] + 1)
    return tuple(rows)


def piece_message(pieces: Sequence[Piece]) -> tuple[list[tuple[Any, Sequence[int]]], int]:
    """Pieces as sent (plain ``(ref, rows)`` pairs), and their size."""
    pairs = [(p.ref, _compact_rows(p.rows)) for p in pieces]
    return pairs, serialised_size(pairs)


def items_message(items: Sequence["Item"]) -> tuple[list[Any], list[list["Item"]], int]:
    """What a replica (or the sink's writer) is sent for ``items``: source rows by value, produced rows
    as pieces (one per run of rows from the same stored batch); the items behind each piece; and the
    bytes this serialises."""
    if all(it.ref is None for it in items):
        rows, size = source_message([it.row for it in items])
        return rows, [list(items)], size
    groups: list[list[Item]] = []
    for it in items:
        if groups and groups[-1][0].ref is it.ref:
            groups[-1].append(it)
        else:
            groups.append([it])
    pairs, size = piece_message([Piece(g[0].ref, tuple(it.index for it in g)) for g in groups])
    return pairs, groups, size


def encode_reply(output: Outline | None, input_ids: Sequence[str], measured: Measured, error: str = "",
                 lost: Sequence[int] = ()) -> bytes:
    """A replica's reply as it travels (see the module docstring)."""
    outline = None
    if output is not None:
        sizes = output.nbytes
        outline = (None if list(output.ids) == list(input_ids) else output.ids,
                   None if all(s is None for s in output.source_ids) else output.source_ids,
                   tuple(j for j, d in enumerate(output.drop) if d),
                   tuple((j, e) for j, e in enumerate(output.error) if e),
                   sizes[0] if sizes and all(s == sizes[0] for s in sizes) else array.array("q", sizes).tobytes(),
                   len(output), output.stored_bytes)
    m = measured
    sample = (m.start, m.busy_s, m.items_in, m.items_out, m.features or None, m.peak_host_mem_bytes, m.peak_device_mem_bytes,
              m.outcome.value, m.error)
    return pickle.dumps((outline, sample, error, tuple(lost)), protocol=5)


def decode_reply(blob: bytes, input_ids: Sequence[str], operator: str, replica_id: str, config: OpConfig, epoch: int,
                 inflight: int) -> ReplicaResult:
    """The ``ReplicaResult`` of a reply to a batch whose input ids were ``input_ids``."""
    outline, sample, error, lost = pickle.loads(blob)
    start, busy, items_in, items_out, features, host, device, outcome, sample_error = sample
    batch_sample = BatchSample(operator=operator, replica_id=replica_id, config=config, start=start, end=start + busy, busy_s=busy,
                               items_in=items_in, items_out=items_out, features=features or {}, peak_host_mem_bytes=host,
                               peak_device_mem_bytes=device, outcome=Outcome(outcome), config_epoch=epoch, inflight=inflight,
                               error=sample_error)
    output = None
    if outline is not None:
        ids, source_ids, drops, errors, sizes, n, stored_bytes = outline
        ids = tuple(input_ids) if ids is None else ids
        by_row = dict(errors)
        dropped = set(drops)
        nbytes = (sizes,) * n if isinstance(sizes, int) else tuple(array.array("q", sizes))
        output = Outline(None, ids, source_ids or (None,) * n, tuple(j in dropped for j in range(n)),
                         tuple(by_row.get(j, "") for j in range(n)), nbytes, stored_bytes=stored_bytes)
    return ReplicaResult(output, batch_sample, error, lost)
