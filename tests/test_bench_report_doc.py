"""``trident-flows bench report`` writes ``docs/benchmarks.md`` from the results (``bench.report_doc``): per
result its figures against their targets, its provenance and a stale mark decided by git history;
``--check`` fails with a reason and a diff when the file differs. The catalogue it reads covers every
benchmark and the code each one runs."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from benchmarks import BENCHMARKS
from benchmarks.catalogue import CATALOGUE, Benchmark
from benchmarks.report_doc import README_END, README_START, check, freshness, render, render_readme, stream_length, write
from trident_flows.cli import app
from trident_flows.core.state import RuntimeConfigError

REPO = Path(__file__).resolve().parents[1]
DATE = "2026-01-02T03:04:05Z"
TOY = {
    "alpha": Benchmark("Is alpha fast?", ("pkg/alpha.py",), systems={"fast": "the fast way", "slow": "the slow way"},
                       headline=("speed",)),
    "beta": Benchmark("Does beta hold?", ("pkg/beta.py", "pkg/shared")),
}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def commit(repo: Path, path: str, text: str) -> str:
    (repo / path).parent.mkdir(parents=True, exist_ok=True)
    (repo / path).write_text(text)
    git(repo, "add", path)
    git(repo, "commit", "-q", "-m", f"change {path}")
    return git(repo, "rev-parse", "HEAD")


def result(name: str, sha: str | None, summary: dict, targets: dict | None = None, **provenance) -> dict:
    report = {"name": name, "quick": False, "summary": summary, "targets": targets or {}, "notes": "", "raw": {}}
    if sha != "none":
        report["provenance"] = {"recorded": "run", "commit": sha, "commit_note": None if sha else "git is not installed",
                                "dirty": False, "date_utc": DATE, "command": ["trident-flows", "bench", name], "cpus": 2,
                                "memory_gib": 23.5, "load_before": 0.5, "load_before_from": "ALONE_LOAD_BEFORE",
                                "load_during": {"median": 1.0, "max": 1.5, "samples": 12}, "load_after": 0.75, "wall_s": 120.0,
                                "time_scale": None, "alone": True, "overloaded_at_start": False, **provenance}
    return report


@pytest.fixture()
def repo(tmp_path: Path) -> dict:
    """A repository whose alpha code changed after the first result ran, and whose beta code last changed first."""
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q")
    shas = {"c1": commit(root, "pkg/alpha.py", "v = 1\n")}
    shas["c2"] = commit(root, "pkg/shared/beta_helper.py", "w = 1\n")
    shas["c3"] = commit(root, "pkg/alpha.py", "v = 2\n")
    commit(root, ".gitignore", "bench-results/quick/\n")
    results = root / "bench-results"

    def put(rel: str, report: dict) -> None:
        (results / rel).parent.mkdir(parents=True, exist_ok=True)
        (results / rel).write_text(json.dumps(report))

    put("alpha.json", result("alpha", shas["c1"], {"speed": 2.5, "fast": {"speed": 3.25, "ooms": 0}},
                             {"speed": {"goal": ">= 2.0", "met": True}, "fast.ooms": {"goal": "== 0", "met": True}}))
    put("sub/alpha.json", result("alpha", shas["c3"], {"speed": 1.5, "fast": {"speed": None, "ooms": 1}},
                                 {"speed": {"goal": ">= 2.0", "met": False}}, dirty=True))
    (results / "sub" / "alpha.png").write_bytes(b"png")
    put("beta.json", result("beta", shas["c2"], {"held": True, "spread": [1, 2]}))
    put("beta-old.json", {**result("beta", "none", {"held": False}), "machine": {"time_utc": DATE, "cpus": 2}})
    put("beta-nogit.json", result("beta", None, {"held": True}))
    put("beta-elsewhere.json", result("beta", "f" * 40, {"held": True}))
    put("quick/alpha.json", result("alpha", shas["c3"], {"speed": 99.0}))  # git ignores it
    return {"root": root, "results": results, "doc": root / "docs" / "benchmarks.md", **shas}


def section(text: str, heading: str) -> str:
    return text.split(f"### `bench-results/{heading}`", 1)[1].split("\n### ", 1)[0].split("\n## ", 1)[0]


def test_stale_and_fresh_are_decided_by_git_history(repo: dict):
    text = render(repo["results"], repo["doc"], TOY)
    c1, c3 = repo["c1"][:10], repo["c3"][:10]
    assert f"**Status:** STALE: its code changed in {c3}, after {c1}." in section(text, "alpha.json")
    assert "**Status:** fresh (dirty tree)." in section(text, "sub/alpha.json")
    assert "**Status:** fresh." in section(text, "beta.json")  # pkg/shared changed last in c2, the commit it ran on
    assert "**Status:** no provenance." in section(text, "beta-old.json")
    assert "**Status:** no commit (git is not installed)." in section(text, "beta-nogit.json")
    assert "**Status:** unknown commit ffffffffff (not in this repository)." in section(text, "beta-elsewhere.json")
    # the ignored quick result is left out: neither its file nor its figure (99, not the 99 inside a commit hash)
    assert "6 results: 2 fresh, 4 stale." in text and "quick/alpha.json" not in text and not re.search(r"\b99(\.0)?\b", text)

    later = commit(repo["root"], "pkg/shared/beta_helper.py", "w = 2\n")
    assert f"**Status:** STALE: its code changed in {later[:10]}, after {repo['c2'][:10]}." in section(
        render(repo["results"], repo["doc"], TOY), "beta.json")
    assert freshness(None, ("pkg/alpha.py",), repo["root"]).stale
    assert not freshness({"commit": repo["c3"]}, ("pkg/alpha.py",), repo["root"]).stale


def test_the_report_shows_question_systems_figures_targets_and_provenance(repo: dict):
    text = render(repo["results"], repo["doc"], TOY)
    alpha = text.split("## alpha\n", 1)[1].split("\n## beta\n", 1)[0]
    assert "**Question.** Is alpha fast?" in alpha and "- `fast`: the fast way." in alpha and "**Code measured.** `pkg/alpha.py`" in alpha
    assert "| `speed` | 2.5 | >= 2.0 | met |" in section(text, "alpha.json")
    assert "| `fast.ooms` | 0 | == 0 | met |" in section(text, "alpha.json")
    assert "| `speed` | 1.5 | >= 2.0 | **NOT met** |" in section(text, "sub/alpha.json")
    assert "| `fast.speed` | n/a |  |  |" in section(text, "sub/alpha.json")
    assert "| `spread` | [1, 2] |  |  |" in section(text, "beta.json") and "| `held` | true |  |  |" in section(text, "beta.json")
    assert "![alpha: sub/alpha.json](../bench-results/sub/alpha.png)" in section(text, "sub/alpha.json")
    provenance = section(text, "beta.json").split("**Provenance.** ", 1)[1].splitlines()[0]
    assert provenance.startswith(f"commit {repo['c2'][:10]} (clean); started {DATE}; ran 2.0 min; load before 0.50 (ALONE_LOAD_BEFORE), "
                                 "during median 1.00 max 1.50 (12 samples), after 0.75; 2 cores, 23.5 GiB; alone")
    assert provenance.endswith("command `trident-flows bench beta`")
    assert f"none recorded: commit, tree state and load unknown (its `machine` block: written {DATE} on 2 cores)." in text
    headline = text.split("## Headline\n", 1)[1].split("\n## ", 1)[0]
    assert f"| alpha | `alpha.json` | `speed` | 2.5 | >= 2.0 | met | STALE: its code changed in {repo['c3'][:10]}, after {repo['c1'][:10]} |" \
        in headline
    assert "| alpha | `alpha.json` | `fast.speed` | 3.25 |  |  | STALE" in headline and "`fast.ooms`" not in headline
    assert "| alpha | `sub/alpha.json` | `speed` | 1.5 | >= 2.0 | **NOT met** | fresh (dirty tree) |" in headline
    assert "beta" not in headline  # beta declares no headline figure


def test_a_ratio_to_an_oracle_the_policy_beats_is_never_read_as_met(tmp_path: Path):
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q")
    sha = commit(root, "pkg/alpha.py", "v = 1\n")
    (root / "bench-results").mkdir()
    report = result("alpha", sha, {"speed": 1.0, "ratio_to_oracle": 6.36, "sim": {"w": {"t_over_oracle": 1.01}}},
                    {"ratio_to_oracle": {"goal": ">= 0.9", "met": True}})
    (root / "bench-results" / "alpha.json").write_text(json.dumps(report))
    text = render(root / "bench-results", root / "docs" / "benchmarks.md", TOY)
    assert "| `ratio_to_oracle` | 6.36 | >= 0.9 | **oracle beaten**: not an upper bound (> 1.02) |" in text
    assert "| `sim.w.t_over_oracle` | 1.01 |  |  |" in text  # within the 2% the oracle's search is held to
    assert "above 1.02 is marked **oracle beaten**" in text


def test_the_report_is_deterministic_and_carries_no_generation_time(repo: dict):
    first = render(repo["results"], repo["doc"], TOY)
    assert render(repo["results"], repo["doc"], TOY) == first
    assert time.strftime("%Y-%m-%d", time.gmtime()) not in first


def test_check_passes_on_the_written_report_and_fails_with_a_reason_and_a_diff(repo: dict):
    results, doc = repo["results"], repo["doc"]
    missing = check(results, doc, TOY)
    assert not missing.ok and "does not exist" in missing.reason
    write(results, doc, TOY)
    assert check(results, doc, TOY).ok
    (results / "beta.json").write_text(json.dumps(result("beta", repo["c2"], {"held": False, "spread": [1, 2]})))
    changed = check(results, doc, TOY)
    assert not changed.ok and "\n" not in changed.reason and "differs" in changed.reason
    assert "-| `held` | true |  |  |" in changed.diff and "+| `held` | false |  |  |" in changed.diff
    write(results, doc, TOY)
    commit(repo["root"], "pkg/alpha.py", "v = 3\n")  # the code changed: the fresh result is stale now
    assert not check(results, doc, TOY).ok


def test_a_result_the_catalogue_lacks_or_a_json_that_is_no_report_names_the_fix(tmp_path: Path):
    (tmp_path / "gamma.json").write_text(json.dumps(result("gamma", "none", {})))
    with pytest.raises(RuntimeConfigError, match="benchmark 'gamma', which the catalogue lacks: add .* benchmarks/catalogue.py"):
        render(tmp_path, tmp_path / "doc.md", TOY)
    (tmp_path / "gamma.json").write_text("[1, 2]")
    with pytest.raises(RuntimeConfigError, match="is no benchmark report"):
        render(tmp_path, tmp_path / "doc.md", TOY)


def test_the_command_writes_and_checks_the_report(tmp_path: Path):
    results, doc = tmp_path / "results", tmp_path / "docs" / "benchmarks.md"
    results.mkdir()
    (results / "overhead.json").write_text(json.dumps(result("overhead", "none", {"ratio_vs_ray_data": 1.04},
                                                             {"ratio_vs_ray_data": {"goal": ">= 0.95", "met": True}})))
    readme = tmp_path / "README.md"
    readme.write_text(f"# toy\n\n{README_START}\n{README_END}\n")
    args = ["bench", "report", "--out", str(results), "--doc", str(doc), "--readme", str(readme)]
    runner = CliRunner()
    assert runner.invoke(app, args).exit_code == 0 and "| `ratio_vs_ray_data` | 1.04 | >= 0.95 | met |" in doc.read_text()
    passed = runner.invoke(app, [*args, "--check"])
    assert passed.exit_code == 0 and "README.md match the results" in passed.stdout
    doc.write_text(doc.read_text().replace("| 1.04 |", "| 1.1 |"))
    failed = runner.invoke(app, [*args, "--check"], terminal_width=400)
    assert failed.exit_code == 1
    lines = failed.stderr.splitlines()
    assert lines[0].startswith(f"error: {doc} differs from what the results in {results} give: run `trident-flows bench report`")
    assert "-| `ratio_vs_ray_data` | 1.1 | >= 0.95 | met |" in lines and "+| `ratio_vs_ray_data` | 1.04 | >= 0.95 | met |" in lines
    assert "1.1 |" in doc.read_text()  # --check writes nothing
    refused = runner.invoke(app, ["bench", "report", "--quick", "--repeats", "2"])
    assert refused.exit_code == 2 and "bench report takes only --out, --doc, --readme and --check; drop --quick, --repeats" in refused.stderr
    refused = runner.invoke(app, ["bench", "placement", "--check"])
    assert refused.exit_code == 2 and "--check belongs to bench report" in refused.stderr
    refused = runner.invoke(app, ["bench", "placement", "--readme", str(readme)])
    assert refused.exit_code == 2 and "--readme belongs to bench report" in refused.stderr
    assert "No corpus-trident or closed-loop-suite result in `results/`" in readme.read_text()  # the block says what to run
    readme.write_text("# toy\n")
    failed = runner.invoke(app, [*args, "--check"], terminal_width=400)
    assert failed.exit_code == 2 and f"add a line {README_START} and, below it, a line {README_END}" in " ".join(failed.stderr.split())


# ---------------------------------------------------------------- the README's results block

SUITE_TOY = {**TOY, "closed-loop-suite": Benchmark("Does the suite pay?", ("pkg/suite.py",))}
README = f"""# toy project

