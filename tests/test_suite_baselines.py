"""The baselines a user would have (static-default, static-first-n, static-hindsight) and the suite's summary."""

from __future__ import annotations

import subprocess

import pytest

from benchmarks import closed_loop_suite as suite
from benchmarks import suite_workloads
from benchmarks.baselines import STATIC_DEFAULT, STATIC_FIRST_N, STATIC_HINDSIGHT, tune_baselines
from benchmarks.closed_loop_runs import RunRecord
from benchmarks.closed_loop_workload import GPU_BATCHES, Workload
from trident_flows.pipelines.emulated_docs import LAYOUT
from trident_flows.runtime.costmodel import PipelineProfile
from trident_flows.sim.static_search import search_static, stream_seconds

GiB = 2**30
KW = dict(cpus=16, device_memory_bytes=8 * GiB, gpu_batches=GPU_BATCHES, cpu_batch=4)


def _tune(regimes: str, gpus: int = 0, first_n: int = 20):
    profile = PipelineProfile.load("documents")
    stream = Workload("regimes", regimes, seed=3, time_scale=1.0)
    rows = stream.rows(profile)
    return profile, stream, rows, tune_baselines(profile, LAYOUT, rows, stream.blocks(), gpus=gpus, first_n=first_n, **KW)


def test_first_n_is_tuned_on_the_first_items_and_hindsight_on_the_whole_stream():
    profile, stream, rows, base = _tune("short:300,scans:60,long:40")
    names = sorted({f for m in profile.workloads.values() for f in m})
    blocks = [({f: sum(float(r.get(f, 0.0)) for r in rows[a:b]) / (b - a) for f in names}, b - a) for _, a, b in stream.blocks()]
    seconds = {n: stream_seconds(profile, c.as_dict(), blocks) for n, c in base.configs.items()}
    # the first items are all born-digital: first-n sizes for them and is slower on the whole stream
    assert seconds[STATIC_HINDSIGHT] < seconds[STATIC_FIRST_N]
    assert seconds[STATIC_HINDSIGHT] <= seconds[STATIC_DEFAULT]
    for features, _ in blocks:  # no single block's optimum runs the stream faster than hindsight
        single = search_static(profile, features, gpus=0, **KW)
        assert seconds[STATIC_HINDSIGHT] <= stream_seconds(profile, single.as_dict(), blocks) + 1e-9
    assert base.predicted_stream_items_per_s[STATIC_HINDSIGHT] == pytest.approx(len(rows) / seconds[STATIC_HINDSIGHT])


def test_static_default_is_the_pipelines_own_sizing_whatever_the_stream():
    _, _, _, a = _tune("short:300,scans:60", gpus=2)
    _, _, _, b = _tune("scans:60,short:300", gpus=2)
    assert a.configs[STATIC_DEFAULT].label() == b.configs[STATIC_DEFAULT].label()
    assert a.configs[STATIC_FIRST_N].label() != b.configs[STATIC_FIRST_N].label()
    default = a.configs[STATIC_DEFAULT].as_dict()
    assert default["embed"][0].device == "gpu" and sum(r for _, r in default.values()) == 16  # one CPU per replica, all used
    for system in ("trident", "ds2", "threshold", "ray-data-fixed", "ray-data-autoscaling"):
        assert a.start(system) is a.configs[STATIC_DEFAULT]
    assert a.start(STATIC_HINDSIGHT) is a.configs[STATIC_HINDSIGHT]


def test_first_n_outside_the_stream_is_refused():
    with pytest.raises(ValueError, match=r"first_n=500 must lie in 1..100"):
        _tune("short:100", first_n=500)


def _record(system: str, items_per_s: float, *, variant: str = "regimes", ooms: int = 0, lost: int = 0) -> RunRecord:
    return RunRecord(system, variant, 0, 100, items_per_s=items_per_s, ooms=ooms, items_lost=lost, reconfigurations=0,
                     applies_refused=0, refused_repeated=0)


