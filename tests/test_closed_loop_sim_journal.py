"""closed-loop-sim's run journal: a benchmark of hours stopped part way is resumed without running again
the runs it finished, and only those of the same code and the same streams; a per-regime static whose
config equals static-avg's is run once."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import closed_loop_sim as cls
from trident_flows.sim.static_search import StaticConfig

WORKLOAD = {"pipeline": "documents", "nodes": 8, "items": 1000, "schedule": "short:900,long:100"}


def _row(system: str, rate: float | None = 10.0, repeat: int = 0, error: str = "", **workload: object) -> dict:
    w = {**WORKLOAD, **workload}
    return {"pipeline": w["pipeline"], "nodes": w["nodes"], "system": system, "repeat": repeat, "items": w["items"],
            "schedule": w["schedule"], "items_per_s": rate, "error": error}


def test_a_resumed_journal_gives_back_the_finished_runs_of_the_same_workload_system_repeat_and_stream(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    book = cls.RunJournal(path, resume=False)
    book.add(_row("static-avg", 10.0))
    book.add(_row("trident", 9.5, repeat=1))
    again = cls.RunJournal(path, resume=True)
    assert again.row(WORKLOAD, "static-avg", 0)["items_per_s"] == 10.0
    assert again.row(WORKLOAD, "trident", 1)["items_per_s"] == 9.5
    assert again.row(WORKLOAD, "trident", 0) is None  # another repeat
    assert again.row({**WORKLOAD, "items": 2000}, "static-avg", 0) is None  # another stream
    assert again.row({**WORKLOAD, "nodes": 64}, "static-avg", 0) is None


def test_a_journal_keeps_no_failed_run_skips_a_line_cut_short_and_starts_afresh_unless_resumed(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    book = cls.RunJournal(path, resume=False)
    book.add(_row("ds2", None, error="ValueError: boom"))
    book.add(_row("static-avg", 10.0))
    with path.open("a") as f:
        f.write('{"code": "')  # the run was stopped while writing its last line
    resumed = cls.RunJournal(path, resume=True)
    assert resumed.row(WORKLOAD, "ds2", 0) is None
    assert resumed.row(WORKLOAD, "static-avg", 0) is not None
    assert cls.RunJournal(path, resume=False).row(WORKLOAD, "static-avg", 0) is None
    assert cls.RunJournal(path, resume=True).row(WORKLOAD, "static-avg", 0) is None  # the fresh journal emptied the file


def test_runs_of_other_code_are_not_taken_but_a_static_run_outlives_a_change_to_the_policies(tmp_path: Path,
                                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "runs.jsonl"
    book = cls.RunJournal(path, resume=False)
    book.add(_row("static-avg", 10.0))
    book.add(_row("trident", 9.5))
    real = cls.code_fingerprint
    # only the scheduler package changed: the static run (no policy ticks in it) is still this code's
    monkeypatch.setattr(cls, "code_fingerprint", lambda policies=True: "policies-changed" if policies else real(policies=False))
    resumed = cls.RunJournal(path, resume=True)
    assert resumed.row(WORKLOAD, "static-avg", 0) is not None
    assert resumed.row(WORKLOAD, "trident", 0) is None
    monkeypatch.setattr(cls, "code_fingerprint", lambda policies=True: "all-changed")
    assert cls.RunJournal(path, resume=True).row(WORKLOAD, "static-avg", 0) is None


def test_the_policies_fingerprint_leaves_out_only_the_scheduler_package() -> None:
    assert cls.code_fingerprint() != cls.code_fingerprint(policies=False)
    assert cls.code_fingerprint(policies=False) == cls.code_fingerprint(policies=False)


def test_a_static_whose_config_equals_one_run_before_it_is_that_ones_run() -> None:
    same = StaticConfig((("parse", "cpu", 1), ("embed", "gpu", 2)), 10.0)
    other = StaticConfig((("parse", "cpu", 3), ("embed", "gpu", 1)), 9.0)
    workload = {**WORKLOAD, "statics": {"static-avg": same, "static-short": other, "static-long": same}}
    cells = [(workload, s, 0) for s in ("static-avg", "static-short", "static-long", "trident")]
    assert [cls._same_config(c, cells) for c in cells] == [None, None, "static-avg", None]
    # where static-avg does not run, static-long runs itself
    assert cls._same_config(cells[2], cells[1:]) is None


def test_a_stopped_benchmark_resumed_runs_only_what_it_had_not_finished(tmp_path: Path) -> None:
    journal = tmp_path / "runs.jsonl"
    kw = dict(quick=True, workloads=["documents-1"], systems=["static-avg", "static-short"], journal=journal, log=lambda *_: None)
    first = cls.run(**kw)
    lines = journal.read_text().splitlines()
    assert len(lines) == 2
    journal.write_text(lines[0] + "\n")  # as if stopped after its first run
    resumed = cls.run(**kw, resume=True)
    assert len(resumed.raw["from_journal"]) == 1
    assert len(journal.read_text().splitlines()) == 2
    rates = {r["system"]: r["items_per_s"] for r in first.raw["runs"]}
    assert {r["system"]: r["items_per_s"] for r in resumed.raw["runs"]} == rates
