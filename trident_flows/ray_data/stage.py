"""``RayDataStage``: one stage of a user's Ray Data pipeline (or a run of fused stages), run unchanged as a trident operator.

Contract (the operator shape of ``runtime.spec``):
- ``RayDataStage(config, *, stages)`` cold-starts each UDF as Ray Data would (a callable class
  built once per replica); fused stages run one after the other, rows a stage marks not reaching
  the next. ``config`` is trident's: the replica holds the CPUs/GPUs it says.
- The UDF gets exactly what Ray Data gives it (``map_batches``: a batch in its ``batch_format``;
  ``map`` / ``filter`` / ``flat_map``: one row dict); outputs become Arrow blocks.
- Lineage for exactly-once accounting: same-count outputs keep ids; ``filter`` marks dropped rows
  ``_drop="filter:<stage>"``; ``flat_map`` outputs get ``<id>/<k>``; a ``map_batches`` that
  changes the row count gives ``<first id>/<k>`` and marks the rest. A UDF that raises fails the
  batch (retried, then the bad row dead-lettered).
- ``workload_features``, ``last_device_peak_bytes`` and ``close()`` are the UDFs' when defined.
- Conversions are readied in the background while UDFs are built (``batches.Warming``), so a
  replica is warm after max(UDF cold start, readying), not their sum.
"""

from __future__ import annotations

import collections.abc
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from trident_flows.core.types import OpConfig
from trident_flows.ray_data import batches, internals
from trident_flows.ray_data.rows import ROW, decode_rows, encode_rows
from trident_flows.runtime.spec import DROP, ID, SOURCE_ID, Batch


def _objects(values: list[Any]) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    return arr


class _Output:
    """The output batch being built: one runtime row per Ray Data output row or marked input row."""

    def __init__(self) -> None:
        self.columns: dict[str, list[Any]] = {ID: [], SOURCE_ID: [], ROW: [], DROP: []}

    def add(self, row_id: str, source: Any, blob: bytes, drop: str = "") -> None:
        for key, value in ((ID, row_id), (SOURCE_ID, source), (ROW, blob), (DROP, drop)):
            self.columns[key].append(value)

    def batch(self) -> Batch:
        return {k: _objects(v) for k, v in self.columns.items()}


