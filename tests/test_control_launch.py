"""The emulated document pipeline, the policy registry and the ``run`` command glue."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_runtime_support import assert_exactly_once, child_env, docs_test_profile

from trident_flows.control.launch import run_pipeline
from trident_flows.core.decision import Decision
from trident_flows.pipelines import emulated_docs
from trident_flows.pipelines.emulated import parse_regimes, synthetic_rows
from trident_flows.scheduler.policies import StaticPolicy, make_policy


def test_synthetic_stream_follows_the_regime_schedule_and_seed():
    workloads = docs_test_profile().workloads
    rows = list(synthetic_rows(workloads, 50, "short:20,scans:10", seed=3))
    assert [r["regime"] for r in rows] == ["short"] * 20 + ["scans"] * 10 + ["short"] * 20
    assert rows == list(synthetic_rows(workloads, 50, "short:20,scans:10", seed=3))
    assert rows != list(synthetic_rows(workloads, 50, "short:20,scans:10", seed=4))
    assert sum(r["scanned_pages"] for r in rows if r["regime"] == "short") == 0
    with pytest.raises(ValueError, match="NAME:COUNT"):
        parse_regimes("short=20")


def test_emulated_docs_needs_its_profile_and_builds_a_fitting_static_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="trident-flows profile"):
        emulated_docs.build(synth=10, profile=str(tmp_path / "documents.json"))
    spec = emulated_docs.build(synth=40, profile=docs_test_profile())
    assert [o.name for o in spec.operators] == ["parse", "ocr", "langid", "quality", "dedup", "embed"]
    assert spec.operator("embed").config.device == "gpu"
    assert sum(o.config.cpus * o.replicas for o in spec.operators) == 8 and sum(o.config.gpus * o.replicas for o in spec.operators) == 1
    assert [r["regime"] for r in spec.source()].count("short") == 20


def test_emulated_docs_runs_exactly_once(ray_cluster, tmp_path):
    spec = emulated_docs.build(synth=120, profile=docs_test_profile(), seed=1)
    summary = run_pipeline(spec, tmp_path, policy=StaticPolicy(), tick_s=0.2)
    assert summary.items_written + summary.items_dead_lettered == 120 and summary.duplicate_ids == 0 and summary.items_missing == 0
    assert summary.items_dropped > 0 and set(summary.operators) == {"parse", "ocr", "langid", "quality", "dedup", "embed"}
    assert summary.operators["embed"]["configs"] == {"gpu/b32": 1}
    assert_exactly_once(spec, tmp_path)


def test_unknown_policies_are_refused_listing_the_available_ones():
    assert make_policy("static").decide(None, []) == Decision.no_change()
    assert make_policy("trident").name == "trident" and make_policy("ds2").name == "ds2" and make_policy("threshold").name == "threshold"
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        make_policy("nope")


def test_run_command_writes_the_summary_json(tmp_path):
    """The CLI glue end to end in a fresh process (its own local Ray cluster), on a test pipeline."""
    script = f"""
from pathlib import Path
from rich.console import Console
import trident_flows.pipelines as pipelines
pipelines.PIPELINES["rt-test"] = "test_runtime_support"
from trident_flows.control.launch import run_command
run_command(pipeline="rt-test", out=Path({str(tmp_path / 'out')!r}), policy="static", input=None, synth=50, regimes=None, seed=0,
            cpus=4, gpus=0, address=None, summary_json=Path({str(tmp_path / 's.json')!r}), tick_s=0.5,
            decision_log=Path({str(tmp_path / 'd.jsonl')!r}), console=Console(width=120))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240, env=child_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["items_in"] == 50 and summary["duplicate_ids"] == 0
    assert summary["items_written"] + summary["items_dead_lettered"] == 50
    for key in ("wall_s", "throughput_items_per_s", "latency_s_p50", "latency_s_p99", "ooms", "reconfigurations", "rolling_update_dip",
                "operators"):
        assert key in summary
    assert summary["operators"]["parse"]["replicas"] == 1 and "busy_fraction" in summary["operators"]["parse"]
    assert (tmp_path / "d.jsonl").exists()
    assert "items_written" in proc.stdout
    # the account: a static run makes no decision and says so; it has no models to estimate from and counts no OOMs
    assert summary["decisions"] == [] and summary["decisions_made"] == 0
    assert summary["decisions_note"] == "no decisions: the static policy never changes the configuration"
    assert summary["estimated_rate_without_trident"] is None
    assert summary["estimated_rate_without_trident_note"] == "no estimate: the static policy fits no throughput models (only trident does)"
    assert summary["ooms_avoided"] is None and summary["ooms_avoided_configs"] == []
    assert summary["timeline_png"] == str(tmp_path / "out" / "timeline.png")
    assert (tmp_path / "out" / "timeline.png").read_bytes().startswith(b"\x89PNG")
    assert "no decisions: the static policy never changes the configuration" in proc.stdout


def test_emulated_docs_loads_the_committed_documents_profile():
    spec = emulated_docs.build(synth=30, seed=2)
    assert spec.name == "emulated-docs" and spec.items == 30
    assert [o.name for o in spec.operators] == list(emulated_docs.OPERATORS)
    rows = list(spec.source())
    assert [r["regime"] for r in rows][:15] == ["short"] * 15 and {"pages", "scanned_pages", "chars"} <= set(rows[0])


class _ScaleParseOnce:
    """A test policy: after the first samples arrive, ask for a second parse replica (once)."""

    name = "scale-once"

    def __init__(self) -> None:
        self.done = False

    def decide(self, state, samples):
        from trident_flows.core.types import OperatorPlan, Plan, ReplicaGroup

        if self.done or not samples:
            return Decision.no_change()
        self.done = True
        parse = state.operator("parse")
        config = next(iter(parse.configs()))
        return Decision.roll_out(Plan((OperatorPlan("parse", (ReplicaGroup(config, 2),), reason="parse is busiest"),), reason="scale parse"),
                                 "scale parse")


def test_control_loop_applies_a_policy_plan_through_the_runner_calls(ray_cluster, tmp_path):
    from test_runtime_support import small_pipeline

    spec = small_pipeline(300, time_scale=6.0, regimes="short:300")
    log = tmp_path / "decisions.jsonl"
    summary = run_pipeline(spec, tmp_path / "out", policy=_ScaleParseOnce(), tick_s=0.3, decision_log=log)
    assert summary.decisions_made == 1 and summary.reconfigurations == 1 and summary.operators["parse"]["replicas"] == 2
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(records) == 1 and records[0]["reason"] == "scale parse" and records[0]["apply"]["ok"]
    assert [s["kind"] for s in records[0]["apply"]["steps_done"]] == ["start"]
    (decision,) = summary.account.decisions   # the account says what the plan changed, why, and that it landed
    assert (decision.change_text(), decision.kind, decision.reason, decision.status) == (
        "parse 1x cpu/b8 -> 2x cpu/b8", "rebalance", "scale parse", "landed")
    assert decision.effect is not None or decision.effect_note.startswith("not measured: only")
    assert summary.items_missing == 0 and summary.duplicate_ids == 0
