"""Capacity planning as a user relies on it: the planner's choice is the cheapest cluster an exhaustive
search finds, its predicted throughput holds in the simulator, and a bad input is one line saying
what to change (``trident-flows plan``)."""

from __future__ import annotations

import itertools
import json

import pytest
from typer.testing import CliRunner

from trident_flows.cli import app
from trident_flows.planning.catalogue import Catalogue, NodeType, load_catalogue
from trident_flows.planning.demands import operator_demands
from trident_flows.planning.planner import Goal, PlacementChecker, plan_cluster
from trident_flows.planning.simcheck import simulate_plan
from trident_flows.planning.workload import from_regimes

GiB = 2**30


def _small_catalogue() -> Catalogue:
    return Catalogue((NodeType("c4", 4, 0.25, max_count=3), NodeType("c8", 8, 0.45, max_count=3),
                      NodeType("g1", 4, 0.9, gpus=1, gpu_memory_bytes=24 * GiB, max_count=2)), "USD", "test catalogue",
                     startup_minutes=10)


@pytest.mark.parametrize("regimes, items, deadline_h", [
    ("short:500,scans:500", 20_000, 6.0),
    ("short:900,long:100", 50_000, 10.0),
])
def test_the_planners_choice_is_the_cheapest_cluster_of_an_exhaustive_search(regimes, items, deadline_h):
    catalogue = _small_catalogue()
    workload = from_regimes("documents", regimes)
    plan = plan_cluster(workload, catalogue, Goal(items, deadline_h=deadline_h), simulate_top=0, runner_ups=0)
    demands = operator_demands(workload.profile, workload.mean_features(), workload.worst_features(), 24 * GiB)
    check = PlacementChecker(demands, catalogue, items)
    best = None
    for counts in itertools.product(*(range(n.max_count + 1) for n in catalogue.nodes)):
        if not any(counts):
            continue
        option = check(dict(zip(catalogue.names, counts)))
        if option is not None and option.hours <= deadline_h and (best is None or option.cost < best.cost):
            best = option
    assert best is not None
    assert plan.recommended.hours <= deadline_h
    assert plan.recommended.cost == pytest.approx(best.cost, rel=5e-3), (plan.recommended.label(), best.label())


def test_the_predicted_throughput_of_the_chosen_cluster_holds_in_the_simulator():
    """The issue's example on the default catalogue (about 1 CPU minute: three simulated runs)."""
    workload = from_regimes("documents", "short:500,scans:500")
    plan = plan_cluster(workload, load_catalogue(), Goal(1_000_000, deadline_h=24), simulate_top=3, runner_ups=2)
    r = plan.recommended
    assert r.simulated_items_per_s is not None
    assert abs(r.simulated_items_per_s / r.items_per_s - 1) <= 0.15, (r.label(), r.items_per_s, r.simulated_items_per_s)
    low, high = r.items_per_s_range
    assert low <= r.simulated_items_per_s <= high


def test_a_single_node_plan_matches_the_simulator():
    catalogue = load_catalogue()
    workload = from_regimes("documents", "short:500,scans:500")
    demands = operator_demands(workload.profile, workload.mean_features(), workload.worst_features(), 80 * GiB)
    option = PlacementChecker(demands, catalogue, 10_000)({"c16": 1})
    sim = simulate_plan(workload, catalogue, option.counts, option.plan, 2000)
    assert abs(sim.items_per_s / option.items_per_s - 1) <= 0.15, (option.items_per_s, sim.items_per_s)


def test_plan_writes_the_recommendation_as_json_and_a_pareto_plot(tmp_path):
    out, png = tmp_path / "plan.json", tmp_path / "pareto.png"
    result = CliRunner().invoke(app, ["plan", "--regimes", "short:500,scans:500", "--items", "100000", "--deadline-h", "12",
                                      "--only", "c16", "--only", "c64", "--simulate-top", "1", "--json", str(out), "--plot", str(png)],
                                terminal_width=200)
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert set(data["recommended"]) <= {"c16", "c64"} and sum(data["recommended"].values()) >= 1
    assert data["predicted_hours"] <= 12
    assert data["cost"] == pytest.approx(data["predicted_hours"] * data["price_per_hour"])
    assert data["predicted_items_per_s"] * (data["predicted_hours"] - 10 / 60) * 3600 == pytest.approx(100000, rel=1e-6)
    assert {op["operator"] for op in data["starting_plan"]["operators"]} == {"parse", "ocr", "langid", "quality", "dedup", "embed"}
    assert png.stat().st_size > 10_000
    assert "starting plan: parse" in result.output and "PLACEHOLDER" in result.output


