"""How a Ray Data row travels through the trident runtime: as one Arrow IPC message per row.

Contract:
- The runtime moves rows as dicts of plain values between operators and re-stacks them into
  numpy batches, which would change Arrow types (float32 -> float64, tensors -> lists, ...).
  A Ray Data pipeline's row therefore travels in one binary column, ``ROW``: the row as a
  one-row Arrow table, so every stage and the final output see exactly the types Ray Data
  would give them.
- ``encode_rows(table) -> list[bytes]`` (one message per row) and ``decode_rows(blobs) ->
  pa.Table`` (the rows concatenated, schemas unified the way ``pa.concat_tables(...,
  promote_options="permissive")`` does) are inverses.
"""

from __future__ import annotations

from typing import Iterable

import pyarrow as pa

ROW = "_ray_data_row"


def encode_rows(table: pa.Table) -> list[bytes]:
    out = []
    for i in range(table.num_rows):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table.slice(i, 1))
        out.append(sink.getvalue().to_pybytes())
    return out


def decode_rows(blobs: Iterable[bytes]) -> pa.Table:
    tables = [pa.ipc.open_stream(pa.py_buffer(b)).read_all() for b in blobs]
    if not tables:
        return pa.table({})
    if all(t.schema == tables[0].schema for t in tables[1:]):
        return pa.concat_tables(tables)
    return pa.concat_tables(tables, promote_options="permissive")