Intro.

{README_START}
anything written here is replaced
{README_END}

## Limits
"""


def suite_report(sim_sha: str, live_sha: str) -> dict:
    """A closed-loop-suite report with both sections: its own provenance is the sim section's."""
    sim = {"cpu-only": {"headroom": 1.5, "t_over_oracle": 0.8, "gain_captured": 0.6, "trident_vs_static_hindsight": 1.2,
                        "trident_vs_static_default": 1.25, "trident_ooms": 0},
           "docs-baseline": {"headroom": 1.004, "t_over_oracle": 0.99, "gain_captured": None, "trident_vs_static_hindsight": 0.995}}
    live = {"cpu-only": {"headroom": 1.4, "t_over_oracle": 0.75, "gain_captured": 0.5, "trident_vs_static_hindsight": 1.15,
                         "trident_vs_ray_data_autoscaling": 1.3}}
    report = result("closed-loop-suite", sim_sha, {"sim": sim, "live": live})
    report["raw"] = {"section": "sim", "sim": {}, "live": {}, "live_provenance": result("closed-loop-suite", live_sha, {})["provenance"],
                     "live_note": ""}
    return report


@pytest.fixture()
def suite_repo(tmp_path: Path) -> dict:
    """A repository whose suite code changed between the live run (first commit) and the simulated one (second)."""
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q")
    live = commit(root, "pkg/suite.py", "v = 1\n")
    sim = commit(root, "pkg/suite.py", "v = 2\n")
    results = root / "bench-results"
    results.mkdir()
    (results / "closed-loop-suite.json").write_text(json.dumps(suite_report(sim, live)))
    (root / "README.md").write_text(README)
    return {"root": root, "results": results, "doc": root / "docs" / "benchmarks.md", "readme": root / "README.md", "sim": sim,
            "live": live}


