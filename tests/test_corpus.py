"""The corpus parts of incremental runs: the manifest diff, the work of a run, the Delta tables and their
one commit per run, the near-duplicate index across runs, and all of it on a real S3-compatible server."""

from __future__ import annotations

import os
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pytest

from trident_flows.corpus import manifest, near_dup_store, sidecar
from trident_flows.corpus.location import LocationError, open_location
from trident_flows.corpus.near_dup_store import IndexSnapshot
from trident_flows.corpus.table import CorpusTable
from trident_flows.corpus.work import CHANGED, NEW, REQUEUED, RETRIED, plan_work

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _listing(rows):
    return pa.table({"path": [r[0] for r in rows], "size": pa.array([r[1] for r in rows], pa.int64()),
                     "mtime_ns": pa.array([r[2] for r in rows], pa.int64())})


def _manifest(rows):
    return pa.table({"path": [r[0] for r in rows], "id": [r[0] for r in rows], "size": pa.array([r[1] for r in rows], pa.int64()),
                     "mtime_ns": pa.array([r[2] for r in rows], pa.int64()), "sha256": [r[3] for r in rows],
                     "seen_at": pa.array([NOW] * len(rows), pa.timestamp("us", tz="UTC")), "outcome": [r[4] for r in rows]},
                    schema=manifest.SCHEMA)


def test_diff_sorts_every_listed_file_into_one_class_and_reports_deleted_ones():
    previous = _manifest([("a.pdf", 1, 10, "h", "kept"), ("b.pdf", 2, 20, "h", "kept"), ("c.pdf", 3, 30, "h", "dead-lettered"),
                          ("gone.pdf", 4, 40, "h", "kept")])
    listing = _listing([("a.pdf", 1, 10), ("b.pdf", 2, 21), ("c.pdf", 3, 30), ("new.pdf", 5, 50)])
    found = manifest.diff(listing, previous)
    assert (found.new, found.suspect, found.unchanged, found.retry, found.deleted) == (("new.pdf",), ("b.pdf",), ("a.pdf", "c.pdf"), (),
                                                                                        ("gone.pdf",))
    retried = manifest.diff(listing, previous, retry_dead_letters=True)
    assert retried.retry == ("c.pdf",) and retried.unchanged == ("a.pdf",)
    assert manifest.diff(listing, manifest.empty()).new == ("a.pdf", "b.pdf", "c.pdf", "new.pdf")


def _write(path, data: bytes, mtime_ns: int | None = None):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mtime_ns is not None:
        os.utime(path, ns=(mtime_ns, mtime_ns))


def test_plan_work_hashes_suspects_keeps_dead_letters_and_requeues_near_duplicates_of_changed_files(tmp_path):
    src = tmp_path / "src"
    for name in ("a", "b", "c", "d", "e"):
        _write(src / "sub" / f"{name}.pdf", f"bytes of {name}".encode(), 10**18)
    (src / "notes.txt").write_text("not a pdf")
    first = plan_work(open_location(src), manifest.empty(), tmp_path / "cache")
    assert [i.kind for i in first.items] == [NEW] * 5 and first.rows()[0]["id"] == "sub/a.pdf"
    assert all(os.path.exists(i.local_path) for i in first.items)
    outcomes = {"sub/a.pdf": "kept", "sub/b.pdf": "kept", "sub/c.pdf": "kept", "sub/d.pdf": "near-duplicate", "sub/e.pdf": "dead-lettered"}
    previous = first.next_manifest(outcomes, NOW)
    assert previous["outcome"].to_pylist() == list(outcomes.values())

    _write(src / "sub" / "a.pdf", b"bytes of a", 2 * 10**18)  # touched: same bytes, new mtime
    _write(src / "sub" / "b.pdf", b"new bytes of b", 2 * 10**18)  # changed
    (src / "sub" / "c.pdf").unlink()  # deleted
    _write(src / "f.pdf", b"bytes of f")  # new
    second = plan_work(open_location(src), previous, tmp_path / "cache", originals={"sub/d.pdf": "sub/b.pdf"})
    kinds = {i.path: i.kind for i in second.items}
    assert kinds == {"f.pdf": NEW, "sub/b.pdf": CHANGED, "sub/d.pdf": REQUEUED}
    assert second.counts() == {"files_new": 1, "files_changed": 1, "files_unchanged": 2, "files_deleted": 1, "files_retried": 0,
                               "files_requeued": 1}
    after = second.next_manifest({"f.pdf": "kept", "sub/b.pdf": "kept", "sub/d.pdf": "kept"}, NOW)
    assert after["path"].to_pylist() == ["f.pdf", "sub/a.pdf", "sub/b.pdf", "sub/d.pdf", "sub/e.pdf"]
    assert after.filter(pa.compute.equal(after["path"], "sub/a.pdf"))["mtime_ns"][0].as_py() == 2 * 10**18  # touched: new stat kept

    third = plan_work(open_location(src), after, tmp_path / "cache")
    assert third.items == () and third.counts()["files_unchanged"] == 5  # e: dead-lettered, same bytes, not retried
    retried = plan_work(open_location(src), after, tmp_path / "cache", retry_dead_letters=True)
    assert [(i.path, i.kind) for i in retried.items] == [("sub/e.pdf", RETRIED)]


