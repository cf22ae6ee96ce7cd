"""A run over a growing corpus: ``trident-flows run documents --input DIR_OR_URL [--table TABLE_URI]``
and the ``document-curation`` flow with a ``table``.

Contract:
- ``CorpusRun.prepare(input, table, out, retry_dead_letters, credentials=None)``, before Ray
  starts: opens input and table (``corpus.location``) and plans the work (``corpus.work``); ``spec``
  is the documents pipeline over it. A bad location or setting raises ``RuntimeConfigError``.
- ``seed()``, before the runner starts: the near-duplicate index gets the table's documents this
  run does not process again, so the run decides as one run over every night's files would.
- ``publish(out, items, decisions, flow_run_id)``, after the run while Ray is up: the committed
  rows plus earlier rows the index revised go to the table in one commit (manifest and index
  written first for that version; a row's ``path`` is its source URL); ``OUT``'s run files are then
  removed. Returns ``FIGURES``, ``table_version`` included.
- ``plan_line``, ``figures()`` and ``describe(figures)`` say the work and its figures in one line.
"""

from __future__ import annotations

import shutil
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from trident_flows.core.state import RuntimeConfigError
from trident_flows.corpus import manifest, near_dup_store, sidecar
from trident_flows.corpus.location import Location, LocationError, S3Credentials, open_location
from trident_flows.corpus.near_dup_store import IndexSnapshot
from trident_flows.corpus.table import CorpusTable
from trident_flows.corpus.work import Work, plan_work
from trident_flows.pipelines import documents
from trident_flows.runtime.resume import clear_run
from trident_flows.runtime.spec import DROP, ID, PipelineSpec

CACHE = Path("_inputs") / "corpus"
FIGURES = ("files_new", "files_changed", "files_unchanged", "files_deleted", "files_retried", "files_requeued",
           "near_duplicates_of_earlier_runs", "earlier_rows_revised", "table_version")
NEAR_DUPLICATE = "duplicate-of:"


def _count(n: int, thing: str, plural: str | None = None) -> str:
    return f"{n} {thing if n == 1 else plural or thing + 's'}"


def describe(figures: Mapping[str, Any]) -> str:
    """A run's corpus figures (``FIGURES``) in one line, the run-over-run ones first, for a log or an artifact's description."""
    version = figures["table_version"]
    return (f"{figures['files_new']} new, {figures['files_changed']} changed, {figures['files_unchanged']} unchanged, "
            f"{_count(figures['files_deleted'], 'deleted file')}; "
            f"{_count(figures['near_duplicates_of_earlier_runs'], 'near-duplicate')} of earlier runs; "
            + (f"table version {version}" if version is not None else "no table")
            + f"; {_count(figures['files_retried'], 'dead letter')} retried, {figures['files_requeued']} requeued, "
            f"{_count(figures['earlier_rows_revised'], 'earlier row')} revised")


def decisions_of(policy: str, reconfigurations: int, apply_reports: Any) -> dict[str, Any]:
    """What the scheduler decided in a run, for its table commit: the policy, its reconfigurations, each applied plan's reason."""
    return {"policy": policy, "reconfigurations": reconfigurations, "plans": [r.get("reason", "") for r in apply_reports]}


def _for(location: str | Path, credentials: S3Credentials | None) -> S3Credentials | None:
    """``credentials`` where ``location`` is an ``s3://`` URL (they are for the run's S3 locations), else None."""
    return credentials if str(location).startswith("s3://") else None


def _outcome(drop: str | None) -> str:
    if not drop:
        return manifest.KEPT
    return manifest.NEAR_DUPLICATE if drop.startswith(NEAR_DUPLICATE) else manifest.FILTERED


def _read_parts(folder: Path) -> pa.Table | None:
    parts = [pq.read_table(p) for p in sorted(folder.glob("*.parquet"))] if folder.exists() else []
    return pa.concat_tables(parts, promote_options="permissive") if parts else None


