"""Setting up simulated runs: schedules in minutes, the starting placement on many nodes, the
``simulate`` command, and the scripted rolling update the fidelity benchmark uses."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from benchmarks.sim_fidelity import RollingUpdate
from trident_flows.cli import app
from trident_flows.core.types import ClusterSpec
from trident_flows.pipelines import build_pipeline
from trident_flows.runtime.costmodel import PipelineProfile
from trident_flows.sim import setup
from trident_flows.sim.cluster import parse_cluster
from trident_flows.sim.driver import simulate
from trident_flows.sim.static_search import predict_throughput


def test_durations_become_counts_at_the_predicted_rate() -> None:
    profile = PipelineProfile.load("documents")
    cluster = parse_cluster("2x(cpus=16,gpus=2,gpu_mem=8GiB)")
    config = setup.initial_config(profile, cluster, setup.mean_features(profile, {"short": 1, "scans": 1}))
    rate = predict_throughput(profile, config.as_dict(), setup.mean_features(profile, {"scans": 1.0}))
    schedule = setup.schedule_counts("scans:10m,short:100", profile, config)
    name, count = schedule.split(",")[0].split(":")
    assert name == "scans" and int(count) == int(600 * rate)
    assert schedule.split(",")[1] == "short:100"
    assert setup.parse_duration("4h") == 14400 and setup.parse_duration("90s") == 90
    with pytest.raises(ValueError, match="duration"):
        setup.parse_duration("soon")


def test_eight_paper_nodes_start_with_every_gpu_replica_placed() -> None:
    cluster = parse_cluster("8x(cpus=96,gpus=8,gpu_mem=80GiB)")
    spec, stream, config = setup.build("emulated-docs", cluster, regimes="short:20m,scans:10m")
    run = simulate(spec, cluster, None, duration_s=30.0, stream=stream)
    state = run.runner.state()
    wanted = {n: r for n, _, r in config.assignment}
    assert {o.name: len(o.active) for o in state.operators} == wanted
    assert run.summary["throughput_items_per_s"] > 0 and run.summary["items_missing"] == 0


def test_simulate_command_writes_summary_and_plot(tmp_path) -> None:
    out, png = tmp_path / "s.json", tmp_path / "s.png"
    result = CliRunner().invoke(app, ["simulate", "emulated-video", "--cluster", "2x(cpus=16,gpus=2,gpu_mem=8GiB)", "--regimes",
                                      "small:1m,hd:1m", "--duration", "90s", "--summary-json", str(out), "--plot", str(png)])
    assert result.exit_code == 0, result.output
    summary = json.loads(out.read_text())
    for key in ("items_in", "items_written", "items_missing", "duplicate_ids", "throughput_items_per_s", "ooms", "reconfigurations",
                "rolling_update_dip", "operators", "apply_reports"):
        assert key in summary
    assert summary["simulated"] is True and summary["wall_s"] == pytest.approx(90.0, abs=1.0)
    assert png.stat().st_size > 10_000
    bad = CliRunner().invoke(app, ["simulate", "emulated-docs", "--cluster", "eight nodes"])
    assert bad.exit_code != 0 and "COUNTx" in bad.output


def test_scripted_rolling_update_lands_once_in_the_simulator() -> None:
    spec = build_pipeline("emulated-docs", synth=600, seed=3)
    cluster = ClusterSpec.single_node(16, 2, gpu_memory_bytes=8 * 2**30)
    run = simulate(spec, cluster, RollingUpdate("embed", 16, at_s=12.0), tick_s=1.0)
    assert run.summary["reconfigurations"] == 1 and run.summary["items_missing"] == 0
    report = run.summary["apply_reports"][0]
    assert report["ok"] and {s["kind"] for s in report["steps_done"]} == {"start", "retire"}
    assert {c for c in run.summary["operators"]["embed"]["configs"]} == {"gpu/b16"}
