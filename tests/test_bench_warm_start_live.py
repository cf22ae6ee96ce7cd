"""``trident-flows bench warm-start --live --quick`` end to end: the simulated part on cpu-only, then the live part's
four runs (S*, trident cold, an earlier run writing a memory, trident warm reading it) on the suite's quick stream.

It runs in a process of its own: the live part starts its own Ray node of 16 logical CPUs and no GPU (the other tests
share ``conftest.ray_cluster``'s, with GPUs). About 3.5 minutes on this 2-core machine: marked slow.
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
LIVE_KEYS = ("live_cold_vs_static_hindsight", "live_warm_vs_static_hindsight", "live_trident_ooms", "live_items_lost",
             "live_runs_failed")


def test_the_quick_live_part_runs_its_four_runs_and_loses_no_item(tmp_path):
    # a driver reads Ray's auth mode once, at import: one another test's cluster left in the environment is not ours
    inherited = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_CLIENT_MODE", "RAY_ADDRESS")}
    env = {**inherited, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), "OMP_THREAD_LIMIT": "1"}
    proc = subprocess.run([sys.executable, "-m", "trident_flows.cli", "bench", "warm-start", "--quick", "--live", "--workloads",
                           "cpu-only", "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "warm-start live (QUICK)" in proc.stdout and "about " in proc.stdout  # the duration estimate, first
    for label in ("static-hindsight", "cold", "earlier", "warm"):
        assert f"repeat 1/1: {label} starting" in proc.stdout and f"repeat 1/1: {label}: " in proc.stdout

    doc = json.loads((tmp_path / "warm-start.json").read_text())
    summary, live = doc["summary"], doc["raw"]["live"]
    assert doc["quick"] and "QUICK live part" in doc["notes"]
    assert set(LIVE_KEYS) <= set(summary) and set(LIVE_KEYS) <= set(doc["targets"])
    assert summary["live_items_lost"] == 0 and summary["live_runs_failed"] == 0 and summary["live_trident_ooms"] == 0
    assert summary["live_cold_vs_static_hindsight"] > 0 and summary["live_warm_vs_static_hindsight"] > 0
    repeat = live["repeats"][0]
    assert all(repeat[label]["items_per_s"] > 0 and not repeat[label]["error"] for label in ("static-hindsight", "cold", "earlier", "warm"))
    assert repeat["earlier_regimes"] != live["regimes"] and sorted(repeat["earlier_regimes"].split(",")) == sorted(live["regimes"].split(","))
    assert not repeat["cold"]["memory_loaded"] and repeat["earlier"]["memory_writes"] >= 1
    assert repeat["warm"]["memory_loaded"] and repeat["warm"]["memory_regimes_known"] >= 1, repeat["warm"]
    assert doc["provenance"]["time_scale"] == live["time_scale"] == 0.5