def block(readme: Path) -> str:
    return readme.read_text().split(README_START + "\n", 1)[1].split(README_END, 1)[0]


def test_the_readme_block_is_rewritten_from_the_suite_result_and_nothing_else_changes(suite_repo: dict):
    results, doc, readme = suite_repo["results"], suite_repo["doc"], suite_repo["readme"]
    assert write(results, doc, SUITE_TOY, readme=readme) == (doc, readme)
    text = readme.read_text()
    assert text.startswith("# toy project\n\nIntro.\n\n" + README_START + "\n") and text.endswith(README_END + "\n\n## Limits\n")
    rows = [line for line in block(readme).splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| workload | benchmark | run | stream | headroom | trident / oracle | gain captured | "
                              "trident / best static (hindsight) |")
    assert rows[1:] == [  # simulated rows first, then live; the sim section is fresh, the live one ran before the code changed
        "| cpu-only | closed-loop-suite | SIMULATED | n/a | 1.50x | 0.80 | 0.60 | 1.20x | not simulated | fresh |",
        "| docs-baseline | closed-loop-suite | SIMULATED | n/a | 1.00x | 0.99 | n/a | 0.99x | not simulated | fresh |",
        "| cpu-only | closed-loop-suite | live | n/a | 1.40x | 0.75 | 0.50 | 1.15x | 1.30x | stale |"]
    assert "[docs/benchmarks.md](docs/benchmarks.md)" in block(readme)
    assert "from `bench-results/closed-loop-suite.json`; do not edit" in block(readme)  # names only the results it read
    assert suite_repo["sim"][:7] not in text and suite_repo["live"][:7] not in text  # no commit hash in the README
    assert check(results, doc, SUITE_TOY, readme=readme).ok
    write(results, doc, SUITE_TOY, readme=readme)
    assert readme.read_text() == text  # rewriting is idempotent