@dataclass
class CorpusRun:
    source: Location
    table: CorpusTable | None
    version: int | None
    snapshot: IndexSnapshot | None
    work: Work
    spec: PipelineSpec
    cache: Path

    @staticmethod
    def prepare(input: str | Path, table: str | None, out: Path, retry_dead_letters: bool = False,
                quality: Mapping[str, Any] | None = None, tune: Mapping[str, Any] | None = None,
                credentials: S3Credentials | None = None) -> "CorpusRun":
        try:
            if credentials is not None and _for(input, credentials) is None and _for(table or "", credentials) is None:
                raise ValueError(f"{credentials.source} is for s3:// locations, and neither the input {input} nor the table {table} is one: "
                                 "give no credentials, or an s3:// URL")
            source = open_location(input, _for(input, credentials))
            corpus = CorpusTable(open_location(table, _for(table, credentials))) if table is not None else None
            version = corpus.version() if corpus is not None else None
            previous = sidecar.read(corpus.location, "manifest", version) if corpus is not None else None
            snapshot = near_dup_store.load(corpus.location, version) if corpus is not None else None
            cache = Path(out) / CACHE
            originals = {k: v for k, v in zip(snapshot.ids, snapshot.duplicate_of) if v} if snapshot is not None else {}
            work = plan_work(source, previous if previous is not None else manifest.empty(), cache, retry_dead_letters, originals)
            spec = documents.build_rows(work.rows(), quality=quality, tune=tune)
            if snapshot is not None:
                snapshot.check_settings(*documents.dedup_settings(spec))
        except (LocationError, sidecar.SidecarMissing, ValueError) as exc:
            raise RuntimeConfigError(str(exc)) from None
        return CorpusRun(source, corpus, version, snapshot, work, spec, cache)

    def _earlier(self) -> set[str]:
        """Ids of the table's index that this run does not process again."""
        if self.snapshot is None:
            return set()
        return set(self.snapshot.ids) - set(self.work.hashes())

    def seed(self) -> int:
        """Seed the run's near-duplicate index with the earlier documents (see the module docstring)."""
        if self.snapshot is None or not self.work.items:
            return 0
        earlier = self._earlier()
        items = [(key, self.snapshot.values[k], given) for k, (key, given) in enumerate(zip(self.snapshot.ids, self.snapshot.duplicate_of))
                 if key in earlier]
        return documents.dedup_index(self.spec).seed(items, trust_committed=False) if items else 0

    def plan_line(self, table: str | None) -> str:
        """What the run will do, in one line: its files against the manifest and the table's version."""
        counts = self.work.counts()
        where = ("" if self.table is None else f"; table {table} at version {self.version}" if self.version is not None
                 else f"; table {table} not created yet: this run creates it")
        return (f"{self.source.uri}: {counts['files_new']} new, {counts['files_changed']} changed, {counts['files_unchanged']} unchanged, "
                f"{counts['files_deleted']} deleted, {counts['files_retried']} dead letters retried, {counts['files_requeued']} requeued{where}")

    def figures(self, near_duplicates: int = 0, revised: int = 0, version: int | None = None) -> dict[str, Any]:
        return {**self.work.counts(), "near_duplicates_of_earlier_runs": near_duplicates, "earlier_rows_revised": revised,
                "table_version": version if version is not None else self.version}

    def _revised_rows(self, revisions: Mapping[str, str]) -> pa.Table | None:
        """The table's rows of ``revisions``' ids, with the revised near-duplicate marks."""
        if not revisions or self.table is None:
            return None
        import pyarrow.compute as pc
        import pyarrow.dataset as ds
        rows = self.table.open(self.table.curated_uri).to_pyarrow_dataset().to_table(filter=pc.is_in(ds.field(ID), pa.array(sorted(revisions))))
        rows, _ = documents.apply_revisions(rows.drop_columns(["table_version", "run_id"]), revisions)
        return rows

    def publish(self, out: Path, items: Mapping[str, int], decisions: Mapping[str, Any], flow_run_id: str = "") -> dict[str, Any]:
        """Commit the run to the table (see the module docstring); returns the figures."""
        if self.table is None:
            raise ValueError("publish needs a table: this run was prepared without --table")
        run_id = uuid.uuid4().hex
        data = _read_parts(Path(out) / "data")
        dead = _read_parts(Path(out) / "dead_letter")
        data = data if data is not None else pa.table({ID: pa.array([], pa.string())})
        dead = dead if dead is not None else pa.table({ID: pa.array([], pa.string())})
        hashes = self.work.hashes()
        earlier = self._earlier()
        if self.work.items:
            index = documents.dedup_index(self.spec)
            revisions = {k: v for k, v in index.revisions().items() if k in earlier}
            ids, values, answers = index.signatures()
            snapshot = IndexSnapshot(tuple(ids), values, tuple(answers), *documents.dedup_settings(self.spec))
        else:
            revisions = {}
            threshold, num_perm = documents.dedup_settings(self.spec)
            snapshot = self.snapshot or IndexSnapshot((), np.zeros((0, num_perm), np.uint64), (), threshold, num_perm)
        if any(not answer for answer in revisions.values()):
            raise RuntimeError(f"an earlier near-duplicate would become kept without being curated again: {revisions}")
        own = data.append_column("content_sha256", pa.array([hashes.get(i) for i in data[ID].to_pylist()], pa.string()))
        if "path" in own.column_names:  # the source file's URL, not the run's cached copy
            own = own.set_column(own.column_names.index("path"), "path",
                                 pa.array([self.source.uri_of(i) for i in own[ID].to_pylist()], pa.string()))
        parts = [own]
        revised = self._revised_rows(revisions)
        if revised is not None:
            parts.append(revised)
        rows = pa.concat_tables(parts, promote_options="permissive")
        rows = rows.append_column("run_id", pa.array([run_id] * rows.num_rows, pa.string()))
        dead = dead.append_column("content_sha256", pa.array([hashes.get(i) for i in dead[ID].to_pylist()], pa.string()))
        dead = dead.append_column("run_id", pa.array([run_id] * dead.num_rows, pa.string()))
        drops = data[DROP].to_pylist() if DROP in data.column_names else [None] * data.num_rows
        outcomes = {i: _outcome(d) for i, d in zip(data[ID].to_pylist(), drops)}
        duplicate_of = data["duplicate_of"].to_pylist() if "duplicate_of" in data.column_names else [None] * data.num_rows
        near_duplicates = sum(1 for original in duplicate_of if original and original in earlier)
        version = (self.version or 0) + 1
        sidecar.write(self.table.location, "manifest", version, self.work.next_manifest(outcomes, datetime.now(timezone.utc)))
        near_dup_store.save(self.table.location, version, snapshot)
        figures = self.figures(near_duplicates, len(revisions), version)
        counts = {**{k: v for k, v in figures.items() if k != "table_version"}, **items}
        self.table.commit(rows, dead, {"trident.run_id": run_id, "trident.flow_run_id": flow_run_id, "trident.counts": counts,
                                       "trident.decisions": dict(decisions), "trident.input": self.source.uri})
        clear_run(out)
        shutil.rmtree(self.cache, ignore_errors=True)
        return figures
