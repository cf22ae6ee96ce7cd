"""The sink's writer: an actor on the runner's node that fetches stored rows and writes them.

Contract:
- ``SinkWriter(out_dir)`` wraps one ``sink.Sink``; the runner creates it on its own node (the
  output directory is the runner's) with no CPU reserved, and calls it in order, so a shard's
  parts are written before its commit.
- ``write_part(shard_id, pieces, dead)`` fetches the rows of ``pieces`` (``payload.Piece``: the
  rows to write, in order) here, not in the runner, and writes them as one staging part with the
  dead-letter records. Pieces whose object is gone are left out and their indices returned, so
  the runner produces those rows again before the shard commits; nothing else is written twice.
- ``commit`` / ``discard`` are ``Sink``'s. An error the sink raises (``OutputWriteError``
  naming the path) reaches the caller as that error, not wrapped in Ray's task error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ray

from trident_flows.runtime.payload import LostPieces, Piece, rows_of
from trident_flows.runtime.sink import Sink


class SinkWriter:
    """The writer actor's body (see the module docstring)."""

    def __init__(self, out_dir: str) -> None:
        self.sink = Sink(Path(out_dir))

    def write_part(self, shard_id: str, pieces: list[Piece], dead: list[dict[str, Any]]) -> tuple[int, ...]:
        lost: tuple[int, ...] = ()
        try:
            rows = rows_of(pieces)
        except LostPieces as exc:
            lost = exc.lost
            rows = rows_of([p for k, p in enumerate(pieces) if k not in set(lost)])
        self.sink.write_part(shard_id, rows, dead)
        return lost

    def commit(self, shard_id: str) -> dict[str, int]:
        return self.sink.commit(shard_id)

    def discard(self, shard_id: str) -> None:
        self.sink.discard(shard_id)

    def close(self) -> None:
        self.sink.close()


SinkWriterActor = ray.remote(num_cpus=0, max_restarts=0)(SinkWriter)


async def call(method: Any, *args: Any) -> Any:
    """Await ``method.remote(*args)`` on the writer, raising the sink's own error rather than Ray's wrapper."""
    try:
        return await method.remote(*args)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, Exception):
            raise cause from None
        raise
