"""The command line as a user meets it: a user error is one line saying what to change, exit
status 2, no traceback; help lists what the registries hold; planning prints no solver banner."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from benchmarks import BENCHMARKS
from trident_flows.cli import app
from trident_flows.pipelines import PIPELINES
from trident_flows.planning.catalogue import DEFAULT_CATALOGUE

CATALOGUE = str(DEFAULT_CATALOGUE)


@pytest.fixture()
def used_out(tmp_path):
    out = tmp_path / "used"
    (out / "data").mkdir(parents=True)
    (out / "data" / "shard=0.parquet").write_bytes(b"")
    return out


@pytest.mark.parametrize("args, fix", [
    (["run", "nope"], "choose one of documents, emulated-docs, emulated-video, video"),
    (["run", "documents", "--input", "/no/such/dir"], "no such directory; give a directory of input files, or --synth N"),
    (["run", "emulated-docs", "--synth", "5", "--table", "t"], "--table and URL inputs are for the documents pipeline"),
    (["run", "documents", "--synth", "5", "--retry-dead-letters"], "--retry-dead-letters retries the files a --table remembers"),
    (["run", "documents", "--input", "nosuch://bucket/x", "--table", "t"], "no filesystem for this URL scheme"),
    (["run", "documents"], "needs input="),
    (["run", "emulated-docs", "--input", "."], "use --synth N"),
    (["run", "emulated-docs", "--policy", "magic"], "available policies: ds2, static, threshold, trident"),
    (["run", "emulated-docs", "--regimes", "short=20"], "write NAME:COUNT"),
    (["run", "emulated-docs", "--regimes", "weird:10"], "this profile has ['long', 'scans', 'short']"),
    (["run", "emulated-docs", "--address", "auto"], "give HOST:PORT of your cluster, or leave --address out"),
    (["run", "emulated-docs", "--address", "127.0.0.1:1"], "no Ray cluster answers at --address 127.0.0.1:1"),
    (["run", "emulated-docs", "--synth", "5", "--deadline", "1h"], "--deadline asks Ray's autoscaler for nodes: give --address"),
    (["run", "emulated-docs", "--synth", "5", "--deadline", "1h", "--address", "127.0.0.1:1", "--policy", "static"],
     "--deadline needs --policy trident"),
    (["run", "emulated-docs", "--synth", "5", "--budget", "3", "--address", "127.0.0.1:1"], "--budget needs --catalogue FILE"),
    (["run", "emulated-docs", "--synth", "5", "--deadline", "tomorrow", "--address", "127.0.0.1:1", "--catalogue", CATALOGUE],
     "give seconds from now (5400, 90m, 1.5h) or an ISO 8601 time"),
    (["run", "emulated-docs", "--synth", "5", "--catalogue", CATALOGUE], "add --deadline or --budget"),
    (["bench", "nope"], "choose one of overhead"),
    (["bench", "closed-loop", "--systems", "static-avg,tridnet"], "unknown system 'tridnet': choose one of static-avg"),
    (["bench", "placement", "--systems", "trident"], "benchmark 'placement' has no --systems option; drop it"),
    (["bench", "closed-loop-suite", "--workloads", "cpu-only,gpu-orc"], "unknown workload 'gpu-orc': choose one of gpu-ocr"),
    (["bench", "closed-loop-suite", "--systems", "trident,ray-data"], "unknown system 'ray-data': choose one of static-default"),
    (["bench", "placement", "--workloads", "cpu-only"], "benchmark 'placement' has no --workloads option; drop it"),
    (["bench", "closed-loop-suite", "--subset", "all"], "unknown subset 'all': choose one of confirm, ray-data"),
    (["bench", "closed-loop-suite", "--subset", "confirm", "--repeats", "3"], "--subset fixes the workloads, systems and repeats"),
    (["bench", "placement", "--subset", "confirm"], "benchmark 'placement' has no --subset option; drop it"),
    (["bench", "report", "--subset", "confirm"], "drop --subset"),
    (["bench", "closed-loop-sim", "--workloads", "documents10-9"], "unknown workload 'documents10-9': choose one of documents10-1"),
    (["bench", "closed-loop-sim", "--systems", "static-default,ray-data"], "unknown system 'ray-data': choose one of static-default"),
    (["bench", "closed-loop-sim", "--repeats", "2"], "benchmark 'closed-loop-sim' has no --repeats option; drop it"),
    (["bench", "placement", "--hours", "1"], "benchmark 'placement' has no --hours option; drop it"),
    (["profile", "nope"], "choose one of documents, documents-rapidocr, video"),
    (["synth", "documents", "--out", "x", "--regimes", "weird:3"], "NAME in ['long', 'scans', 'short']"),
    (["synth", "video", "--out", "x", "--regimes", "weird:3"], "choose from ['hd', 'long', 'small', 'tiny']"),
])
def test_a_user_error_is_one_line_naming_the_fix_with_exit_status_2(args, fix, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) <= 2 and lines[0].startswith("error: ") and fix in result.stderr, result.stderr
    assert not (tmp_path / "x").exists()  # nothing written for a refused command


def test_an_out_holding_another_run_is_refused_before_anything_starts(used_out):
    result = CliRunner().invoke(app, ["run", "emulated-docs", "--synth", "10", "--out", str(used_out)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"{used_out} holds outputs of a run" in result.stderr and "use another --out, or --restart" in result.stderr
    assert (used_out / "data" / "shard=0.parquet").exists()


def test_bench_help_lists_every_registered_benchmark():
    result = CliRunner().invoke(app, ["bench", "--help"], terminal_width=400)
    assert result.exit_code == 0
    for name in BENCHMARKS:
        assert name in result.output
    assert "closed-loop-video" in result.output


def test_bench_where_the_benchmarks_are_absent_says_they_run_from_a_checkout(monkeypatch):
    """An installed wheel has no ``benchmarks`` package: every bench command is then a one-line user error."""
    import trident_flows.cli as cli

    monkeypatch.setattr(cli, "_benchmarks_checkout", lambda: None)
    monkeypatch.setitem(sys.modules, "benchmarks", None)  # `import benchmarks` fails, as where the wheel is installed
    for args in (["bench", "closed-loop"], ["bench", "report", "--check"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        assert result.stderr.startswith("error: the benchmarks run from a checkout of the repository"), result.stderr


def test_the_cli_imports_no_benchmark_until_a_bench_command_runs():
    done = subprocess.run([sys.executable, "-c", "import sys, trident_flows.cli; print(sorted(m for m in sys.modules if "
                           "m.split('.')[0] == 'benchmarks'))"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr


def test_run_help_lists_every_registered_pipeline():
    result = CliRunner().invoke(app, ["run", "--help"], terminal_width=400)
    assert result.exit_code == 0 and all(name in result.output for name in PIPELINES)


def test_run_uses_the_trident_policy_unless_told_otherwise():
    import inspect

    from trident_flows.control.launch import run_command

    result = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "400"})
    text = " ".join(result.output.split())
    assert "[default: trident]" in text and "static runs the pipeline as configured" in text
    assert inspect.signature(run_command).parameters["policy"].default == "trident"


def test_planning_prints_no_solver_banner():
    script = """
from trident_flows.scheduler.placement import milp
import pulp
x = pulp.LpVariable("x", 0, 3, cat="Integer")
problem = pulp.LpProblem("p", pulp.LpMaximize)
problem += x
problem.solve(pulp.HiGHS(msg=False))
print("solved", x.value())
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "solved 3.0" and "HiGHS" not in proc.stderr