def test_the_readme_block_shows_the_corpus_workloads_first_each_section_marked_by_its_run(suite_repo: dict):
    corpus = {"sim": {"documents-corpus": {"headroom": 1.06, "t_over_oracle": 0.97, "gain_captured": 0.4,
                                           "trident_vs_static_hindsight": 1.02}},
              "live": {"documents-corpus": {"trident_vs_static_hindsight": 1.05, "sim_throughput_error": 0.04}}}
    report = result("corpus-trident", suite_repo["live"], corpus)  # its sim section ran before the code changed
    report["raw"] = {"section": "sim", "live_provenance": result("corpus-trident", suite_repo["sim"], {})["provenance"]}
    (suite_repo["results"] / "corpus-trident.json").write_text(json.dumps(report))
    catalogue = {**SUITE_TOY, "corpus-trident": Benchmark("Does it hold live?", ("pkg/suite.py",))}
    write(suite_repo["results"], suite_repo["doc"], catalogue, readme=suite_repo["readme"])
    rows = [line for line in block(suite_repo["readme"]).splitlines() if line.startswith("| ")][1:]
    assert rows[:2] == ["| documents-corpus | corpus-trident | SIMULATED | n/a | 1.06x | 0.97 | 0.40 | 1.02x | not simulated | stale |",
                        "| documents-corpus | corpus-trident | live | n/a | n/a | n/a | n/a | 1.05x | not run | fresh |"]
    assert [r.split(" | ")[1] for r in rows[2:]] == ["closed-loop-suite"] * 3
    legend = block(suite_repo["readme"])
    assert "`bench corpus-trident`: workloads drawn from published corpus statistics" in legend
    assert "from `bench-results/corpus-trident.json` and `bench-results/closed-loop-suite.json`" in legend


