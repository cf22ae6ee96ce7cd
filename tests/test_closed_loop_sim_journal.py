"""closed-loop-sim's run journal: a benchmark stopped part way is resumed without running again the runs it
finished, and only those of the same code and the same streams."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import closed_loop_sim as cls

WORKLOAD = {"pipeline": "documents", "nodes": 8, "items": 1000, "schedule": "short:900,long:100"}


def _row(system: str, rate: float | None = 10.0, error: str = "", **workload: object) -> dict:
    w = {**WORKLOAD, **workload}
    return {"pipeline": w["pipeline"], "nodes": w["nodes"], "system": system, "items": w["items"], "schedule": w["schedule"],
            "items_per_s": rate, "error": error}


def test_a_resumed_journal_gives_back_the_finished_runs_of_the_same_workload_system_and_stream(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    book = cls.RunJournal(path, resume=False)
    book.add(_row("static-default", 10.0))
    book.add(_row("trident", 9.5))
    again = cls.RunJournal(path, resume=True)
    assert again.row(WORKLOAD, "static-default")["items_per_s"] == 10.0
    assert again.row(WORKLOAD, "trident")["items_per_s"] == 9.5
    assert again.row({**WORKLOAD, "items": 2000}, "static-default") is None  # another stream
    assert again.row({**WORKLOAD, "nodes": 64}, "static-default") is None


def test_a_journal_keeps_no_failed_run_skips_a_line_cut_short_and_starts_afresh_unless_resumed(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    book = cls.RunJournal(path, resume=False)
    book.add(_row("trident", None, error="ValueError: boom"))
    book.add(_row("static-default", 10.0))
    with path.open("a") as f:
        f.write('{"code": "')  # the run was stopped while writing its last line
    resumed = cls.RunJournal(path, resume=True)
    assert resumed.row(WORKLOAD, "trident") is None
    assert resumed.row(WORKLOAD, "static-default") is not None
    assert cls.RunJournal(path, resume=False).row(WORKLOAD, "static-default") is None
    assert cls.RunJournal(path, resume=True).row(WORKLOAD, "static-default") is None  # the fresh journal emptied the file


def test_runs_of_other_code_are_not_taken_but_a_static_run_outlives_a_change_to_the_policies(tmp_path: Path,
                                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "runs.jsonl"
    book = cls.RunJournal(path, resume=False)
    book.add(_row("static-default", 10.0))
    book.add(_row("trident", 9.5))
    real = cls.code_fingerprint
    # only the scheduler package changed: the static run (no policy ticks in it) is still this code's
    monkeypatch.setattr(cls, "code_fingerprint", lambda policies=True: "policies-changed" if policies else real(policies=False))
    resumed = cls.RunJournal(path, resume=True)
    assert resumed.row(WORKLOAD, "static-default") is not None
    assert resumed.row(WORKLOAD, "trident") is None
    monkeypatch.setattr(cls, "code_fingerprint", lambda policies=True: "all-changed")
    assert cls.RunJournal(path, resume=True).row(WORKLOAD, "static-default") is None


def test_the_policies_fingerprint_leaves_out_only_the_scheduler_package() -> None:
    assert cls.code_fingerprint() != cls.code_fingerprint(policies=False)
    assert cls.code_fingerprint(policies=False) == cls.code_fingerprint(policies=False)


def test_a_stopped_benchmark_resumed_runs_only_what_it_had_not_finished(tmp_path: Path) -> None:
    journal = tmp_path / "runs.jsonl"
    kw = dict(quick=True, workloads=["documents-1"], journal=journal, log=lambda *_: None)
    first = cls.run(**kw)
    lines = journal.read_text().splitlines()
    assert len(lines) == 2
    journal.write_text(lines[0] + "\n")  # as if stopped after its first run
    resumed = cls.run(**kw, resume=True)
    assert len(resumed.raw["from_journal"]) == 1
    assert len(journal.read_text().splitlines()) == 2
    assert {r["system"] for r in first.raw["runs"]} == set(cls.SYSTEMS)
    static = {r["system"]: r["items_per_s"] for r in first.raw["runs"]}["static-default"]
    assert {r["system"]: r["items_per_s"] for r in resumed.raw["runs"]}["static-default"] == static  # static runs are deterministic
    for result in (first, resumed):
        assert result.summary["items_lost"] == 0 and result.summary["documents-1"]["trident_vs_static_default"] is not None
