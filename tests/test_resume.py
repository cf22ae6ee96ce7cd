"""Resumable runs: shard commit markers, the run manifest, and the ``run`` command interrupted
with Ctrl-C at a random point and re-run (same ids as an uninterrupted run, none twice, no Ray
process left behind)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from test_runtime_support import child_env, small_pipeline

from trident_flows.runtime import resume
from trident_flows.runtime.leftovers import is_ray_process
from trident_flows.runtime.sink import Sink, read_ids


def _rows(n: int, tag: str = "") -> list[dict]:
    return [{"id": f"item-{k:04d}", "pages": 2.0, "tag": tag} for k in range(n)]


def test_shards_are_named_by_position_and_sized_for_about_forty_per_run():
    shards = resume.plan_shards(_rows(25), 10)
    assert [s.shard_id for s in shards] == ["shard-00000", "shard-00001", "shard-00002"]
    assert [len(s.rows) for s in shards] == [10, 10, 5]
    assert resume.default_shard_size(400) == 10 and resume.default_shard_size(7) == 1 and resume.default_shard_size(10**6) == 256
    with pytest.raises(ValueError, match="shard_size must be an integer >= 1"):
        resume.plan_shards(_rows(3), 0)


def _commit(out: Path, shard: resume.InputShard) -> None:
    sink = Sink(out)
    sink.write_part(shard.shard_id, [dict(r) for r in shard.rows], [])
    sink.commit(shard.shard_id)
    sink.close()


def test_a_second_open_skips_committed_shards_and_redoes_half_commits(tmp_path):
    shards = resume.plan_shards(_rows(30), 10)
    plan = resume.open_run(tmp_path, "p", shards)
    assert len(plan.pending) == 3 and plan.shards_skipped == 0 and plan.message() == ""
    _commit(tmp_path, shards[0])
    assert resume.committed_shards(tmp_path) == {"shard-00000"}
    # a commit cut short: the data file is there, the marker is not
    sink = Sink(tmp_path)
    sink.write_part("shard-00001", [dict(r) for r in shards[1].rows], [])
    sink.commit("shard-00001")
    resume.remove_marker(tmp_path, "shard-00001")
    plan = resume.open_run(tmp_path, "p", shards)
    assert [s.shard_id for s in plan.pending] == ["shard-00001", "shard-00002"]
    assert plan.message() == f"resuming: 1 of 3 shards already committed in {tmp_path}"
    assert plan.items_skipped == 10
    data, _ = read_ids(tmp_path)
    assert sorted(data) == [r["id"] for r in shards[0].rows], "the half-committed shard's file must be gone"
    assert not (tmp_path / "_staging").exists() or not any((tmp_path / "_staging").iterdir())


def test_another_pipeline_or_input_is_refused_and_restart_starts_over(tmp_path):
    shards = resume.plan_shards(_rows(30), 10)
    resume.open_run(tmp_path, "p", shards)
    _commit(tmp_path, shards[0])
    with pytest.raises(resume.RunMismatch, match="holds pipeline 'p', this run is 'q'.*another --out, or --restart"):
        resume.open_run(tmp_path, "q", shards)
    with pytest.raises(resume.RunMismatch, match="different input"):
        resume.open_run(tmp_path, "p", resume.plan_shards(_rows(30, tag="changed"), 10))
    with pytest.raises(resume.RunMismatch, match="cut into 3 shards of up to 10, this run into 6"):
        resume.open_run(tmp_path, "p", resume.plan_shards(_rows(30), 5))
    assert resume.committed_shards(tmp_path) == {"shard-00000"}, "a refused run must not touch the directory"
    plan = resume.open_run(tmp_path, "p", shards, restart=True)
    assert len(plan.pending) == 3 and resume.committed_shards(tmp_path) == set() and read_ids(tmp_path) == ([], [])
    # the flow's mode: a new input replaces the old output instead of being refused
    _commit(tmp_path, shards[0])
    plan = resume.open_run(tmp_path, "p", resume.plan_shards(_rows(30, tag="new"), 10), on_mismatch="restart")
    assert "different input" in plan.restarted and plan.shards_skipped == 0


def test_outputs_without_a_manifest_are_refused(tmp_path):
    _commit(tmp_path, resume.InputShard("part-000000", tuple(_rows(3))))
    with pytest.raises(resume.RunMismatch, match="without a run manifest"):
        resume.open_run(tmp_path, "p", resume.plan_shards(_rows(3), 1))


# ---------------------------------------------------------------- the run command, end to end

def build(*, synth: int | None = None, seed: int = 0, regimes: str | None = None, **_):
    """A pipeline-registry entry: the small test pipeline slowed down so that a run lasts several seconds."""
    return small_pipeline(synth or 50, regimes=regimes or "short:60,long:40", time_scale=8.0)


_LAUNCHER = """
import sys
import trident_flows.pipelines as pipelines
pipelines.PIPELINES["rt-slow"] = "test_resume"
from trident_flows.cli import app
app(sys.argv[1:], prog_name="trident-flows")
"""


def _start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _LAUNCHER, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, env=child_env(COLUMNS="160"))


def _ray_below(proc: psutil.Process, seen: dict) -> None:
    try:
        for child in proc.children(recursive=True):
            if is_ray_process(child):
                seen[(child.pid, child.create_time())] = child
    except psutil.Error:
        pass


def _kill_runner(proc: psutil.Process) -> bool:
    for child in proc.children(recursive=True):
        try:
            if child.cmdline()[:1] and child.cmdline()[0].startswith("ray::PipelineRunner"):
                child.kill()
                return True
        except psutil.Error:
            continue
    return False


def _run(args: list[str], interrupt_after: float | None = None, out: Path | None = None, timeout: float = 300,
         kill_runner: bool = False) -> tuple[int, str, dict]:
    """Run the CLI in its own session; optionally press Ctrl-C (SIGINT to its process group, as a
    terminal does) ``interrupt_after`` seconds after its first shard is committed, or SIGKILL its
    pipeline runner then. Returns the exit code, the output and the Ray processes seen below it.
    A run whose local Ray node did not start (Ray waits a fixed 30 s for its raylet, which a
    machine under heavy load can miss) is started once more: that is the test machine, not the run."""
    for attempt in range(2):
        rc, output, seen = _run_once(args, interrupt_after, out, timeout, kill_runner)
        if "The current node timed out during startup" not in output or attempt:
            break
    return rc, output, seen


def _run_once(args: list[str], interrupt_after: float | None, out: Path | None, timeout: float,
              kill_runner: bool) -> tuple[int, str, dict]:
    proc = _start(args)
    me = psutil.Process(proc.pid)
    seen: dict = {}
    first_commit = None
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        _ray_below(me, seen)
        if interrupt_after is not None and out is not None:
            if first_commit is None and resume.committed_shards(out):
                first_commit = time.monotonic()
            if first_commit is not None and time.monotonic() - first_commit >= interrupt_after:
                if not kill_runner:
                    os.killpg(proc.pid, signal.SIGINT)
                    interrupt_after = None
                elif _kill_runner(me):
                    interrupt_after = None
        time.sleep(0.1)
    try:
        output, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    return proc.returncode, output, seen


def _left_running(seen: dict) -> list[str]:
    time.sleep(1.0)
    alive = []
    for (pid, created), _ in seen.items():
        try:
            p = psutil.Process(pid)
            if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{p.name()} {pid}")
        except psutil.Error:
            continue
    return alive


def test_interrupted_run_resumes_to_the_ids_of_an_uninterrupted_run_and_leaves_nothing_running(tmp_path):
    seed = random.randrange(10**6)
    rng = random.Random(seed)
    common = ["run", "rt-slow", "--synth", "240", "--cpus", "4", "--gpus", "0", "--policy", "static"]
    full, part = tmp_path / "full", tmp_path / "part"

    rc, output, seen = _run([*common, "--out", str(full), "--summary-json", str(tmp_path / "full.json")])
    assert rc == 0, output[-3000:]
    assert seen, "the run should have started Ray processes"
    assert _left_running(seen) == [], "Ray processes left running after a normal exit"
    reference = sorted(sum(read_ids(full), []))
    assert len(reference) == 240 and json.loads((tmp_path / "full.json").read_text())["shards_total"] == 40

    delay = rng.uniform(0.0, 4.0)
    rc, output, seen = _run([*common, "--out", str(part)], interrupt_after=delay, out=part)
    assert rc == 130, f"seed {seed}, delay {delay:.2f}: {output[-3000:]}"
    assert "run the same command again to resume" in output, output[-2000:]
    assert _left_running(seen) == [], f"Ray processes left running after Ctrl-C (seed {seed})"
    committed = len(resume.committed_shards(part))
    assert 1 <= committed < 40, f"seed {seed}, delay {delay:.2f}: interrupt landed with {committed} shards committed"
    data, dead = read_ids(part)
    assert len(data) + len(dead) == len(set(data + dead)), "an interrupted run left duplicate ids"

    rc, output, _ = _run([*common, "--out", str(part), "--summary-json", str(tmp_path / "part.json")])
    assert rc == 0, output[-3000:]
    assert f"resuming: {committed} of 40 shards already committed" in output
    summary = json.loads((tmp_path / "part.json").read_text())
    assert summary["shards_skipped"] == committed and summary["items_in"] == 240
    assert summary["duplicate_ids"] == 0 and summary["items_missing"] == 0
    resumed = sum(read_ids(part), [])
    assert len(resumed) == len(set(resumed)) and sorted(resumed) == reference, f"seed {seed}"

    rc, output, _ = _run([*common[:3], "250", *common[4:], "--out", str(part)])
    assert rc == 2 and "holds another run" in output and "--restart" in output, output[-2000:]
    assert sorted(sum(read_ids(part), [])) == reference, "a refused run must leave the output as it was"

    # the pipeline runner SIGKILLed mid-run: the command restarts it and finishes from the committed shards
    killed = tmp_path / "killed"
    rc, output, seen = _run([*common, "--out", str(killed), "--summary-json", str(tmp_path / "killed.json")], interrupt_after=0.0,
                            out=killed, kill_runner=True)
    assert rc == 0 and "the pipeline runner died" in output, output[-3000:]
    assert json.loads((tmp_path / "killed.json").read_text())["duplicate_ids"] == 0
    assert sorted(sum(read_ids(killed), [])) == reference
    assert _left_running(seen) == []


# ---------------------------------------------------------------- near-duplicates across a resume

def _dedup_corpus() -> list[dict]:
    """12 documents in 3 shards of 4, with near-duplicate pairs across shards (01~06, 02~09, 05~10)
    and inside one (08~11)."""
    from trident_flows.pipelines.doc_text import paragraph

    rng = random.Random(5)
    texts = {k: paragraph(rng, "en", 300) for k in range(12)}
    for original, duplicate in ((1, 6), (2, 9), (5, 10), (8, 11)):
        words = texts[original].split()
        words[len(words) // 2] = "zebra"
        texts[duplicate] = " ".join(words)
    return [{"id": f"doc-{k:02d}", "text": texts[k]} for k in range(12)]


def _dedup_spec(rows: list[dict]):
    """A documents pipeline reduced to its dedup operator, over text rows, with a fresh index (a new run)."""
    import uuid

    from trident_flows.pipelines import documents
    from trident_flows.runtime.spec import PipelineSpec

    dedup = next(op for op in documents.operator_specs(f"test-{uuid.uuid4().hex}") if op.name == "dedup")
    return PipelineSpec("documents", (dedup,), lambda: iter([dict(r) for r in rows]), items=len(rows))


def _dedup_shard(spec, out: Path, shard: resume.InputShard, commit: bool) -> None:
    """Run one shard through the spec's dedup operator (its index sees every row); commit its output if asked."""
    from trident_flows.runtime.spec import DROP, rows_to_batch

    batch = spec.operators[0].build()(rows_to_batch([dict(r) for r in shard.rows]))
    rows = [{k: v[j] for k, v in batch.items() if k != "_error"} for j in range(len(shard.rows))]
    for row in rows:
        if not row[DROP]:
            row.pop(DROP)  # as the runner writes a kept row
    if commit:
        sink = Sink(out)
        sink.write_part(shard.shard_id, rows, [])
        sink.commit(shard.shard_id)
        sink.close()