def test_summary_relates_trident_to_each_baseline_the_best_static_and_the_oracle():
    main = [_record("trident", 30.0), _record(STATIC_HINDSIGHT, 20.0), _record(STATIC_DEFAULT, 10.0), _record("oracle", 40.0),
            _record("ray-data-autoscaling", 15.0, lost=1)]
    spikes = [_record("trident", 25.0, variant="spikes", ooms=2), _record(STATIC_DEFAULT, 9.0, variant="spikes", lost=2)]
    s = suite.summarise(main, spikes, model_headroom=2.0)
    assert s["headroom"] == pytest.approx(2.0) and s["t_over_oracle"] == pytest.approx(0.75)
    assert s["gain_captured"] == pytest.approx(0.5)  # (30 - 20) / (40 - 20)
    assert s["trident_vs_static_hindsight"] == pytest.approx(1.5)
    assert s["trident_vs_static_default"] == pytest.approx(3.0)
    assert s["trident_vs_ray_data_autoscaling"] == pytest.approx(2.0)
    assert s["trident_ooms"] == 2 and s["items_lost"] == 3 and s["best_static_ooms"] == 0 and s["model_headroom"] == 2.0
    failed = RunRecord("trident", "regimes", 0, 100, error="RuntimeError: no")
    empty = suite.summarise([failed, _record(STATIC_HINDSIGHT, 20.0)], [], 2.0)
    assert empty["t_over_oracle"] is None and empty["gain_captured"] is None and empty["headroom"] is None  # no oracle ran


def test_equal_time_blocks_follow_each_regimes_optimal_rate():
    profile = PipelineProfile.load("documents")
    schedule = dict(part.split(":") for part in suite_workloads.equal_time_regimes(profile, 0, ("short", "scans"), 60.0).split(","))
    # born-digital documents go through a CPU-only node many times faster than scans
    assert int(schedule["short"]) > 5 * int(schedule["scans"]) > 0
    (cpu_only,) = suite_workloads.suite_workloads(quick=True, names=["cpu-only"])
    assert cpu_only.gpus == 0 and [r for r, _, _ in cpu_only.streams()[0].blocks()] == ["short", "scans", "long", "short"]
    spikes = cpu_only.streams()[1].memory_spikes[0]
    long_block = next(b for b in cpu_only.streams()[0].blocks() if b[0] == "long")
    assert long_block[1] <= spikes[0] and spikes[0] + spikes[1] <= long_block[2]  # inside the long block
    with pytest.raises(ValueError, match=r"unknown suite workload\(s\) \['gpu'\]; choose from \['gpu-ocr'"):
        suite_workloads.suite_workloads(quick=True, names=["gpu"])


def test_a_run_order_brackets_the_single_runs_with_the_repeated_system_and_rotates_equal_repeats():
    assert suite.run_order({STATIC_HINDSIGHT: 1, "trident": 2}) == [("trident", 0), (STATIC_HINDSIGHT, 0), ("trident", 1)]
    assert suite.run_order({"a": 2, "b": 2}) == [("a", 0), ("b", 0), ("b", 1), ("a", 1)]
    assert suite.run_order({"a": 1, "b": 0}) == [("a", 0)] and suite.run_order({}) == []


def test_the_confirm_subset_is_the_issues_live_subset_without_spikes():
    confirm = suite.SUBSETS["confirm"]
    assert {w: dict(r) for w, r in confirm.plan.items()} == {"cpu-only": {STATIC_HINDSIGHT: 1, "trident": 2},
                                                               "docs-baseline": {STATIC_HINDSIGHT: 1, "trident": 1}}
    assert confirm.budget_s == 45 * 60 and suite.SUBSETS["ray-data"].budget_s == 20 * 60
    assert set(suite.SUBSETS["ray-data"].plan) == {"cpu-only"}
    with pytest.raises(ValueError, match="drop --quick"):
        suite.run(quick=True, subset="confirm")
    with pytest.raises(ValueError, match="unknown subset"):
        suite.run(subset="everything")


STREAM = {"items": 100, "regimes": "short:100", "time_scale": 0.5}


def _raw_run(system: str, items_per_s: float, variant: str = "regimes", **extra) -> dict:
    return {**_record(system, items_per_s, variant=variant).to_dict(), **extra}


def _workload(*runs: dict, **stream) -> dict:
    return {**STREAM, **stream, "runs": list(runs), "model_headroom": {"headroom": 1.5}}


