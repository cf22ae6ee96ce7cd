"""Scheduled runs over a growing corpus, end to end through ``trident-flows run documents --input --table``
(the check of issue 47): a first night of 30 PDFs; a second with 10 new ones (3 near-duplicates of
first-night documents) and 2 first-night files changed, of which exactly those 12 are processed; a third
interrupted midway, leaving the table at version 2, and its re-run giving version 3 with no id twice.
Once with a local directory and table (then checked against one run over every night's files), once
with both on a real S3-compatible server (moto's); and the document-curation flow run twice with files
added between the runs."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

pytestmark = [pytest.mark.models, pytest.mark.slow]

CLI = str(Path(sys.executable).parent / "trident-flows")


def _pdf(key: str, original: str | None = None) -> bytes:
    """A born-digital PDF of generated prose (``key`` seeds it); with ``original``, a near-duplicate of that one."""
    from trident_flows.pipelines.synth_documents import _content, _near_duplicate, _render

    base = _content(random.Random(f"corpus:{original or key}"), "short")
    content = _near_duplicate(random.Random(f"near:{key}"), base) if original else base
    return _render(random.Random(f"render:{key}"), content)


def _run(input_uri: str, table: str, out: Path, summary: Path) -> subprocess.Popen:
    return subprocess.Popen([CLI, "run", "documents", "--input", input_uri, "--table", table, "--out", str(out), "--summary-json", str(summary),
                             "--policy", "static", "--cpus", "4"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "OMP_THREAD_LIMIT": "1"})


def _finish(process: subprocess.Popen, summary: Path) -> dict:
    output, _ = process.communicate(timeout=900)
    assert process.returncode == 0, output[-4000:]
    return json.loads(summary.read_text())


def _count(table: str) -> tuple[int, int]:
    import duckdb
    from deltalake import DeltaTable

    db = duckdb.connect()
    db.register("curated", DeltaTable(f"{table}/curated").to_pyarrow_dataset())
    return db.sql("select count(*), count(distinct id) from curated").fetchall()[0]


def _scenario(put: Callable[[str, bytes], None], input_uri: str, table: str, tmp_path: Path) -> None:
    from deltalake import DeltaTable

    out = tmp_path / "staging"
    for k in range(30):
        put(f"n1-{k:02d}.pdf", _pdf(f"n1-{k:02d}"))
    first = _finish(_run(input_uri, table, out, tmp_path / "s1.json"), tmp_path / "s1.json")
    assert (first["files_new"], first["items_in"], first["table_version"], first["items_missing"]) == (30, 30, 1, 0)

    originals = {"n2-dup-0.pdf": "n1-00", "n2-dup-1.pdf": "n1-05", "n2-dup-2.pdf": "n1-10"}
    for name, original in originals.items():
        put(name, _pdf(name, original))
    for k in range(7):
        put(f"n2-{k:02d}.pdf", _pdf(f"n2-{k:02d}"))
    for name in ("n1-20.pdf", "n1-21.pdf"):
        put(name, _pdf(f"{name}-rewritten"))
    second = _finish(_run(input_uri, table, out, tmp_path / "s2.json"), tmp_path / "s2.json")
    assert {k: second[k] for k in ("files_new", "files_changed", "files_unchanged", "files_deleted", "items_in",
                                   "near_duplicates_of_earlier_runs", "table_version")} == {
        "files_new": 10, "files_changed": 2, "files_unchanged": 28, "files_deleted": 0, "items_in": 12,
        "near_duplicates_of_earlier_runs": 3, "table_version": 2}
    rows = DeltaTable(f"{table}/curated").to_pandas().set_index("id")
    for name, original in originals.items():
        assert rows.loc[name, "duplicate_of"] == f"{original}.pdf" and rows.loc[name, "_drop"] == f"duplicate-of:{original}.pdf"
    assert set(rows.loc[["n1-20.pdf", "n1-21.pdf"], "table_version"]) == {2}
    assert _count(table) == (40, 40)
    runs = [h for h in DeltaTable(f"{table}/curated").history() if "trident.run_id" in h]
    assert [h["version"] for h in runs] == [2, 1] and json.loads(runs[0]["trident.counts"])["files_changed"] == 2

    for k in range(12):
        put(f"n3-{k:02d}.pdf", _pdf(f"n3-{k:02d}"))
    third = _run(input_uri, table, out, tmp_path / "s3.json")
    deadline = time.monotonic() + 600
    while not list((out / "_committed").glob("shard=*.json")) and third.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert third.poll() is None, "the third run ended before a shard was committed; nothing to interrupt"
    third.send_signal(signal.SIGINT)
    output, _ = third.communicate(timeout=300)
    assert third.returncode == 130, output[-4000:]
    assert DeltaTable(f"{table}/curated").version() == 2 and _count(table) == (40, 40)
    again = _finish(_run(input_uri, table, out, tmp_path / "s3.json"), tmp_path / "s3.json")
    assert (again["files_new"], again["table_version"], again["items_missing"], again["duplicate_ids"]) == (12, 3, 0, 0)
    assert _count(table) == (52, 52)


@pytest.mark.ray
def test_a_growing_corpus_in_a_local_directory(tmp_path, ray_cluster):
    import ray.data

    source = tmp_path / "landing"
    source.mkdir()

    def put(name: str, data: bytes) -> None:
        (source / name).write_bytes(data)

    table = str(tmp_path / "table")
    _scenario(put, str(source), table, tmp_path)
    assert ray.data.read_delta(f"{table}/curated").count() == 52
    # one run over every night's files marks the same near-duplicates and drops the same documents
    once = str(tmp_path / "once")
    _finish(_run(str(source), once, tmp_path / "once-staging", tmp_path / "once.json"), tmp_path / "once.json")
    assert _marks(table) == _marks(once)


def _marks(table: str) -> dict:
    from deltalake import DeltaTable

    rows = DeltaTable(f"{table}/curated").to_pandas().set_index("id").sort_index()
    text = lambda value: value if isinstance(value, str) else ""  # noqa: E731 - a missing value (None, NaN, NA) is ""
    return {k: (text(row["_drop"]), text(row["duplicate_of"])) for k, row in rows.iterrows()}


def test_a_growing_corpus_in_a_bucket(tmp_path, s3_bucket):
    import boto3

    s3 = boto3.client("s3")
    bucket = s3_bucket.removeprefix("s3://")

    def put(name: str, data: bytes) -> None:
        s3.put_object(Bucket=bucket, Key=f"landing/{name}", Body=data)

    _scenario(put, f"{s3_bucket}/landing", f"{s3_bucket}/tables/docs", tmp_path)


@pytest.mark.prefect
@pytest.mark.ray
def test_the_curation_flow_curates_only_the_files_added_between_two_runs(prefect_harness, ray_cluster, tmp_path):
    import json as json_

    from deltalake import DeltaTable
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    from trident_flows.flows.document_curation import document_curation

    landing, table = tmp_path / "landing", str(tmp_path / "table")
    landing.mkdir()
    for k in range(4):
        (landing / f"a-{k}.pdf").write_bytes(_pdf(f"a-{k}"))
    settings = {"pipeline": "documents", "output_location": str(tmp_path / "staging"), "shard_size": 2, "runner_name": "corpus-flow-test"}
    first = document_curation(pipeline=settings, trident={"policy": "static"}, input=str(landing), table=table)
    assert (first["files_new"], first["items_in"], first["table_version"]) == (4, 4, 1)
    (landing / "b-0.pdf").write_bytes(_pdf("b-0"))
    (landing / "b-1.pdf").write_bytes(_pdf("b-1", "a-2"))  # a near-duplicate of a first-run document
    state = document_curation(pipeline=settings, trident={"policy": "static"}, input=str(landing), table=table, return_state=True)
    second = state.result()
    assert {k: second[k] for k in ("files_new", "files_unchanged", "items_in", "near_duplicates_of_earlier_runs", "table_version")} == {
        "files_new": 2, "files_unchanged": 4, "items_in": 2, "near_duplicates_of_earlier_runs": 1, "table_version": 2}
    flow_run_id = state.state_details.flow_run_id
    with get_client(sync_client=True) as client:
        artifacts = {a.key: a for a in client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))}
    shown = {row["figure"]: row["value"] for row in json_.loads(artifacts["curation-corpus-flow-test-corpus"].data)}
    assert shown["new files"] == 2 and shown["near-duplicates of earlier runs"] == 1 and shown["table version written"] == 2
    assert artifacts["curation-corpus-flow-test-corpus"].description == (
        "2 new, 0 changed, 4 unchanged, 0 deleted files; 1 near-duplicate of earlier runs; table version 2; 0 dead letters retried, "
        f"0 requeued, 0 earlier rows revised; input {landing}")
    assert DeltaTable(f"{table}/curated").history(1)[0]["trident.flow_run_id"] == str(flow_run_id)