@pytest.mark.parametrize("args, fix", [
    (["--regimes", "short:500", "--items", "1000", "--deadline-h", "5", "--only", "z9"], "unknown node class 'z9'"),
    (["--regimes", "short:500,scans:500", "--items", "1000000000", "--deadline-h", "1"], "raise --deadline-h to at least"),
    (["--regimes", "short:500", "--items", "1000", "--deadline-h", "0.1"], "within the nodes' start-up"),
    (["--regimes", "shrt:500", "--items", "1000", "--deadline-h", "5"], "unknown regime 'shrt'"),
    (["--items", "1000", "--deadline-h", "5"], "one of --regimes"),
    (["--regimes", "short:500", "--items", "1000"], "give one goal"),
    (["--regimes", "short:500", "--items", "1000000", "--budget", "0.01"], "raise --budget to at least"),
])
def test_a_planning_user_error_is_one_line_naming_the_fix(args, fix, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["plan", *args, "--simulate-top", "0"])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fix in result.stderr, result.stderr


def test_an_empty_sample_is_refused_in_one_line(tmp_path):
    (tmp_path / "notes.txt").write_text("not a PDF")
    result = CliRunner().invoke(app, ["plan", "--sample", str(tmp_path), "--items", "1000", "--deadline-h", "5"])
    assert result.exit_code == 2
    assert result.stderr.strip().startswith("error: --sample") and "no PDF" in result.stderr


def test_a_bad_catalogue_entry_names_the_node_and_field(tmp_path):
    bad = tmp_path / "cat.toml"
    bad.write_text('[[node]]\nname = "g2"\ncpus = 8\ngpus = 2\nprice_per_hour = 2.0\n')
    result = CliRunner().invoke(app, ["plan", "--regimes", "short:1", "--items", "10", "--deadline-h", "5", "--catalogue", str(bad)])
    assert result.exit_code == 2 and "node g2: gpus=2 but no gpu_mem" in result.stderr


def test_a_sample_of_pdfs_is_measured_by_the_parse_step(tmp_path):
    from trident_flows.pipelines.synth_documents import generate
    from trident_flows.planning.workload import from_sample

    generate(tmp_path, n=6, regimes="short:3,scans:3", duplicates=0.0, broken=0.0, seed=1)
    workload = from_sample(tmp_path)
    assert workload.pipeline == "documents" and sum(workload.weights.values()) == 6
    assert workload.mean_features()["scanned_pages"] > 0 and workload.mean_features()["pages"] >= 1


def _simulated_state(regimes: str, counts: dict[str, int]):
    """The runner state at the end of a short simulated run of the planner's placement on ``counts``."""
    from trident_flows.sim import driver

    catalogue = load_catalogue()
    workload = from_regimes("documents", regimes)
    demands = operator_demands(workload.profile, workload.mean_features(), workload.worst_features(), 80 * GiB)
    option = PlacementChecker(demands, catalogue, 10_000)(counts)
    states = []
    real = driver.simulate

    def keep_state(*args, **kwargs):
        run = real(*args, **kwargs)
        states.append(run.runner.state())
        return run

    driver.simulate = keep_state
    try:
        simulate_plan(workload, catalogue, option.counts, option.plan, 1000)
    finally:
        driver.simulate = real
    return states[0]


@pytest.mark.parametrize("regimes, counts, binding", [
    ("short:500,scans:500", {"c16": 1}, "cpus"),   # OCR of scanned pages on 16 CPUs
    ("short:1", {"g1": 1}, "gpus"),                # born-digital text: the embedder on the one GPU
])
def test_live_advice_names_the_binding_resource_and_checks_the_gain_of_one_more_node(regimes, counts, binding):
    from trident_flows.planning.advice import advice_dict

    advice = advice_dict(_simulated_state(regimes, counts))
    assert advice["binding_resource"] == binding, advice
    assert advice["summary"].startswith({"cpus": "CPU-bound", "gpus": "GPU-bound"}[binding])
    gains = advice["one_more_node"]
    assert set(gains) == {"c16", "c64", "g1", "g8"}
    assert all(g["checked_gain"] >= 0 for g in gains.values())
    if binding == "gpus":  # one more GPU node helps; a CPU-only node cannot run the embedder's GPU configuration
        assert gains["g1"]["checked_gain"] > 0.5 and gains["c16"]["checked_gain"] < gains["g1"]["checked_gain"]
    else:
        assert gains["c16"]["checked_gain"] > 0.5