def test_a_report_written_before_the_suite_had_sections_is_its_live_section(tmp_path: Path):
    results = tmp_path / "results"
    results.mkdir()
    old = result("closed-loop-suite", "none", {"cpu-only": {"headroom": 1.59, "captured": 0.76, "trident_vs_static_hindsight": 1.21,
                                                            "trident_vs_ray_data_autoscaling": None}})
    (results / "closed-loop-suite.json").write_text(json.dumps(old))
    (tmp_path / "README.md").write_text(README)
    text = render_readme(results, tmp_path / "README.md", tmp_path / "docs" / "benchmarks.md", SUITE_TOY)
    assert "| cpu-only | closed-loop-suite | live (headroom: cost model's) | n/a | 1.59x | n/a | n/a | 1.21x | n/a | stale |" in text


def test_check_fails_on_a_hand_edit_of_the_readme_block(suite_repo: dict):
    results, doc, readme = suite_repo["results"], suite_repo["doc"], suite_repo["readme"]
    write(results, doc, SUITE_TOY, readme=readme)
    readme.write_text(readme.read_text().replace("| 1.40x | 0.75 |", "| 1.90x | 0.75 |"))
    failed = check(results, doc, SUITE_TOY, readme=readme)
    assert not failed.ok and "\n" not in failed.reason
    assert failed.reason.startswith(f"{readme} (its results block) differs from what the results in {results} give")
    assert "-| cpu-only | closed-loop-suite | live | n/a | 1.90x | 0.75 | 0.50 | 1.15x | 1.30x | stale |" in failed.diff
    assert "+| cpu-only | closed-loop-suite | live | n/a | 1.40x | 0.75 | 0.50 | 1.15x | 1.30x | stale |" in failed.diff
    assert check(results, doc, SUITE_TOY).ok  # the report itself still matches
    write(results, doc, SUITE_TOY, readme=readme)
    readme.write_text(readme.read_text().replace("## Limits", "## Known limits"))  # outside the block: the README's own text
    assert check(results, doc, SUITE_TOY, readme=readme).ok
    (results / "closed-loop-suite.json").write_text(json.dumps(suite_report(suite_repo["live"], suite_repo["live"])))
    stale = check(results, doc, SUITE_TOY, readme=readme)  # the sim section's run is now older than its code: stale
    assert not stale.ok and "+| cpu-only | closed-loop-suite | SIMULATED | n/a | 1.50x | 0.80 | 0.60 | 1.20x | not simulated | stale |" in stale.diff


