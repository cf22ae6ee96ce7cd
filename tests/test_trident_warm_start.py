"""Trident's memory across runs, regimes recognised at the source and pre-positioning, in the simulator."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from benchmarks import suite_workloads as sw
from benchmarks.baselines import STATIC_DEFAULT
from benchmarks.closed_loop_workload import Workload
from trident_flows.control.launch import memory_uri
from trident_flows.core.types import BatchSample, ClusterSpec, OpConfig, PlanKind
from trident_flows.runtime.costmodel import PipelineProfile
from trident_flows.scheduler.policies import make_policy
from trident_flows.scheduler.throughput_measure import stream_positions
from trident_flows.scheduler.trident.source_regimes import SourceRegimes
from trident_flows.scheduler.trident_settings import SourceRegimeSettings
from trident_flows.sim.driver import simulate
from trident_flows.sim.static_search import StaticConfig

BLOCK_S = 60.0  # production seconds per block: short for a test, long enough for every operator to see each regime


def _stream(order: tuple[str, ...] = ("short", "scans", "long", "short"), block_s: float = BLOCK_S) -> tuple[Any, Workload, Any]:
    suite = sw.suite_workloads(False, ["cpu-only"])[0]
    profile = PipelineProfile.load(suite.profile)
    regimes = sw.equal_time_regimes(profile, 0, order, block_s)
    return suite, Workload("regimes", regimes, seed=sw.SEED, time_scale=1.0), profile


def _run(memory: str | None, order: tuple[str, ...] = ("short", "scans", "long", "short"), cpus: int = sw.CPUS,
         start: StaticConfig | None = None, block_s: float = BLOCK_S, **settings: Any) -> tuple[Any, Any, list]:
    """One simulated run of trident; returns the policy, the run and each tick's (time, stream positions)."""
    suite, stream, profile = _stream(order, block_s)
    cluster = ClusterSpec.single_node(cpus, 0, gpu_memory_bytes=sw.DEVICE_MEMORY)
    start = start or suite.baselines(profile, stream, stream.rows(profile)).start(STATIC_DEFAULT)
    spec = stream.spec(profile, start, "warm-start-test")
    policy = make_policy("trident", spec=spec, cluster=cluster, memory=memory, **settings)
    ticks: list = []

    class Watched:
        name = policy.name

        def decide(self, state: Any, samples: Any) -> Any:
            ticks.append((state.wall_s, stream_positions(state)))
            return policy.decide(state, samples)

        def __getattr__(self, name: str) -> Any:
            return getattr(policy, name)

    run = simulate(spec, cluster, Watched(), tick_s=1.0, tick_charge_s=0.05)
    return policy, run, ticks


