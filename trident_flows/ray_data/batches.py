"""What a Ray Data UDF gets and gives, converted with pyarrow and numpy alone wherever that is what Ray Data does.

Contract (the same four conversions as ``internals``, with the same results):
- ``batch_of(table, batch_format, copy)``: a ``map_batches`` UDF's batch; ``rows_of(table)``: the
  rows a ``map`` / ``filter`` / ``flat_map`` UDF gets; ``block_of_batch`` / ``block_of_rows``: UDF
  outputs as Arrow blocks.
- Plain data (no extension type in; a ``pyarrow.Table``, dicts of 1-D numpy arrays of booleans,
  numbers or strings, or rows of scalars out) is converted here step by step as Ray Data
  (``internals.RAY_VERSION``) does it; anything else goes to Ray Data's own conversion, imported
  on first use, so a replica that only meets plain data never imports Ray Data.
- ``Warming(ray_data)`` readies the conversions on a background thread; ``wait()`` re-raises its error.
- ``has_extension_fields`` / ``has_unregistered_extension`` inspect a schema;
  ``register_ray_data_types()`` imports Ray Data so its types decode.
"""

from __future__ import annotations

import threading
from typing import Any, Iterable, Mapping

import numpy as np
import pyarrow as pa

from trident_flows.ray_data import internals
from trident_flows.ray_data.rows import decode_rows, encode_rows

# Ray Data converts a column of this name to a tensor whatever it holds (ray.data.constants.TENSOR_COLUMN_NAME)
TENSOR_COLUMN = "__value__"
# Ray Data switches strings and bytes longer than this to the large_* Arrow types
INT32_MAX = 2**31 - 1
_EXTENSION_KEY = b"ARROW:extension:name"
_ROW_VALUE_TYPES = (bool, int, float, str, bytes, type(None))
# Ray Data's block builder compacts rows into separate tables once their estimated serialized size
# reaches 128 MiB (then concatenates the tables, promoting types): rows well below that (each row
# counted as 4 KiB plus twice its strings and bytes) are built in one go, as here
ROWS_IN_ONE_TABLE_BYTES = 64 * 2**20


# ---------------------------------------------------------------------------- which data is plain
def _fields(field: pa.Field) -> Iterable[pa.Field]:
    yield field
    for i in range(field.type.num_fields):
        yield from _fields(field.type.field(i))


def _unregistered(field: pa.Field) -> bool:
    return bool(field.metadata) and _EXTENSION_KEY in field.metadata


def has_extension_fields(schema: pa.Schema) -> bool:
    """Whether any (nested) field is an extension type or carries an unregistered one's metadata."""
    return any(isinstance(f.type, pa.BaseExtensionType) or _unregistered(f) for top in schema for f in _fields(top))


def has_unregistered_extension(schema: pa.Schema) -> bool:
    """Whether any (nested) field was decoded as the storage of an extension type not registered here."""
    return any(_unregistered(f) for top in schema for f in _fields(top))


def register_ray_data_types() -> None:
    """Import Ray Data: it registers its Arrow extension types (tensors, pickled objects)."""
    import ray.data  # noqa: F401 - imported for the registration it does


def _plain_numpy_column(name: str, values: Any) -> bool:
    if name == TENSOR_COLUMN or not isinstance(values, np.ndarray) or values.ndim != 1 or len(values) == 0:
        return False
    if values.dtype.kind in "biufU":
        return True
    return values.dtype == object and all(type(v) is str and len(v) <= INT32_MAX for v in values)


def _plain_rows(rows: list[Any]) -> bool:
    size = 0
    for row in rows:
        if type(row) is not dict or TENSOR_COLUMN in row or not all(type(v) in _ROW_VALUE_TYPES for v in row.values()):
            return False
        size += 4096 + 2 * sum(len(v) for v in row.values() if type(v) in (str, bytes))
    return size < ROWS_IN_ONE_TABLE_BYTES


