"""Every benchmark report records where and how it ran (``bench.provenance``): the commit and tree state of
the checkout the code runs from, the machine, the load before, during (sampled) and after, ``alone``, and
an overload warning printed first when a benchmark starts at a load above the core count."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from benchmarks import BENCHMARKS
from benchmarks.provenance import LoadDuring, LoadSampler, ProvenanceRecorder, code_repo, git_state
from benchmarks.report import BenchResult, write_report
from trident_flows.cli import app

REPO = Path(__file__).resolve().parents[1]
CPUS = os.cpu_count() or 1


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    """A git repository with one commit of a tracked file and a tracked result."""
    root = tmp_path / "repo"
    (root / "bench-results").mkdir(parents=True)
    (root / "code.py").write_text("x = 1\n")
    (root / "bench-results" / "old.json").write_text("{}\n")
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "one")
    return root


def test_the_commit_is_the_head_of_the_checkout_the_code_runs_from():
    assert code_repo() == REPO
    state = git_state(code_repo())
    assert state.commit == git(REPO, "rev-parse", "HEAD") and state.commit_note is None
    assert state.dirty == bool(git(REPO, "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)bench-results"))


def test_dirty_is_an_uncommitted_change_to_a_tracked_file_outside_the_results(repo: Path):
    head = git(repo, "rev-parse", "HEAD")
    assert git_state(repo) == git_state(repo / "bench-results")  # any folder of the checkout
    assert git_state(repo).commit == head and git_state(repo).dirty is False
    (repo / "untracked.py").write_text("y = 2\n")
    (repo / "bench-results" / "old.json").write_text('{"changed": true}\n')
    assert git_state(repo).dirty is False  # untracked files and bench-results/ do not count
    (repo / "code.py").write_text("x = 2\n")
    assert git_state(repo).dirty is True
    git(repo, "add", "code.py")
    assert git_state(repo).dirty is True  # staged, not committed
    git(repo, "commit", "-q", "-m", "two")
    assert git_state(repo).dirty is False and git_state(repo).commit != head


def test_no_checkout_or_no_git_gives_a_null_commit_that_says_why(tmp_path: Path, monkeypatch):
    outside = git_state(tmp_path)
    assert outside.commit is None and outside.dirty is None and "not in a git checkout" in outside.commit_note
    assert "does not run from a git checkout" in git_state(None).commit_note
    monkeypatch.setenv("PATH", str(tmp_path))  # no git on it
    assert git_state(REPO).commit_note == "git is not installed"
    assert code_repo() is None
    json_path, _ = write_report(BenchResult("nogit", {"x": 1.0}), tmp_path / "out", quick=True)
    provenance = json.loads(json_path.read_text())["provenance"]
    assert provenance["commit"] is None and provenance["commit_note"]


def test_the_load_is_sampled_on_a_daemon_thread_until_stopped():
    seen: list[float] = []

    def load() -> float:
        seen.append(float(len(seen) % 5))
        return seen[-1]

    sampler = LoadSampler(interval_s=0.005, load=load).start()
    deadline = time.monotonic() + 5.0
    while len(seen) < 7 and time.monotonic() < deadline:
        time.sleep(0.005)
    during = sampler.stop()
    assert not any(t.name == "bench-load-sampler" and t.is_alive() for t in threading.enumerate())
    assert during.samples == len(seen) >= 7
    assert during.median == statistics.median(seen) and during.max == 4.0
    count = len(seen)
    time.sleep(0.05)
    assert len(seen) == count  # nothing sampled after stop
    assert LoadDuring.of([]) == LoadDuring(None, None, 0)


def test_a_start_above_the_core_count_warns_first_and_is_recorded(repo: Path):
    said: list[str] = []
    recorder = ProvenanceRecorder.start(["bench", "x"], repo=repo, interval_s=0.01, env={"ALONE_LOAD_BEFORE": str(CPUS + 1.5)},
                                        say=said.append, load=lambda: 0.25)
    time.sleep(0.1)
    provenance = recorder.finish()
    assert len(said) == 1 and said[0].startswith(f"WARNING: load average {CPUS + 1.5:.2f} above the {CPUS} cores")
    assert provenance.overloaded_at_start is True and provenance.load_before == CPUS + 1.5
    assert provenance.load_before_from == "ALONE_LOAD_BEFORE" and provenance.alone is False
    assert provenance.load_during.samples >= 1 and provenance.load_during.max == 0.25 and provenance.load_after == 0.25
    assert provenance.commit == git(repo, "rev-parse", "HEAD") and provenance.dirty is False
    assert provenance.command == ("bench", "x") and provenance.recorded == "run" and provenance.wall_s >= 0.1

    quiet: list[str] = []
    calm = ProvenanceRecorder.start(repo=repo, env={"ALONE": "1"}, say=quiet.append, load=lambda: CPUS - 0.5).finish()
    assert quiet == [] and calm.overloaded_at_start is False and calm.load_before == round(CPUS - 0.5, 2)
    assert calm.load_before_from == "getloadavg" and calm.alone is True
    assert ProvenanceRecorder.start(repo=repo, env={}, say=quiet.append, load=lambda: CPUS + 0.1).finish().overloaded_at_start
    assert quiet and quiet[0].startswith("WARNING")


@pytest.mark.parametrize("given", ["high", "-1", "nan"])
def test_a_malformed_alone_load_before_names_the_fix(given: str):
    with pytest.raises(ValueError, match="ALONE_LOAD_BEFORE=.* export the 1-minute load average"):
        ProvenanceRecorder.start(env={"ALONE_LOAD_BEFORE": given})


def test_write_report_without_a_recorder_records_what_it_can_at_write_time(tmp_path: Path):
    json_path, _ = write_report(BenchResult("direct", {"x": 1.0}, raw={"time_scale": 0.5}), tmp_path, quick=False)
    report = json.loads(json_path.read_text())
    provenance = report["provenance"]
    assert "machine" not in report  # folded into provenance
    assert provenance["recorded"] == "write" and provenance["load_before"] is None and provenance["load_during"] is None
    assert provenance["overloaded_at_start"] is None and provenance["load_after"] >= 0
    assert provenance["commit"] == git(REPO, "rev-parse", "HEAD") and provenance["time_scale"] == 0.5
    assert provenance["cpus"] == CPUS and provenance["memory_gib"] > 0 and provenance["python"] == sys.version.split()[0]
    assert provenance["date_utc"].endswith("Z") and isinstance(provenance["command"], list)


STUB = textwrap.dedent('''
    from benchmarks.report import BenchResult

    def run(quick=False):
        print("stub running")
        return BenchResult("stub", {"figure": 1.0}, raw={"time_scale": 0.25})
''')


def test_the_bench_command_records_provenance_and_prints_the_overload_warning_first(tmp_path: Path, monkeypatch):
    (tmp_path / "stub_benchmark.py").write_text(STUB)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(BENCHMARKS, "stub", "stub_benchmark")
    monkeypatch.setenv("ALONE", "1")
    monkeypatch.setenv("ALONE_LOAD_BEFORE", str(CPUS + 3))
    result = CliRunner().invoke(app, ["bench", "stub", "--out", str(tmp_path / "out")], terminal_width=400)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"WARNING: load average {CPUS + 3:.2f} above the {CPUS} cores"), lines[:3]
    assert lines[1] == "stub running"
    provenance = json.loads((tmp_path / "out" / "stub.json").read_text())["provenance"]
    assert provenance["commit"] == git(REPO, "rev-parse", "HEAD") and provenance["recorded"] == "run"
    assert provenance["overloaded_at_start"] is True and provenance["alone"] is True and provenance["time_scale"] == 0.25
    assert provenance["load_before"] == CPUS + 3 and provenance["load_during"]["samples"] == 0
    assert "provenance: commit " + provenance["commit"][:10] in result.stdout

    monkeypatch.setenv("ALONE_LOAD_BEFORE", "soon")
    refused = CliRunner().invoke(app, ["bench", "stub", "--out", str(tmp_path / "out2")])
    assert refused.exit_code == 2 and refused.stderr.startswith("error: ALONE_LOAD_BEFORE='soon'")
    assert "stub running" not in refused.stdout and not (tmp_path / "out2").exists()