@pytest.fixture(scope="module")
def learned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A memory written by a cold run over the regimes in another order."""
    path = tmp_path_factory.mktemp("memory") / "documents.json"
    policy, run, _ = _run(str(path), order=("scans", "long", "short", "scans"))
    assert run.summary["items_missing"] == 0
    assert policy.memory.writes >= 1 and path.exists()
    return path


def test_a_memory_written_by_one_run_gives_the_next_run_its_first_plan(learned: Path, tmp_path: Path) -> None:
    copy = tmp_path / "memory.json"
    copy.write_bytes(learned.read_bytes())
    policy, run, _ = _run(str(copy), start_from_memory=False)
    assert run.summary["items_missing"] == 0 and run.summary["ooms"] == 0
    figures = policy.run_figures()
    assert figures["memory_loaded"] and figures["memory_regimes_known"] >= 2
    first = next(r for r in policy.records if r.decision.plan is not None)
    assert first.decision.rationale is not None and first.decision.rationale.kind == PlanKind.REGIME_PLAN
    assert "memory allocation" in first.decision.plan.reason
    assert figures["prepositioned_moves"] >= 2
    data = json.loads(copy.read_text())
    assert data["runs"] == 2  # this run merged what it learned into the memory it read


def test_a_memory_of_regimes_too_short_to_trust_does_not_start_the_run_but_positions_it(tmp_path: Path) -> None:
    path = tmp_path / "memory.json"
    # an earlier run whose blocks last 20 s each at their optimum: under START_MIN_S at any plan's rate
    _, earlier, _ = _run(str(path), order=("scans", "long", "short", "scans"), block_s=20.0)
    assert earlier.summary["items_missing"] == 0 and path.exists()
    policy, run, _ = _run(str(path))  # start_from_memory is on by default
    assert run.summary["items_missing"] == 0 and run.summary["ooms"] == 0
    assert policy.started_from is None
    first = next(r for r in policy.records if r.decision.plan is not None)
    assert first.decision.rationale is not None and first.decision.rationale.kind == PlanKind.REGIME_PLAN


def test_pre_positioning_starts_replicas_before_the_new_regime_reaches_them(learned: Path, tmp_path: Path) -> None:
    copy = tmp_path / "memory.json"
    copy.write_bytes(learned.read_bytes())
    policy, run, ticks = _run(str(copy))
    ahead = []
    for record in policy.records:
        if record.decision.rationale is None or record.decision.rationale.kind != PlanKind.REGIME_PLAN:
            continue
        for op in record.decision.plan.operators:
            if "whose items reach it" in op.reason:
                first_item = float(re.search(r"from input item (\d+)", op.reason).group(1))
                ahead.append((record.tick, op.operator, first_item))
    assert ahead, "no operator was moved ahead of a regime's items"
    for tick, operator, first_item in ahead:
        decided_at = ticks[tick - 1][0]
        reached_at = next(t for t, positions in ticks if positions[operator] >= first_item)
        assert decided_at < reached_at, f"{operator} was moved at {decided_at} s, after the items of input {first_item:.0f} reached it"


def test_a_run_too_short_for_the_gate_leaves_a_plan_the_next_run_applies_at_once(tmp_path: Path) -> None:
    path = tmp_path / "memory.json"
    # as in a run of a few dozen documents: no model is fitted while the run lasts, and the evidence gate never opens
    never = {"min_samples": 1_000_000, "refit_min_samples": 1_000_000}
    first, run, _ = _run(str(path), order=("scans", "short"), **never)
    assert run.summary["items_missing"] == 0
    assert not any(r.decision.rationale is not None and r.decision.rationale.kind == PlanKind.REGIME_PLAN for r in first.records)
    assert len(json.loads(path.read_text())["regimes"]) == 2  # both solved at the run's end, from the models fitted then
    second, run, _ = _run(str(path), order=("scans", "short"), **never)
    assert run.summary["items_missing"] == 0 and run.summary["ooms"] == 0
    tick = next(r.tick for r in second.records if r.decision.rationale is not None and r.decision.rationale.kind == PlanKind.REGIME_PLAN
                and "memory allocation" in r.decision.plan.reason)
    assert tick <= 15, f"the memory's allocation was applied at tick {tick}, not once the source recognised the regime"


@pytest.mark.parametrize("case", ["corrupt", "other-pipeline", "bigger-cluster"])
def test_an_unusable_memory_is_one_line_and_the_run_completes(learned: Path, tmp_path: Path, case: str) -> None:
    path = tmp_path / "memory.json"
    cpus, start = sw.CPUS, None
    if case == "corrupt":
        path.write_text('{"schema": "trident-memory", "version": 1, "pipeline": ')
    elif case == "other-pipeline":
        data = json.loads(learned.read_text())
        data["pipeline"]["fingerprint"] = "0" * 16
        data["pipeline"]["name"] = "video"
        path.write_text(json.dumps(data))
    else:  # learned on 16 CPUs, read on 2: a start that fits 2 CPUs
        path.write_bytes(learned.read_bytes())
        cpus = 2
        names = ("parse", "ocr", "langid", "quality", "dedup", "embed")
        start = StaticConfig(tuple((n, OpConfig("cpu", 8, cpus=0.25), 1) for n in names), 0.0)
    policy, run, _ = _run(str(path), cpus=cpus, start=start)
    warning = policy.memory.warning
    assert warning is not None and "\n" not in warning
    if case == "bigger-cluster":
        assert "16 CPUs" in warning and "2 / 0" in warning and policy.memory.loaded is not None
    else:
        assert "starting cold" in warning and policy.memory.loaded is None
    assert run.summary["items_missing"] == 0 and run.summary["items_in"] == run.summary["items_written"] + run.summary["items_dead_lettered"]
    assert not run.summary["error"]


def _sample(pages: float, items: int, end: float) -> BatchSample:
    return BatchSample("parse", "r0", OpConfig("cpu", items), end - 0.1, end, 0.1, items, items, {"pages": pages * items})


def _state(read: int) -> Any:
    return SimpleNamespace(operators=[SimpleNamespace(name="parse", items_in=read, items_forwarded=read)])


def test_source_regimes_are_confirmed_recognised_again_and_ignore_a_blip() -> None:
    sources = SourceRegimes(SourceRegimeSettings(items=16))
    read, t = 0, 0.0
    pages = [2.0] * 10 + [30.0] + [2.0] * 10 + [30.0] * 10 + [2.0] * 10  # batches of 8 items; one 8-item blip of long documents
    events = []
    for p in pages:
        read, t = read + 8, t + 1.0
        events += sources.observe(_state(read), [_sample(p, 8, t)])
    assert [s.regime.id for s in sources.segments] == [0, 1, 0]
    assert "seen before" in events[-1].text
    starts = [s.start for s in sources.segments]
    assert starts[0] == 0 and 20 * 8 <= starts[1] <= 21 * 8 and 30 * 8 <= starts[2] <= 31 * 8  # within one window of the change


def test_memory_location_defaults_beside_the_output_and_can_be_off(tmp_path: Path) -> None:
    assert memory_uri(None, tmp_path / "run-output", "documents") == str(tmp_path / "trident-memory" / "documents.json")
    assert memory_uri("s3://bucket/trident.json", tmp_path, "documents") == "s3://bucket/trident.json"
    assert memory_uri("off", tmp_path, "documents") is None


def test_gpu_growth_is_pre_positioned_only_where_it_packs_device_by_device() -> None:
    from trident_flows.scheduler.replicas import gpus_pack

    cpu, gpu, half = OpConfig("cpu", 8), OpConfig("gpu", 32, gpus=1.0), OpConfig("gpu", 16, gpus=0.5)

    def state(**running: dict) -> Any:
        return SimpleNamespace(operators=[SimpleNamespace(name=n, configs=lambda g=g: dict(g),
                                                          replicas=tuple(SimpleNamespace(config=c) for c, k in g.items() for _ in range(k)))
                                          for n, g in running.items()])

    node = ClusterSpec.single_node(16, 2)
    whole = state(ocr={cpu: 10}, embed={gpu: 1})
    assert gpus_pack(whole, node, {"embed": {gpu: 2}})  # the second device is free and whole
    assert not gpus_pack(whole, node, {"embed": {gpu: 3}})
    assert gpus_pack(whole, node, {"embed": {gpu: 1, half: 2}})
    split = state(a={half: 1}, b={half: 1}, embed={cpu: 1})  # where the halves sit is not known: a whole GPU may not fit
    assert not gpus_pack(split, node, {"embed": {gpu: 1}})
    two_nodes = ClusterSpec((replace(node.node_classes[0], count=2),))  # which node has room is not known: left to the placement
    assert not gpus_pack(whole, two_nodes, {"embed": {gpu: 2}})
