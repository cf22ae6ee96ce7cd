"""The corpus tables: curated rows and dead letters, two Delta Lake tables under one table location.

Contract:
- ``TABLE/curated`` holds one row per document (the pipeline's output row, kept or marked
  ``_drop``) plus ``content_sha256``, ``table_version`` and ``run_id``; ``TABLE/dead_letter`` one
  row per dead-lettered document, with the same three added. Any Delta reader reads them.
  ``open(uri)`` opens either with the location's credentials, as every read and write here does.
- ``CorpusTable.commit(rows, dead, metadata)`` is a run's commit: exactly one curated commit (a
  MERGE on ``id``: never an id twice), the dead letters first; a run killed before its curated
  commit leaves the table at its previous version and the re-run writes each row once. Columns are
  fitted to the table's schema (schema evolution for new ones).
- ``ConcurrentCommit`` is raised when another writer committed in between (one run at a time per
  table).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

import pyarrow as pa

from trident_flows.corpus.location import Location

CURATED, DEAD_LETTER = "curated", "dead_letter"
VERSION_COLUMN = "table_version"


class ConcurrentCommit(RuntimeError):
    """Another writer committed to the table while this run was committing."""


def _has_null(t: pa.DataType) -> bool:
    if pa.types.is_null(t):
        return True
    return any(_has_null(t.field(i).type) for i in range(t.num_fields))


def _deltable(t: pa.DataType) -> pa.DataType:
    """``t`` with unsigned integers made signed (Delta Lake has none)."""
    if pa.types.is_unsigned_integer(t):
        return pa.int64()
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(_deltable(t.value_type))
    return t


def fit(table: pa.Table, target: pa.Schema | None) -> pa.Table:
    """``table`` fitted to ``target`` (see ``CorpusTable.commit``)."""
    columns: dict[str, pa.ChunkedArray] = {}
    known = {f.name: f.type for f in target} if target is not None else {}
    for name in table.column_names:
        column = table[name]
        if name in known:
            try:
                columns[name] = column.cast(known[name])
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise ValueError(f"column {name!r} is {column.type} in this run but {known[name]} in the table; "
                                 f"curate into a new --table or make the pipeline write {known[name]} ({exc})") from None
        elif not _has_null(column.type):
            columns[name] = column.cast(_deltable(column.type))
    for name, type_ in known.items():
        if name not in columns:
            columns[name] = pa.chunked_array([pa.nulls(table.num_rows, type_)])
    return pa.table(columns)


def _arrow_schema(table: Any) -> pa.Schema:
    """A Delta table's schema as a pyarrow schema (deltalake gives an Arrow C schema object)."""
    return pa.schema(table.schema().to_arrow())


class CorpusTable:
    """The two tables of a corpus (see the module docstring). Needs the ``corpus`` extra (deltalake):
    without it, construction raises ``ValueError`` saying what to install."""

    def __init__(self, location: Location) -> None:
        try:
            import deltalake  # noqa: F401
        except ImportError:
            raise ValueError("a corpus table needs the deltalake package: pip install 'trident-flows[corpus]'") from None
        self.location = location
        self.curated_uri = location.uri_of(CURATED)
        self.dead_uri = location.uri_of(DEAD_LETTER)
        self.storage_options = dict(location.storage_options) or None

    def open(self, uri: str) -> Any:
        """The Delta table at ``uri`` (``curated_uri`` or ``dead_uri``), opened with the location's credentials."""
        from deltalake import DeltaTable

        return DeltaTable(uri, storage_options=self.storage_options)

    def exists(self, uri: str) -> bool:
        from deltalake import DeltaTable

        return DeltaTable.is_deltatable(uri, storage_options=self.storage_options)

    def version(self) -> int | None:
        """The curated table's latest version; None before the first run."""
        return self.open(self.curated_uri).version() if self.exists(self.curated_uri) else None

    def history(self) -> list[dict[str, Any]]:
        """The curated table's commits, newest first (commit info, with each run's metadata)."""
        return self.open(self.curated_uri).history() if self.exists(self.curated_uri) else []

    def commit(self, rows: pa.Table, dead: pa.Table, metadata: Mapping[str, Any]) -> int:
        """Commit one run; returns the curated table's new version.

        The curated table gets exactly one commit, version ``v = previous + 1`` (the table is created empty,
        version 0, on the first run), a MERGE on ``id``: a row of this run replaces the row of the same document
        (a changed file, a revised near-duplicate mark) and is inserted otherwise, so the table never holds an id
        twice. Its commit carries ``metadata`` in the commit info. The dead letters go first, one commit that
        replaces any rows of ``table_version >= v`` (left by a run that died before its curated commit) with this
        run's. So a run that fails or is killed before its curated commit leaves the curated table at its previous
        version, and the re-run writes each row once. Columns are fitted to the table's schema: a column the table
        has is cast to its type (nulls where this run has none); a new column is added (schema evolution); a
        column whose type Arrow inferred as null is left out until a run gives it a type."""
        from deltalake import CommitProperties, DeltaTable, write_deltalake

        before = self.version()
        version = (before or 0) + 1
        info = CommitProperties(custom_metadata={k: v if isinstance(v, str) else json.dumps(v, default=str) for k, v in metadata.items()})
        rows = rows.append_column(VERSION_COLUMN, pa.array([version] * rows.num_rows, pa.int64()))
        dead = dead.append_column(VERSION_COLUMN, pa.array([version] * dead.num_rows, pa.int64()))
        options = self.storage_options
        if self.exists(self.dead_uri):
            dead = fit(dead, _arrow_schema(self.open(self.dead_uri)))
            write_deltalake(self.dead_uri, dead, mode="overwrite", predicate=f"{VERSION_COLUMN} >= {version}", commit_properties=info,
                            storage_options=options)
        else:
            write_deltalake(self.dead_uri, fit(dead, None), mode="append", commit_properties=info, storage_options=options)
        if before is None:
            DeltaTable.create(self.curated_uri, schema=fit(rows, None).schema, storage_options=options)
        table = self.open(self.curated_uri)
        if table.version() != (before or 0):
            raise ConcurrentCommit(f"{self.curated_uri} moved from version {before or 0} to {table.version()} while this run committed: "
                                   "run one curation per table at a time, then run this one again")
        source = fit(rows, _arrow_schema(table))
        if source.num_rows:
            (table.merge(source, predicate="t.id = s.id", source_alias="s", target_alias="t", merge_schema=True, commit_properties=info)
             .when_matched_update_all().when_not_matched_insert_all().execute())
        else:  # nothing curated (only deletions, or nothing new): the run's commit still records it, changing no row
            write_deltalake(self.curated_uri, source, mode="overwrite", predicate=f"{VERSION_COLUMN} > {version}", commit_properties=info,
                            storage_options=options)
        after = self.open(self.curated_uri).version()
        if after != version:
            raise ConcurrentCommit(f"{self.curated_uri} is at version {after} after this run's commit, expected {version}: another run "
                                   "committed at the same time; run one curation per table at a time")
        return version