def test_a_run_of_some_systems_keeps_the_others_earlier_runs_on_the_same_stream():
    old = {"cpu-only": _workload(_raw_run("trident", 15.0), _raw_run("trident", 14.0), _raw_run(STATIC_HINDSIGHT, 12.0),
                                 _raw_run("ray-data-autoscaling", 1.0)),
           "docs-baseline": _workload(_raw_run("trident", 20.0)), "_run": {"subset": "confirm"}}
    old_summary = {"cpu-only": {"trident_vs_static_hindsight": 1.208}, "docs-baseline": {"trident_vs_static_hindsight": 0.6}}
    provenance = {"commit": "abc", "wall_s": 2600.0}
    new_raw = {"cpu-only": _workload(_raw_run("ray-data-autoscaling", 10.0))}
    new_summary = {"cpu-only": suite.summarise([_record("ray-data-autoscaling", 10.0)], [], 1.5)}
    summary, raw, kept = suite.merge_earlier(new_summary, new_raw, old_summary, old, provenance)
    cpu = raw["cpu-only"]
    assert sorted(r["system"] for r in cpu["runs"]) == ["ray-data-autoscaling", STATIC_HINDSIGHT, "trident", "trident"]
    assert [r["items_per_s"] for r in cpu["runs"] if r["system"] == "ray-data-autoscaling"] == [10.0]  # re-measured: replaced
    assert summary["cpu-only"]["trident_vs_ray_data_autoscaling"] == pytest.approx(1.45)  # median trident 14.5 / 10
    assert summary["cpu-only"]["trident_vs_static_hindsight"] == pytest.approx(14.5 / 12.0)
    assert summary["cpu-only"]["model_headroom"] == 1.5 and cpu["per_system"]["trident"]["runs"] == 2
    assert summary["docs-baseline"] == old_summary["docs-baseline"] and raw["docs-baseline"]["runs"][0]["earlier"] == 0
    assert raw["_earlier"] == [{"provenance": provenance, "run": {"subset": "confirm"}}]
    assert all("earlier" not in r for r in new_raw["cpu-only"]["runs"]) and len(kept["cpu-only"]) == 3


def test_earlier_runs_on_another_stream_or_code_are_dropped_and_kept_runs_keep_their_own_provenance():
    old = {"cpu-only": _workload(_raw_run("trident", 15.0), items=99)}
    new_raw = {"cpu-only": _workload(_raw_run("ray-data-autoscaling", 10.0))}
    new_summary = {"cpu-only": suite.summarise([_record("ray-data-autoscaling", 10.0)], [], 1.5)}
    summary, raw, kept = suite.merge_earlier(new_summary, new_raw, {}, old, {"commit": "abc"})
    assert [r["system"] for r in raw["cpu-only"]["runs"]] == ["ray-data-autoscaling"] and not kept
    assert summary["cpu-only"]["trident_vs_ray_data_autoscaling"] is None
    assert suite.merge_earlier(new_summary, new_raw, None, None, None)[1] == new_raw  # not the same code: nothing kept
    # a run kept twice still points at the run that measured it
    chained = {"cpu-only": _workload(_raw_run("trident", 15.0, earlier=0), _raw_run("ray-data-autoscaling", 9.0)),
               "_earlier": [{"provenance": {"commit": "first"}, "run": {"subset": "confirm"}}], "_run": {"subset": "ray-data"}}
    again = {"cpu-only": _workload(_raw_run(STATIC_HINDSIGHT, 12.0))}
    _, raw, _ = suite.merge_earlier({"cpu-only": suite.summarise([_record(STATIC_HINDSIGHT, 12.0)], [], 1.5)}, again, {}, chained,
                                    {"commit": "second"})
    by_system = {r["system"]: raw["_earlier"][r["earlier"]]["provenance"]["commit"] for r in raw["cpu-only"]["runs"] if "earlier" in r}
    assert by_system == {"trident": "first", "ray-data-autoscaling": "second"}


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_same_code_needs_clean_trees_and_no_change_to_the_suites_code_between_the_commits(tmp_path):
    repo = tmp_path / "repo"
    (repo / "benchmarks").mkdir(parents=True)
    (repo / "docs").mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@t")
    _git(repo, "config", "user.name", "t")
    (repo / "benchmarks" / "closed_loop_suite.py").write_text("A = 1\n")
    (repo / "docs" / "x.md").write_text("a\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "one")
    first = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    (repo / "docs" / "x.md").write_text("b\n")
    _git(repo, "commit", "-qam", "docs")
    assert suite.same_code({"commit": first, "dirty": False}, repo)[0]
    assert not suite.same_code({"commit": first, "dirty": True}, repo)[0]
    assert not suite.same_code(None, repo)[0]
    (repo / "benchmarks" / "closed_loop_suite.py").write_text("A = 2\n")
    assert "not a clean commit" in suite.same_code({"commit": first, "dirty": False}, repo)[1]
    _git(repo, "commit", "-qam", "code")
    assert "code changed" in suite.same_code({"commit": first, "dirty": False}, repo)[1]