@pytest.mark.parametrize("text, found", [
    ("# toy\n\nno block here\n", "found 0 <!-- results:start --> and 0 <!-- results:end --> line(s)"),
    (f"# toy\n{README_START}\n", "found 1 <!-- results:start --> and 0 <!-- results:end --> line(s)"),
    (f"# toy\n{README_END}\n{README_START}\n", "the end before the start"),
    (f"{README_START}\n{README_END}\n{README_START}\n{README_END}\n", "found 2 <!-- results:start --> and 2"),
])
def test_a_readme_without_its_marker_lines_is_an_error_naming_what_to_add(suite_repo: dict, text: str, found: str):
    results, doc, readme = suite_repo["results"], suite_repo["doc"], suite_repo["readme"]
    readme.write_text(text)
    for call in (lambda: write(results, doc, SUITE_TOY, readme=readme), lambda: check(results, doc, SUITE_TOY, readme=readme)):
        with pytest.raises(RuntimeConfigError) as refused:
            call()
        message = str(refused.value)
        assert found in message and f"add a line {README_START} and, below it, a line {README_END}" in message
    assert readme.read_text() == text and not doc.exists()  # nothing written
    with pytest.raises(RuntimeConfigError, match="does not exist"):
        write(results, doc, SUITE_TOY, readme=suite_repo["root"] / "NO-README.md")


# ---------------------------------------------------------------- the catalogue


def test_the_catalogue_covers_every_benchmark_and_names_code_that_exists():
    assert set(CATALOGUE) == set(BENCHMARKS) and "report" not in BENCHMARKS
    tracked = git(REPO, "ls-files").splitlines()
    for name, bench in CATALOGUE.items():
        assert bench.question.endswith("?") and bench.question.count("?") == 1, name
        for path in bench.code:  # results a benchmark reads (under bench-results/) may not be recorded yet
            assert path.startswith("bench-results/") or any(t == path or t.startswith(path + "/") for t in tracked), \
                f"{name}: {path} is not tracked"
            assert path not in ("benchmarks/report.py", "benchmarks/provenance.py", "benchmarks/catalogue.py"), name


def _imports(path: Path) -> set[str]:
    module = ".".join(path.relative_to(REPO).with_suffix("").parts)
    package = module.rsplit(".", 1)[0] if path.name != "__init__.py" else module.removesuffix(".__init__")
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                source = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([source] if source else []))
            found.add(source)
            found.update(f"{source}.{alias.name}" for alias in node.names)  # a submodule imported by name
    return {name for name in found if name.split(".")[0] in ("trident_flows", "benchmarks")}


