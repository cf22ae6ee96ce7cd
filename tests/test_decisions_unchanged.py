"""Trident's decisions on three simulated workloads, against the ones recorded in ``golden/trident_decisions.json``.

A change meant to keep behaviour (a refactor) must leave every decision, its simulated time and reason,
and the run's figures exactly as recorded: the simulator charges each tick a fixed time, so the run
depends on the policy's code alone. A change meant to alter behaviour re-records the file with
``TRIDENT_GOLDEN_UPDATE=1 pytest tests/test_decisions_unchanged.py`` and says why in its commit.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from benchmarks import suite_workloads as sw
from benchmarks.baselines import STATIC_DEFAULT
from benchmarks.closed_loop_workload import Workload
from trident_flows.core.types import ClusterSpec
from trident_flows.runtime.costmodel import PipelineProfile
from trident_flows.scheduler.policies import make_policy
from trident_flows.sim.driver import simulate

GOLDEN = Path(__file__).parent / "golden" / "trident_decisions.json"
CASES = {"cpu-only": 60.0, "video": 30.0, "docs-baseline": 30.0}  # suite workload -> production seconds per block
TICK_CHARGE_S = 0.05
_SOLVER_TIME = re.compile(r"\d+ ms")  # the MILP's own wall time, printed in reasons


def run_case(name: str, seconds: float) -> dict[str, Any]:
    suite = sw.suite_workloads(False, [name])[0]
    profile = PipelineProfile.load(suite.profile)
    regimes = sw.equal_time_regimes(profile, suite.gpus, [r for r, _, _ in suite.streams()[0].blocks()], seconds)
    stream = Workload("regimes", regimes, seed=sw.SEED, time_scale=1.0)
    cluster = ClusterSpec.single_node(sw.CPUS, suite.gpus, gpu_memory_bytes=sw.DEVICE_MEMORY)
    spec = stream.spec(profile, suite.baselines(profile, stream, stream.rows(profile)).start(STATIC_DEFAULT), f"golden-{name}")
    run = simulate(spec, cluster, make_policy("trident", spec=spec, cluster=cluster), tick_s=1.0, tick_charge_s=TICK_CHARGE_S)
    s = run.summary
    return {"regimes": regimes, "items_per_s": round(s["steady_items_per_s"], 6), "reconfigurations": s["reconfigurations"],
            "ooms": s["ooms"], "decisions": [{"sim_t": d["sim_t"], "reason": _SOLVER_TIME.sub("N ms", d["reason"]), "error": d["error"]}
                                             for d in run.decisions]}


@pytest.mark.parametrize("name", list(CASES))
def test_trident_decides_as_recorded(name: str) -> None:
    got = run_case(name, CASES[name])
    if os.environ.get("TRIDENT_GOLDEN_UPDATE") == "1":
        recorded = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
        GOLDEN.write_text(json.dumps({**recorded, name: got}, indent=1, sort_keys=True) + "\n")
        pytest.skip(f"re-recorded {name} in {GOLDEN.name}")
    want = json.loads(GOLDEN.read_text())[name]
    for k, (a, b) in enumerate(zip(got["decisions"], want["decisions"])):
        assert a == b, f"{name}: decision {k} differs"
    assert got == want