class RayDataStage:
    """Runs one Ray Data stage's UDF, or a run of fused stages, in order (see the module docstring)."""

    def __init__(self, config: OpConfig, *, stages: tuple[internals.StageView, ...]) -> None:
        internals.check_ray_version()
        if not stages:
            raise ValueError("RayDataStage needs at least one Ray Data stage")
        self.config = config
        self.stages = tuple(stages)
        # the conversions get ready while the UDFs load their models; the first batch waits for them
        needs_ray_data = any(s.kind == "map_batches" and s.batch_format == "pandas" or s.predicate is not None for s in stages)
        self._warming = batches.Warming(ray_data=needs_ray_data)
        self.udfs = [s.fn(*s.fn_constructor_args, **dict(s.fn_constructor_kwargs))
                     if s.fn is not None and internals.is_callable_class(s.fn) else s.fn for s in self.stages]
        self._decoded: tuple[Any, pa.Table] | None = None

    def _table(self, batch: Batch) -> pa.Table:
        # the replica asks for the workload features and then runs the same batch object: decode once
        if self._decoded is not None and self._decoded[0] is batch:
            return self._decoded[1]
        table = self._decode(batch[ROW])
        self._decoded = (batch, table)
        return table

    def _decode(self, blobs: Any) -> pa.Table:
        self._warming.wait()
        table = decode_rows(blobs)
        if batches.has_unregistered_extension(table.schema):
            batches.register_ray_data_types()  # decoded before Ray Data registered its types: decode again with them
            table = decode_rows(blobs)
        return table

    def __call__(self, batch: Batch) -> Batch:
        table: pa.Table | None = self._table(batch)
        self._decoded = None
        ids = [str(x) for x in batch[ID]]
        sources = list(batch[SOURCE_ID]) if SOURCE_ID in batch else [None] * len(ids)
        blobs = list(batch[ROW])
        out = _Output()
        for k, (stage, udf) in enumerate(zip(self.stages, self.udfs)):
            if not ids:
                break
            step = _Output()
            getattr(self, f"_{stage.kind}")(_Call(stage, udf), table, ids, sources, blobs, step)
            last = k == len(self.stages) - 1
            ids, sources, blobs = [], [], []
            for row_id, source, blob, drop in zip(*step.columns.values()):
                if drop or last:
                    out.add(row_id, source, blob, drop)
                else:
                    ids.append(row_id)
                    sources.append(source)
                    blobs.append(blob)
            table = self._decode(blobs) if ids and not last else None
        return out.batch()

    def _map_batches(self, call: "_Call", table: pa.Table, ids: list[str], sources: list[Any], blobs: list[bytes], out: _Output) -> None:
        result = call(batches.batch_of(table, call.stage.batch_format, copy=not call.stage.zero_copy_batch))
        outputs = list(result) if isinstance(result, collections.abc.Iterator) else [result]
        blocks = [batches.block_of_batch(b) for b in outputs]
        produced = [blob for block in blocks for blob in encode_rows(block)]
        if len(produced) == len(ids):
            for row_id, source, blob in zip(ids, sources, produced):
                out.add(row_id, source, blob)
            return
        for k, blob in enumerate(produced):
            out.add(f"{ids[0]}/{k}", sources[0] if sources[0] is not None else ids[0], blob)
        reason = f"map_batches:{call.stage.name}:{len(produced)} rows out of {len(ids)}"
        for i in range(1 if produced else 0, len(ids)):
            out.add(ids[i], sources[i], blobs[i], reason)

    def _map(self, call: "_Call", table: pa.Table, ids: list[str], sources: list[Any], blobs: list[bytes], out: _Output) -> None:
        rows = [call(row) for row in batches.rows_of(table)]
        for row in rows:
            _check_row(row, call.stage.name)
        for row_id, source, blob in zip(ids, sources, encode_rows(batches.block_of_rows(rows))):
            out.add(row_id, source, blob)

    def _filter(self, call: "_Call", table: pa.Table, ids: list[str], sources: list[Any], blobs: list[bytes], out: _Output) -> None:
        if call.stage.predicate is not None:
            keep = internals.filter_mask(table, call.stage.predicate)
        else:
            keep = np.array([bool(call(row)) for row in batches.rows_of(table)], dtype=bool)
        for row_id, source, blob, kept in zip(ids, sources, blobs, keep):
            out.add(row_id, source, blob, "" if kept else f"filter:{call.stage.name}")

    def _flat_map(self, call: "_Call", table: pa.Table, ids: list[str], sources: list[Any], blobs: list[bytes], out: _Output) -> None:
        parents: list[int] = []
        rows: list[Any] = []
        for i, row in enumerate(batches.rows_of(table)):
            for child in call(row):
                _check_row(child, call.stage.name)
                parents.append(i)
                rows.append(child)
        encoded = encode_rows(batches.block_of_rows(rows)) if rows else []
        children: dict[int, list[bytes]] = {}
        for parent, blob in zip(parents, encoded):
            children.setdefault(parent, []).append(blob)
        for i, (row_id, source) in enumerate(zip(ids, sources)):
            if i not in children:
                out.add(row_id, source, blobs[i], f"flat_map:{call.stage.name}:no rows")
            for k, blob in enumerate(children.get(i, [])):
                out.add(f"{row_id}/{k}", source if source is not None else row_id, blob)

    # ------------------------------------------------------------------ optional UDF hooks
    def workload_features(self, batch: Batch) -> dict[str, float]:
        """The first UDF's own ``workload_features`` of the batch it gets (none when it has none)."""
        stage, udf = self.stages[0], self.udfs[0]
        features = getattr(udf, "workload_features", None)
        if not callable(features) or len(batch[ID]) == 0:
            return {}
        fmt = stage.batch_format if stage.kind == "map_batches" else "numpy"
        return dict(features(batches.batch_of(self._table(batch), fmt, copy=False)))

    @property
    def last_device_peak_bytes(self) -> int:
        return max(int(getattr(u, "last_device_peak_bytes", 0) or 0) for u in self.udfs)

    @last_device_peak_bytes.setter
    def last_device_peak_bytes(self, value: int) -> None:
        for udf in self.udfs:
            if hasattr(udf, "last_device_peak_bytes"):
                udf.last_device_peak_bytes = value

    def close(self) -> None:
        for udf in self.udfs:
            close = getattr(udf, "close", None)
            if callable(close):
                close()


@dataclass(frozen=True)
class _Call:
    """One stage's UDF instance with its call arguments."""

    stage: internals.StageView
    udf: Any

    def __call__(self, item: Any) -> Any:
        return self.udf(item, *self.stage.fn_args, **dict(self.stage.fn_kwargs))


def _check_row(row: Any, stage: str) -> None:
    if not isinstance(row, collections.abc.Mapping):
        raise ValueError(f"stage {stage!r} returned {type(row).__name__} for a row; Ray Data needs a dict per row "
                         "(return {'item': value} instead of value)")