# ---------------------------------------------------------------------------- in: what the UDF gets
def _column_numpy(column: pa.ChunkedArray) -> np.ndarray:
    # as Ray Data's ArrowBlockAccessor.to_numpy: all-null columns become float32 NaN; one chunk is
    # converted as it is, several are combined first (a plain column never reaches 2 GiB here: a
    # batch holds rows that each travelled as one Arrow message)
    if pa.types.is_null(column.type):
        return np.full(len(column), np.nan, dtype=np.float32)
    if column.num_chunks == 0:
        return pa.array([], type=column.type).to_numpy(zero_copy_only=False)
    array = column if column.num_chunks == 1 else column.combine_chunks()
    return array.to_numpy(zero_copy_only=False)


def batch_of(table: pa.Table, batch_format: str, copy: bool) -> Any:
    """The batch a ``map_batches`` UDF gets for these rows (``copy``: ``zero_copy_batch=False``)."""
    if batch_format == "pyarrow":
        return table
    if batch_format != "numpy" or has_extension_fields(table.schema):
        return internals.batch_of(table, batch_format, copy)
    batch = {name: _column_numpy(table.column(i)) for i, name in enumerate(table.column_names)}
    return {k: np.array(v, copy=True) for k, v in batch.items()} if copy else batch


def rows_of(table: pa.Table) -> Iterable[dict[str, Any]]:
    """The rows a ``map`` / ``filter`` / ``flat_map`` UDF gets for these rows."""
    if has_extension_fields(table.schema):
        return internals.rows_of(table)
    return table.to_pylist()


# ---------------------------------------------------------------------------- out: what the UDF gives
def _arrow_array(values: Any) -> pa.Array:
    # as Ray Data's convert_to_pyarrow_array for plain values: the type pyarrow infers, then the array
    return pa.array(values, type=pa.infer_type(values))


def block_of_batch(batch: Any) -> pa.Table:
    """A ``map_batches`` UDF's output batch as the Arrow block Ray Data makes of it."""
    if isinstance(batch, pa.Table):
        return batch
    if (isinstance(batch, dict) and batch and all(_plain_numpy_column(k, v) for k, v in batch.items())
            and len({len(v) for v in batch.values()}) == 1):
        return pa.Table.from_pydict({k: _arrow_array(v) for k, v in batch.items()})
    return internals.block_of_batch(batch)


def block_of_rows(rows: list[Mapping[str, Any]]) -> pa.Table:
    """A ``map`` / ``flat_map`` UDF's output rows as the Arrow block Ray Data makes of them."""
    if not rows:
        return pa.table({})
    if not _plain_rows(rows):
        return internals.block_of_rows(rows)
    # as Ray Data's block builder: columns in order of first appearance, None where a row lacks one
    columns: dict[str, list[Any]] = {}
    for k, row in enumerate(rows):
        for name in row:
            if name not in columns:
                columns[name] = [None] * k
        for name, values in columns.items():
            values.append(row.get(name))
    try:
        return pa.Table.from_pydict({k: _arrow_array(v) for k, v in columns.items()})
    except (pa.ArrowException, TypeError, ValueError):
        # values pyarrow cannot put in one column (e.g. True and 2): Ray Data falls back to Python objects
        return internals.block_of_rows(rows)


# ---------------------------------------------------------------------------- readying them
class Warming:
    """The conversions readied on a background thread, started by a replica before it builds its UDFs:
    it imports Ray Data's conversions when the replica will need them (``ray_data=True``), then
    converts one small batch each way, which makes pyarrow import pandas (a fraction of a second of
    CPU). ``wait()`` blocks until that is done (re-raising its error). Done at the first batch
    instead, each stage of a pipeline would pay it in turn while the batch waited."""

    def __init__(self, ray_data: bool) -> None:
        self.ray_data = ray_data
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="trident-ray-data-warm-up", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            if self.ray_data:
                internals.import_conversions()
            table = decode_rows(encode_rows(pa.table({"id": ["a"], "x": [1.0]})))
            block_of_batch(batch_of(table, "numpy", copy=False))
            block_of_rows(list(rows_of(table)))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the thread that needs the conversions
            self._error = exc

    def wait(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise RuntimeError(f"readying the Ray Data batch conversions failed: {self._error}") from self._error