def _dedup_outcome(out: Path) -> list[tuple]:
    import pyarrow.parquet as pq

    rows = [r for p in sorted((out / "data").glob("*.parquet")) for r in pq.read_table(p).to_pylist()]
    return sorted((r["id"], r.get("_drop"), r.get("duplicate_of") or "") for r in rows)


@pytest.mark.parametrize("interrupted", [
    pytest.param(((0, True), (1, False)), id="first-shard-committed"),
    pytest.param(((2, True), (0, False)), id="last-shard-committed-originals-pending"),
    pytest.param(((1, False), (2, True)), id="committed-duplicate-of-an-uncommitted-original"),
])
def test_a_resumed_run_marks_the_near_duplicates_an_uninterrupted_run_marks(tmp_path, interrupted):
    from trident_flows.pipelines import finish_pipeline, resume_pipeline
    from trident_flows.pipelines.doc_dedup import release_index

    rows = _dedup_corpus()
    shards = resume.plan_shards(rows, 4)
    specs = [_dedup_spec(rows) for _ in range(3)]
    try:
        full, part = tmp_path / "full", tmp_path / "part"
        resume.open_run(full, "documents", shards)
        for shard in shards:
            _dedup_shard(specs[0], full, shard, commit=True)
        finish_pipeline(specs[0], full)
        reference = _dedup_outcome(full)
        assert [(i, d) for i, d, _ in reference if d] == [("doc-06", "duplicate-of:doc-01"), ("doc-09", "duplicate-of:doc-02"),
                                                         ("doc-10", "duplicate-of:doc-05"), ("doc-11", "duplicate-of:doc-08")]

        resume.open_run(part, "documents", shards)  # a run that dies after these shards, before its end
        for k, commit in interrupted:
            _dedup_shard(specs[1], part, shards[k], commit=commit)
        plan = resume.open_run(part, "documents", shards)  # re-run: a new process, a new (empty) index
        assert plan.shards_skipped == 1
        assert resume_pipeline(specs[2], part)["seeded"] == 4
        for shard in plan.pending:
            _dedup_shard(specs[2], part, shard, commit=True)
        finish_pipeline(specs[2], part)
        assert _dedup_outcome(part) == reference
    finally:
        for spec in specs:
            release_index(spec.operators[0].params["index_name"])