def test_locations_refuse_what_they_cannot_open_saying_what_to_give(tmp_path):
    with pytest.raises(LocationError, match="no such directory"):
        open_location(tmp_path / "missing").list_files(".pdf")
    with pytest.raises(LocationError, match="no filesystem for this URL scheme"):
        open_location("nosuchscheme://bucket/x")
    (tmp_path / "empty").mkdir()
    with pytest.raises(LocationError, match=r"holds no \*.pdf files"):
        plan_work(open_location(tmp_path / "empty"), manifest.empty(), tmp_path / "cache")


def _rows(ids, text="t"):
    return pa.table({"id": ids, "text": [f"{text}-{i}" for i in ids], "_drop": pa.nulls(len(ids), pa.null()),
                     "embeddings": pa.array([[[0.5, 1.5]] for _ in ids], pa.list_(pa.list_(pa.float32())))})


def _dead(ids):
    return pa.table({"id": ids, "error": ["corrupt PDF: x"] * len(ids)})


def _read(uri):
    from deltalake import DeltaTable

    return DeltaTable(uri).to_pandas()


def _commit_two_runs(table: CorpusTable):
    assert table.version() is None
    assert table.commit(_rows(["a", "b"]), _dead(["x"]), {"trident.flow_run_id": "run-1"}) == 1
    assert table.commit(_rows(["b", "c"], text="new"), _dead([]), {"trident.flow_run_id": "run-2", "trident.counts": {"files_new": 1}}) == 2
    curated = _read(table.curated_uri).set_index("id").sort_index()
    assert list(curated.index) == ["a", "b", "c"]  # b's row replaced, never duplicated
    assert curated.loc["b", "text"] == "new-b" and curated.loc["b", "table_version"] == 2 and curated.loc["a", "table_version"] == 1
    history = table.history()
    assert [h["version"] for h in history] == [2, 1, 0]
    assert history[0]["trident.flow_run_id"] == "run-2" and history[0]["trident.counts"] == '{"files_new": 1}'


def test_one_commit_per_run_merges_on_id_and_a_run_dying_before_it_leaves_the_previous_version(tmp_path, monkeypatch):
    import duckdb
    from deltalake import DeltaTable

    table = CorpusTable(open_location(tmp_path / "table"))
    _commit_two_runs(table)
    # a run that dies after its dead letters and before its curated commit
    monkeypatch.setattr(DeltaTable, "merge", lambda *a, **k: (_ for _ in ()).throw(OSError("killed")))
    with pytest.raises(OSError, match="killed"):
        table.commit(_rows(["d"]), _dead(["y", "z"]), {})
    assert table.version() == 2
    monkeypatch.undo()
    assert table.commit(_rows(["d"]), _dead(["y", "z"]), {}) == 3  # the re-run
    dead = _read(table.dead_uri)
    assert sorted(dead["id"]) == ["x", "y", "z"]  # the dying run's dead letters replaced, not doubled
    db = duckdb.connect()
    db.register("curated", DeltaTable(table.curated_uri).to_pyarrow_dataset())
    assert db.sql("select count(*), count(distinct id) from curated").fetchall() == [(4, 4)]
    # a column every row of a run left empty is left out, then takes the type a later run gives it
    assert "_drop" not in _read(table.curated_uri).columns
    later = _rows(["e"]).set_column(2, "_drop", pa.array(["quality:too-short"]))
    assert table.commit(later, _dead([]), {}) == 4
    assert _read(table.curated_uri).set_index("id").loc["e", "_drop"] == "quality:too-short"


def test_sidecars_are_per_version_and_a_missing_one_is_named(tmp_path):
    location = open_location(tmp_path / "table")
    snapshot = IndexSnapshot(("a", "b"), np.arange(8, dtype=np.uint64).reshape(2, 4), ("", "a"), 0.7, 4)
    near_dup_store.save(location, 1, snapshot)
    loaded = near_dup_store.load(location, 1)
    assert loaded.ids == ("a", "b") and loaded.duplicate_of == ("", "a") and (loaded.values == snapshot.values).all()
    assert near_dup_store.load(location, 0) is None and near_dup_store.load(location, None) is None
    with pytest.raises(ValueError, match="dedup.threshold=0.7"):
        loaded.check_settings(0.8, 4)
    with pytest.raises(sidecar.SidecarMissing, match="v00000000000000000002.parquet is missing"):
        near_dup_store.load(location, 2)


def _signature(text: str, num_perm: int = 64) -> np.ndarray:
    from trident_flows.pipelines.doc_filters import minhash_values

    return minhash_values(text, num_perm)