def _module_file(name: str) -> Path | None:
    base = REPO / Path(*name.split("."))
    return base / "__init__.py" if (base / "__init__.py").is_file() else base.with_suffix(".py") if base.with_suffix(".py").is_file() else None


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_the_code_a_benchmark_measures_covers_every_module_it_imports(name: str):
    """Read with ``ast`` (function-level imports too): a module the benchmark runs that its code list misses
    would change its figures without marking its results stale."""
    seen: set[Path] = set()
    todo = [BENCHMARKS[name]]
    while todo:
        path = _module_file(todo.pop())
        if path is not None and path not in seen:
            seen.add(path)
            todo.extend(_imports(path))
    # what records results, not what produces them: the writers, and the catalogue (the suite reads its code lists only
    # to decide whether an earlier live run may be kept beside a new one)
    writers = {REPO / "benchmarks/report.py", REPO / "benchmarks/provenance.py", REPO / "benchmarks/catalogue.py"}
    missed = sorted(str(p.relative_to(REPO)) for p in seen - writers
                    if p.name != "__init__.py" and not any(p.relative_to(REPO).as_posix() == c or
                                                           p.relative_to(REPO).as_posix().startswith(c + "/")
                                                           for c in CATALOGUE[name].code))
    assert not missed, f"{name} runs {missed}: add them to its code in benchmarks/catalogue.py"


@pytest.mark.parametrize("name", sorted(n for n, b in CATALOGUE.items() if b.headline))
def test_every_headline_figure_is_a_figure_its_benchmark_writes(name: str):
    source = (REPO / Path(*BENCHMARKS[name].split("."))).with_suffix(".py").read_text()
    for figure in CATALOGUE[name].headline:
        assert f'"{figure}"' in source, f"{name} writes no figure {figure!r}: fix its headline in benchmarks/catalogue.py"


def test_the_headline_marks_each_suite_section_by_the_run_that_measured_it(suite_repo: dict):
    catalogue = {**TOY, "closed-loop-suite": Benchmark("Does the suite pay?", ("pkg/suite.py",), headline=("headroom",))}
    write(suite_repo["results"], suite_repo["doc"], catalogue, readme=suite_repo["readme"])
    rows = [line for line in suite_repo["doc"].read_text().splitlines() if line.startswith("| closed-loop-suite |")]
    sim = next(r for r in rows if "`sim.cpu-only.headroom`" in r)
    live = next(r for r in rows if "`live.cpu-only.headroom`" in r)
    assert sim.endswith("| fresh |")  # the report's own provenance: the simulated run, on the code as it is
    assert "STALE" in live  # the live section ran before the suite's code changed, whatever the file's provenance says


def test_the_headline_marks_each_section_of_any_result_with_sections(suite_repo: dict):
    """corpus-trident keeps a sim and a live section as the suite does: each headline row is marked by its own run."""
    report = {**suite_report(suite_repo["sim"], suite_repo["live"]), "name": "corpus-trident"}
    (suite_repo["results"] / "corpus-trident.json").write_text(json.dumps(report))
    catalogue = {**SUITE_TOY, "corpus-trident": Benchmark("Does it hold live?", ("pkg/suite.py",),
                                                           headline=("trident_vs_static_hindsight",))}
    write(suite_repo["results"], suite_repo["doc"], catalogue)
    rows = [line for line in suite_repo["doc"].read_text().splitlines() if line.startswith("| corpus-trident |")]
    assert next(r for r in rows if "`sim.cpu-only.trident_vs_static_hindsight`" in r).endswith("| fresh |")
    assert "STALE" in next(r for r in rows if "`live.cpu-only.trident_vs_static_hindsight`" in r)


def test_the_stream_column_is_items_and_trident_s_time_from_either_section_s_raw_results():
    simulated = {"items": 480, "runs": {"trident": {"items_per_s": 9.6}, "static-hindsight": {"items_per_s": 24.0}}}
    assert stream_length(simulated) == "480 items, 50 s"
    corpus = {"stream": {"items": 48180, "hours": 2.0}, "runs": {"trident": {"items_per_s": 4.0}}}
    assert stream_length(corpus) == "48,180 items, 3.3 h"
    live = {"items": 27399, "runs": [{"system": "trident"}], "per_system": {"trident": {"items_per_s_median": 41.0}}}
    assert stream_length(live) == "27,399 items, 11 min"
    assert stream_length({"items": 480, "runs": {"trident": {"items_per_s": None}}}) == "n/a"  # a run that failed
    assert stream_length({"runs": {"trident": {"items_per_s": 9.6}}}) == "n/a"
    assert stream_length(None) == "n/a"
