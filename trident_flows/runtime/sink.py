"""The sink: atomic Parquet output per shard, the dead-letter table, and reading outputs back.

Contract:
- Layout under ``out_dir``: ``data/shard=<id>.parquet`` (kept and ``_drop``-marked rows) and
  ``dead_letter/shard=<id>.parquet`` (``id, source_id, shard, operator, error, attempts``);
  ``_staging/`` holds parts of running shards and is never read.
- ``commit`` combines a shard's staged parts into its final files, each written under a temporary
  name and renamed, then writes its marker ``_committed/shard=<id>.json``: readers only see whole
  shards, and committing a shard again replaces its files (never duplicated rows).
- A failed write removes its temporary file and raises ``OSError`` naming the path.
- ``account(out_dir)`` reads the committed outputs back and counts items, rows and duplicate ids.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from trident_flows.core.output_errors import naming_the_path
from trident_flows.runtime.resume import remove_marker, write_marker
from trident_flows.runtime.spec import DROP, ID, SOURCE_ID

_SHARD_RE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
DEAD_SCHEMA = pa.schema([("id", pa.string()), ("source_id", pa.string()), ("shard", pa.string()), ("operator", pa.string()),
                         ("error", pa.string()), ("attempts", pa.int64())])


def check_shard_id(shard_id: str) -> str:
    if not isinstance(shard_id, str) or not _SHARD_RE.match(shard_id):
        raise ValueError(f"shard id {shard_id!r} must be 1-128 characters of letters, digits, '.', '_' or '-'")
    return shard_id


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def rows_to_table(rows: Iterable[Mapping[str, Any]]) -> pa.Table:
    """Rows to an Arrow table; a column whose values Arrow cannot type together is stored as JSON text."""
    plain = [{k: _plain(v) for k, v in row.items()} for row in rows]
    # Union of the rows' keys: from_pylist alone keeps only the first row's columns, which loses the
    # later operators' columns of kept rows when a part starts with a row dropped earlier.
    union = list(dict.fromkeys(k for row in plain for k in row))
    plain = [{k: row.get(k) for k in union} for row in plain]
    try:
        return pa.Table.from_pylist(plain)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        columns = sorted({k for row in plain for k in row})
        arrays = {}
        for col in columns:
            values = [row.get(col) for row in plain]
            try:
                arrays[col] = pa.array(values)
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                arrays[col] = pa.array([None if v is None else json.dumps(v, default=str) for v in values], pa.string())
        return pa.table(arrays)


def _atomic_write(table: pa.Table, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with naming_the_path(path):
        try:
            pq.write_table(table, tmp)
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise


class Sink:
    """Writes one run's outputs (see the module docstring). Not thread-safe per shard: the runner
    calls ``write_part`` / ``commit`` for one shard from one task at a time."""

    def __init__(self, out_dir: Path | str) -> None:
        self.out_dir = Path(out_dir)
        self.data_dir = self.out_dir / "data"
        self.dead_dir = self.out_dir / "dead_letter"
        self.staging = self.out_dir / "_staging" / uuid.uuid4().hex
        for d in (self.data_dir, self.dead_dir, self.staging):
            d.mkdir(parents=True, exist_ok=True)

    def _stage_dir(self, shard_id: str) -> Path:
        return self.staging / f"shard={shard_id}"

    def write_part(self, shard_id: str, rows: list[dict[str, Any]], dead: list[dict[str, Any]]) -> None:
        """Write one staging part of a running shard (rows and dead-letter records)."""
        stage = self._stage_dir(shard_id)
        part = uuid.uuid4().hex
        with naming_the_path(stage):
            stage.mkdir(parents=True, exist_ok=True)
            if rows:
                _atomic_write(rows_to_table(rows), stage / f"data-{part}.parquet")
            if dead:
                _atomic_write(pa.Table.from_pylist(dead, schema=DEAD_SCHEMA), stage / f"dead-{part}.parquet")

    def discard(self, shard_id: str) -> None:
        """Forget the staging parts and the commit marker of a shard (it is being re-run from the start)."""
        with naming_the_path(self.out_dir):
            remove_marker(self.out_dir, shard_id)
        shutil.rmtree(self._stage_dir(shard_id), ignore_errors=True)

    def commit(self, shard_id: str) -> dict[str, int]:
        """Combine a finished shard's parts into its final files (atomically, replacing earlier ones)."""
        with naming_the_path(self.out_dir):
            return self._commit(shard_id)

    def _commit(self, shard_id: str) -> dict[str, int]:
        remove_marker(self.out_dir, shard_id)
        stage = self._stage_dir(shard_id)
        data_parts = sorted(stage.glob("data-*.parquet")) if stage.exists() else []
        dead_parts = sorted(stage.glob("dead-*.parquet")) if stage.exists() else []
        data = (pa.concat_tables([pq.read_table(p) for p in data_parts], promote_options="permissive") if data_parts
                else pa.table({ID: pa.array([], pa.string())}))
        dead_path = self.dead_dir / f"shard={shard_id}.parquet"
        if dead_parts:
            _atomic_write(pa.concat_tables([pq.read_table(p) for p in dead_parts]), dead_path)
        else:
            dead_path.unlink(missing_ok=True)
        _atomic_write(data, self.data_dir / f"shard={shard_id}.parquet")
        dead_rows = sum(pq.ParquetFile(p).metadata.num_rows for p in dead_parts)
        counts = {"rows": data.num_rows, "dead": dead_rows}
        write_marker(self.out_dir, shard_id, counts)
        shutil.rmtree(stage, ignore_errors=True)
        return counts

    def close(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)