@pytest.mark.models
def test_a_document_dead_lettered_after_dedup_still_marks_its_near_duplicates_on_resume(tmp_path):
    """doc-01 went through dedup (kept) and was dead-lettered by embed in a committed shard; its near-duplicate
    doc-03 runs after the resume and is marked, as in an uninterrupted run: doc-01 is read again from its PDF."""
    from fpdf import FPDF

    from trident_flows.pipelines import documents, resume_pipeline
    from trident_flows.pipelines.doc_dedup import release_index
    from trident_flows.runtime.spec import DROP, rows_to_batch

    texts = {row["id"]: row["text"] for row in _dedup_corpus()[:3]}
    words = texts["doc-01"].split()
    words[len(words) // 2] = "zebra"
    texts["doc-03"] = " ".join(words)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for key, text in texts.items():
        pdf = FPDF()
        pdf.add_page()
        pdf.set_font("helvetica", size=11)
        pdf.multi_cell(0, 6, text)
        (corpus / f"{key}.pdf").write_bytes(bytes(pdf.output()))
    spec = documents.build(input=corpus)
    before_dedup = spec.operators[:[op.name for op in spec.operators].index("dedup")]
    shards = resume.plan_shards(list(spec.source()), 2)
    out = tmp_path / "out"
    resume.open_run(out, "documents", shards)
    parsed = rows_to_batch([dict(r) for r in shards[0].rows])
    for op in before_dedup:
        parsed = op.build()(parsed)
    sink = Sink(out)  # the earlier run: doc-00 written, doc-01 dead-lettered by embed
    sink.write_part("shard-00000", [{"id": "doc-00", "text": str(parsed["text"][0])}],
                    [{"id": "doc-01", "source_id": None, "shard": "shard-00000", "operator": "embed",
                      "error": "device out of memory after 3 attempts", "attempts": 3}])
    sink.commit("shard-00000")
    sink.close()
    try:
        assert [s.shard_id for s in resume.open_run(out, "documents", shards).pending] == ["shard-00001"]
        assert resume_pipeline(spec, out) == {"seeded": 2, "reparsed": 1}
        batch = rows_to_batch([dict(r) for r in shards[1].rows])
        for op in (*before_dedup, spec.operator("dedup")):
            batch = op.build()(batch)
        assert dict(zip(batch["id"], batch[DROP])) == {"doc-02": "", "doc-03": "duplicate-of:doc-01"}
    finally:
        release_index(documents.dedup_index_name(spec))
