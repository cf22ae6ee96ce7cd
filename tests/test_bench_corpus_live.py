"""``trident-flows bench corpus-trident --live --quick`` end to end: per corpus workload S* searched in the simulator, then S*
and trident live on the quick stream (every block of the live stream cut to a few items) beside their simulated runs, written
as the report's live section beside the simulated section of the report it replaces.

It runs in a process of its own: the live section starts its own Ray node of 16 logical CPUs and 2 GPUs (the other tests
share ``conftest.ray_cluster``'s). About 3 minutes on this 2-core machine: marked slow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 900
LIVE_KEYS = ("static_hindsight_items_per_s", "trident_items_per_s", "trident_vs_static_hindsight", "sim_over_live",
             "sim_throughput_error", "trident_ooms_max_run", "best_static_ooms", "items_lost", "trident_live_runs",
             "trident_sim_spread", "trident_replayed_over_live")


def test_the_quick_live_section_runs_both_systems_on_both_corpora_and_keeps_the_simulated_section(tmp_path):
    # an earlier result written before the report had sections: all of it simulated, kept with its provenance
    sim_summary = {"documents-corpus": {"headroom": 1.1, "headroom_class": "middle", "items_lost": 0, "trident_unfinished_runs": 0}}
    earlier = {"name": "corpus-trident", "quick": False, "summary": sim_summary, "targets": {}, "notes": "the 8-node simulation",
               "provenance": {"commit": "0" * 40, "dirty": False}, "raw": {"documents-corpus": {"note": "8 nodes"}}}
    (tmp_path / "corpus-trident.json").write_text(json.dumps(earlier))
    # a driver reads Ray's auth mode once, at import: one another test's cluster left in the environment is not ours
    inherited = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_CLIENT_MODE", "RAY_ADDRESS")}
    env = {**inherited, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), "OMP_THREAD_LIMIT": "1"}
    proc = subprocess.run([sys.executable, "-m", "trident_flows.cli", "bench", "corpus-trident", "--quick", "--live", "--out",
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "corpus-trident live (QUICK)" in proc.stdout and "about " in proc.stdout  # the duration estimate, before the runs

    doc = json.loads((tmp_path / "corpus-trident.json").read_text())
    assert doc["quick"] and "QUICK live section" in doc["notes"] and "the 8-node simulation" in doc["notes"]
    assert doc["summary"]["sim"] == sim_summary and doc["raw"]["sim"] == earlier["raw"]
    assert doc["raw"]["section"] == "live" and doc["raw"]["sim_provenance"] == earlier["provenance"]
    assert "sim.documents-corpus.items_lost" in doc["targets"]
    for name in ("documents-corpus", "video-corpus"):
        live, raw = doc["summary"]["live"][name], doc["raw"]["live"][name]
        assert set(LIVE_KEYS) <= set(live), live
        assert live["items_lost"] == 0 and live["static_hindsight_items_per_s"] > 0 and live["trident_items_per_s"] > 0
        assert live["trident_live_runs"] == 1 and live["trident_replayed_over_live"] > 0  # quick: trident runs live once
        assert all(v is not None and v > 0 for v in live["sim_over_live"].values()), live
        assert f"live.{name}.sim_throughput_error.trident" in doc["targets"]
        assert [r["system"] for r in raw["runs"]] == ["static-hindsight", "trident"] and not any(r["error"] for r in raw["runs"])
        assert raw["stream"]["quick"] and raw["time_scale"] == raw["stream"]["time_scale"] and raw["static_hindsight"]