def _night_by_night(nights: list[dict[str, str]]) -> dict[str, str]:
    """Each night an index seeded from the previous night's signatures (untrusted answers); the answers the
    table ends with, after each night's revisions of earlier rows."""
    from trident_flows.pipelines.doc_dedup import LshIndex

    table: dict[str, str] = {}
    snapshot: tuple[list[str], np.ndarray, list[str]] | None = None
    for docs in nights:
        index = LshIndex(0.7, 64)
        if snapshot is not None:
            ids, values, answers = snapshot
            index.seed([(k, values[i], table[k]) for i, k in enumerate(ids)], trust_committed=False)
        answers = index.check_and_insert([(k, _signature(t)) for k, t in sorted(docs.items())])
        table.update(dict(zip(sorted(docs), answers)))
        table.update(index.revisions())  # earlier rows and this night's rows alike
        snapshot = index.signatures()
    return table


def test_near_duplicates_across_nights_are_marked_as_one_run_over_both_nights_marks_them():
    from trident_flows.pipelines.doc_dedup import LshIndex

    words = [f"w{i}" for i in range(400)]
    base = {k: " ".join(words[j * 40:(j + 1) * 40] * 3) + f" {k}" for j, k in enumerate(("n1-a", "n1-b", "n1-c", "n1-d"))}
    night1 = dict(base)
    night2 = {"n2-a": base["n1-a"] + " extra",  # a near-duplicate of an earlier document: marked with its id
              "n2-e": " ".join(words[300:340] * 3),
              "n0-c": base["n1-c"] + " more"}  # a smaller id than its earlier near-duplicate: the earlier row is revised
    nightly = _night_by_night([night1, night2])
    one = LshIndex(0.7, 64)
    both = {**night1, **night2}
    at_once = dict(zip(sorted(both), one.check_and_insert([(k, _signature(t)) for k, t in sorted(both.items())])))
    assert nightly == at_once
    assert nightly["n2-a"] == "n1-a" and nightly["n1-c"] == "n0-c" and nightly["n2-e"] == ""


def test_the_whole_corpus_store_works_on_a_real_s3_compatible_server(s3_bucket, tmp_path):
    import boto3
    import duckdb
    from deltalake import DeltaTable

    bucket = s3_bucket.removeprefix("s3://")
    s3 = boto3.client("s3")
    for name in ("x/a.pdf", "x/b.pdf", "x/deep/c.PDF", "x/readme.txt"):
        s3.put_object(Bucket=bucket, Key=name, Body=name.encode())
    source = open_location(f"{s3_bucket}/x")
    assert source.list_files(".pdf")["path"].to_pylist() == ["a.pdf", "b.pdf", "deep/c.PDF"]
    work = plan_work(source, manifest.empty(), tmp_path / "cache")
    assert work.counts()["files_new"] == 3 and open(work.items[0].local_path, "rb").read() == b"x/a.pdf"
    table = CorpusTable(open_location(f"{s3_bucket}/tables/corpus"))
    _commit_two_runs(table)
    sidecar.write(table.location, "manifest", 2, work.next_manifest({}, NOW))
    assert sidecar.read(table.location, "manifest", 2).num_rows == 3
    db = duckdb.connect()
    db.register("curated", DeltaTable(table.curated_uri).to_pyarrow_dataset())
    assert db.sql("select count(*) from curated").fetchall() == [(3,)]


def test_a_runs_figures_read_in_one_line_as_the_run_page_shows_them():
    from trident_flows.control.corpus_run import FIGURES, describe

    figures = dict(zip(FIGURES, (10, 2, 40, 1, 0, 3, 1, 0, 2)))
    assert describe(figures) == ("10 new, 2 changed, 40 unchanged, 1 deleted file; 1 near-duplicate of earlier runs; table version 2; "
                                 "0 dead letters retried, 3 requeued, 0 earlier rows revised")
    assert "; no table; " in describe({**figures, "table_version": None, "near_duplicates_of_earlier_runs": 2})
    assert "2 near-duplicates of earlier runs" in describe({**figures, "near_duplicates_of_earlier_runs": 2})


def test_a_run_says_its_work_in_one_line_and_whether_it_creates_the_table(tmp_path):
    from trident_flows.control.corpus_run import CorpusRun

    (tmp_path / "in").mkdir()
    _write(tmp_path / "in" / "a.pdf", b"a")
    table = str(tmp_path / "table")
    first = CorpusRun.prepare(tmp_path / "in", table, tmp_path / "out")
    assert first.plan_line(table) == (f"{tmp_path / 'in'}: 1 new, 0 changed, 0 unchanged, 0 deleted, 0 dead letters retried, 0 requeued; "
                                      f"table {table} not created yet: this run creates it")
    assert first.publish(tmp_path / "out", {}, {})["table_version"] == 1
    assert CorpusRun.prepare(tmp_path / "in", table, tmp_path / "out").plan_line(table).endswith(f"; table {table} at version 1")
    assert CorpusRun.prepare(tmp_path / "in", None, tmp_path / "out").plan_line(None).endswith("0 requeued")