@dataclass(frozen=True)
class Accounting:
    """Committed outputs read back. ``items_*`` count input items (a split row counts for its
    ``source_id``); ``items_written`` includes items whose rows were all ``_drop``-marked
    (``items_dropped``); ``duplicate_ids`` counts ids present more than once across the data
    and dead-letter tables (0 means exactly once)."""

    rows_written: int
    rows_dropped: int
    rows_dead_lettered: int
    items_written: int
    items_dropped: int
    items_dead_lettered: int
    duplicate_ids: int

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def _read_columns(files: list[Path], wanted: tuple[str, ...]) -> pa.Table:
    tables = []
    for f in files:
        names = pq.ParquetFile(f).schema_arrow.names
        table = pq.read_table(f, columns=[c for c in wanted if c in names])
        for c in wanted:
            if c not in table.column_names:
                table = table.append_column(c, pa.nulls(table.num_rows, pa.string()))
        tables.append(table.select(list(wanted)).cast(pa.schema([(c, pa.string()) for c in wanted])))
    return pa.concat_tables(tables) if tables else pa.table({c: pa.array([], pa.string()) for c in wanted})


def read_ids(out_dir: Path | str) -> tuple[list[str], list[str]]:
    """All ids in the committed data table and in the dead-letter table."""
    out = Path(out_dir)
    data = _read_columns(sorted((out / "data").glob("*.parquet")), (ID,))
    dead = _read_columns(sorted((out / "dead_letter").glob("*.parquet")), (ID,))
    return data.column(ID).to_pylist(), dead.column(ID).to_pylist()


def account(out_dir: Path | str) -> Accounting:
    """Read the committed outputs back and count (see ``Accounting``)."""
    import pandas as pd

    out = Path(out_dir)
    data = _read_columns(sorted((out / "data").glob("*.parquet")), (ID, SOURCE_ID, DROP)).to_pandas()
    dead = _read_columns(sorted((out / "dead_letter").glob("*.parquet")), (ID, SOURCE_ID)).to_pandas()
    ids = pd.concat([data[ID], dead[ID]], ignore_index=True)
    duplicates = int(ids.duplicated().sum())
    data_item = data[SOURCE_ID].where(data[SOURCE_ID].notna(), data[ID])
    dead_item = dead[SOURCE_ID].where(dead[SOURCE_ID].notna(), dead[ID])
    written = set(data_item)
    kept = set(data_item[data[DROP].isna()])
    return Accounting(rows_written=len(data), rows_dropped=int(data[DROP].notna().sum()), rows_dead_lettered=len(dead),
                      items_written=len(written), items_dropped=len(written - kept),
                      items_dead_lettered=len(set(dead_item) - written), duplicate_ids=duplicates)
