"""What the fidelity benchmark takes from a live trace, against hand-computed cases: throughput and
busy fractions, how far the batches ran over their model (a starved machine), the actor start
overhead of replicas started during the run and of replicas requested together, and which references it refuses (another stream or
starting configuration, or an older version of the policy)."""

from __future__ import annotations

import datetime
from dataclasses import replace

import pytest
from builders import batch_sample, operator_state, replica_state, runner_state

from benchmarks import fidelity_traces as ft
from benchmarks.live_trace import Tick, Trace, TracedDecision
from benchmarks.replay_policy import ReplayPolicy
from benchmarks.sim_fidelity import POLICY_SINCE, _stale_policy
from trident_flows.core.decision import Decision
from trident_flows.core.state import ReplicaState, RunnerState
from trident_flows.core.types import CPU, BatchSample, OpConfig, OperatorPlan, Plan, ReplicaGroup
from trident_flows.runtime.costmodel import DeviceCost, OperatorCost, PipelineProfile

CONFIG = OpConfig.make(CPU, batch_size=2)
PROFILE = PipelineProfile("hand", (OperatorCost("a", {CPU: DeviceCost(per_item_s=0.5, cold_start_s=2.0)}, 1.0),
                                   OperatorCost("b", {CPU: DeviceCost(per_item_s=0.25)}, 1.0)), workloads={"default": {}})


def _replica(rid: str, cold_start_s: float = 0.0, draining: bool = False) -> ReplicaState:
    return replica_state(replica_id=rid, actor_name=f"x:{rid}", config=CONFIG, draining=draining, cold_start_s=cold_start_s)


def _state(replicas: dict[str, tuple[ReplicaState, ...]]) -> RunnerState:
    ops = tuple(operator_state(name=n, replicas=r) for n, r in replicas.items())
    return runner_state(pipeline="hand", operators=ops, items_in=4, input_closed=True, wall_s=0.0, cluster_cpus=4.0)


def _sample(op: str, rid: str, start: float, end: float, busy: float, n_in: int = 2, n_out: int = 2) -> BatchSample:
    return batch_sample(operator=op, replica_id=rid, config=CONFIG, start=start, end=end, busy_s=busy, items_in=n_in, items_out=n_out)


def _trace() -> Trace:
    # a: 2 replicas from t=0; b: 1 replica, a second one started at t=10 (cold start 3.5 s, of which the
    # constructor's model is 0: 3.5 s of actor start) and draining from t=20 to the end at t=40
    t0 = _state({"a": (_replica("a0"), _replica("a1")), "b": (_replica("b0"),)})
    t10 = _state({"a": (_replica("a0"), _replica("a1")), "b": (_replica("b0"), _replica("b1", 3.5))})
    t20 = _state({"a": (_replica("a0"), _replica("a1")), "b": (_replica("b0"), _replica("b1", 3.5, draining=True))})
    samples = (_sample("a", "a0", 0.0, 1.0, 1.2), _sample("a", "a1", 0.0, 1.0, 1.0),     # modelled 1.0 s each
               _sample("b", "b0", 1.0, 2.0, 0.5), _sample("b", "b0", 2.0, 3.0, 0.5),     # modelled 0.5 s each
               _sample("b", "b1", 14.0, 41.0, 27.0))
    ticks = (Tick(0.0, t0, samples[:4]), Tick(10.0, t10, ()), Tick(20.0, t20, ()), Tick(40.0, t20, samples[4:]))
    return Trace("docs-ds2", {"blocks": [["short", 0, 4]], "start_config": "a 2xcpu/b2", "time_scale": 1.0}, ticks, (),
                 {"items_in": 4, "reconfigurations": 1})


def test_live_figures_from_the_batches_and_the_polled_states() -> None:
    live = ft.live_figures(_trace(), gpus=0)
    # first output: b's first batch ends at 2.0; last: b1's batch at 41.0 -> 4 items / 39 s
    assert live["items_per_s"] == pytest.approx(4 / 39.0)
    # a: 2.2 busy s over 2 replicas x 40 s; b: 28 busy s over 1 x 10 + 2 x 30 = 70 replica-s (the draining one counts)
    assert live["busy"] == {"a": pytest.approx(2.2 / 80.0), "b": pytest.approx(28.0 / 70.0)}
    assert live["reconfigurations"] == 1 and live["accel_busy"] is None


def test_overrun_is_the_median_of_measured_over_modelled_seconds() -> None:
    # ratios 1.2, 1.0, 1.0, 1.0 and b1's 27 s against 0.5 s modelled (54): median 1.0
    assert ft.overrun(_trace(), PROFILE) == pytest.approx(1.0)
    # in total: 30.2 measured seconds over 3.5 modelled
    assert ft.total_stretch(_trace(), PROFILE) == pytest.approx(30.2 / 3.5)


def test_start_overhead_is_the_cold_start_beyond_the_constructor_of_replicas_started_during_the_run() -> None:
    assert ft.start_overheads(_trace(), PROFILE) == [pytest.approx(3.5)]


def test_start_groups_are_the_replicas_first_seen_at_one_poll_with_their_start_beyond_the_constructor() -> None:
    # the initial a0, a1 report cold starts of 7.0 and 7.5 s (a's constructor: 2 s): 5.0 and 5.5 s of actor start,
    # requested together; b1, first seen at the second poll, alone: 3.5 s
    trace = _trace()
    first = _state({"a": (_replica("a0", 7.0), _replica("a1", 7.5)), "b": (_replica("b0"),)})
    trace = Trace(trace.name, trace.header, (replace(trace.ticks[0], state=first), *trace.ticks[1:]), (), trace.summary)
    assert ft.start_groups(trace, PROFILE) == [(2, [pytest.approx(5.0), pytest.approx(5.5)]), (1, [pytest.approx(3.5)])]


def test_the_live_moves_are_replayed_at_the_same_seconds_into_streaming() -> None:
    # streaming began at 0.0 (a0's first batch); the live policy returned a plan at 12.5 s and nothing before
    plan = Plan((OperatorPlan("b", (ReplicaGroup(CONFIG, 2),), "more b"),))
    trace = _trace()
    trace = Trace(trace.name, trace.header, trace.ticks, (TracedDecision(5.0, 5.0, None, None), TracedDecision(12.5, 12.5, plan, None)), trace.summary)
    moves = ft.live_moves(trace)
    assert moves == [(12.5, plan)]
    replay = ReplayPolicy(moves)
    state = _state({"a": (_replica("a0"),)})
    # the simulated run streams from t=100 (its own clock): the plan comes at the first tick from t=112.5 on, once
    assert replay.decide(replace(state, wall_s=101.0), [_sample("a", "a0", 100.0, 101.0, 1.0)]) == Decision.no_change()
    assert replay.decide(replace(state, wall_s=112.0), []) == Decision.no_change()
    assert replay.decide(replace(state, wall_s=112.6), []) == Decision.roll_out(plan, plan.reason)
    assert replay.decide(replace(state, wall_s=130.0), []) == Decision.no_change()


def test_moves_replayed_from_the_start_count_their_seconds_from_the_run_s_start_not_its_first_batch() -> None:
    plan = Plan((OperatorPlan("b", (ReplicaGroup(CONFIG, 2),), "more b"),))
    replay = ReplayPolicy([(12.5, plan)], from_start=True)
    state = _state({"a": (_replica("a0"),)})
    assert replay.decide(replace(state, wall_s=12.0), [_sample("a", "a0", 10.0, 11.0, 1.0)]) == Decision.no_change()
    assert replay.decide(replace(state, wall_s=12.6), []) == Decision.roll_out(plan, plan.reason)


def test_a_trace_of_another_profile_stream_or_starting_configuration_is_refused() -> None:
    from benchmarks.live_trace import profile_digest

    trace = _trace()
    assert ft.stale_reason(trace, [("short", 0, 4)], "a 2xcpu/b2") == ""
    assert "another stream" in ft.stale_reason(trace, [("short", 0, 5)], "a 2xcpu/b2")
    assert "another starting configuration" in ft.stale_reason(trace, [("short", 0, 4)], "a 1xcpu/b2")
    today = replace(trace, header={**trace.header, "pipeline": "documents", "profile_sha256": profile_digest("documents")})
    assert ft.stale_reason(today, [("short", 0, 4)], "a 2xcpu/b2") == ""
    earlier = replace(today, header={**today.header, "profile_sha256": "0" * 16})
    assert "another cost profile of 'documents'" in ft.stale_reason(earlier, [("short", 0, 4)], "a 2xcpu/b2")
    assert ft.trace_workload("video-ds2")[1] == "ds2"
    with pytest.raises(ValueError, match="known"):
        ft.trace_workload("real-docs-trident")


def test_a_run_of_an_older_policy_is_not_a_reference() -> None:
    since = datetime.datetime.fromisoformat(POLICY_SINCE["trident"][0].replace("Z", "+00:00"))
    assert "older trident" in _stale_policy("trident", since - datetime.timedelta(hours=1))
    assert _stale_policy("trident", since + datetime.timedelta(hours=1)) == ""
    assert _stale_policy("static", since - datetime.timedelta(days=30)) == ""  # a static run has no policy to change
    assert "older ds2" in _stale_policy("ds2", since)  # ds2 was made DS2 as its paper defines it after trident's change


def _reference(path, quick: bool, per_system: dict) -> None:
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"quick": quick, "machine": {"time_utc": "2026-12-01T03:00:00Z"}, "raw": {"per_system": per_system}}))


def test_recorded_policy_runs_are_read_from_the_live_dir_and_a_quick_run_is_no_reference_for_the_full_benchmark(tmp_path) -> None:
    from benchmarks.sim_fidelity import LIVE_DIR, against_committed

    live = {"items_per_s_median": 25.0, "items_per_s": [24.9, 25.1], "accel_busy_median": 0.7, "reconfigurations_median": 0.0}
    spread = {**live, "items_per_s": [10.0, 25.0]}
    _reference(tmp_path / LIVE_DIR / "closed-loop.json", False, {"static-avg": live, "static-large": spread})
    left_out: list = []
    rows = against_committed("documents", ("static-avg", "static-large"), lambda *_: None, left_out, f"{LIVE_DIR}/closed-loop.json", tmp_path)
    assert [r["workload"] for r in rows] == ["documents/static-avg"] and rows[0]["live"]["items_per_s"] == 25.0
    assert rows[0]["sim"]["items_per_s"] > 0 and rows[0]["reconfiguration_diff"] == 0
    assert [u["workload"] for u in left_out] == ["documents/static-large"]  # repeats 2.5x apart
    _reference(tmp_path / LIVE_DIR / "closed-loop.json", True, {"static-avg": live})
    left_out.clear()
    assert against_committed("documents", ("static-avg",), lambda *_: None, left_out, f"{LIVE_DIR}/closed-loop.json", tmp_path) == []
    assert left_out[0]["reason"] == "recorded with --quick"
    assert against_committed("documents", ("static-avg",), lambda *_: None, None, f"{LIVE_DIR}/missing.json", tmp_path) == []


def test_traces_recorded_for_the_benchmark_are_found_next_to_the_committed_ones(tmp_path) -> None:
    import shutil

    from benchmarks.live_trace import TRACE_DIR
    from benchmarks.sim_fidelity import LIVE_DIR, against_traces

    (tmp_path / LIVE_DIR / "traces").mkdir(parents=True)
    shutil.copy(TRACE_DIR / "docs-static.jsonl.gz", tmp_path / LIVE_DIR / "traces" / "docs-static.jsonl.gz")
    logged: list[str] = []
    refused: list[dict] = []
    rows = against_traces(("docs-static", "docs-oracle"), logged.append, unreliable=refused, results=tmp_path)
    both = ["trace docs-static", f"trace {LIVE_DIR}/traces/docs-static"]
    # the same run twice, found in both places and judged alike (compared, or refused for the same reason: a trace
    # recorded under an earlier profile overruns today's cost model)
    if rows:
        assert [r["source"] for r in rows] == both
        assert rows[0]["sim"]["items_per_s"] == pytest.approx(rows[1]["sim"]["items_per_s"], rel=1e-3)
        assert rows[0]["live"] == rows[1]["live"] and rows[0]["live"]["reconfigurations"] == 0
    else:
        assert [r["source"] for r in refused] == both and refused[0]["reason"] == refused[1]["reason"]
    assert any(line.startswith("trace docs-oracle: not recorded") for line in logged)


def test_a_suite_trace_is_rebuilt_from_its_suite_workload_header_and_first_poll() -> None:
    from benchmarks.suite_workloads import suite_workloads

    suite = suite_workloads(False, ("cpu-only",))[0]
    stream = suite.streams()[0]
    ocr = OpConfig.make(CPU, batch_size=8)
    first = _state({"parse": (_replica("p0"),), "ocr": (replica_state(replica_id="o0", actor_name="x:o0", config=ocr),) * 3})
    header = {"suite_workload": "cpu-only", "policy": "trident", "cluster": {"cpus": 16, "gpus": 0}, "blocks": stream.blocks(),
              "time_scale": stream.time_scale, "start_config": "parse 1xcpu/b2, ocr 3xcpu/b8"}
    trace = Trace("cpu-only-trident", header, (Tick(0.0, first, ()),), (), {})
    ref = ft.reference(trace)
    assert ref.label == "cpu-only/trident" and ref.stale == "" and ref.workload.blocks() == stream.blocks()
    assert ref.start.assignment == (("parse", CONFIG, 1), ("ocr", ocr, 3))
    assert ref.cluster.total_cpus == 16 and ref.cluster.total_gpus == 0
    assert ref.make_policy(ref.workload.spec(ref.profile, _suite_start(), "t")).name == "trident"
    stale = Trace("cpu-only-trident", {**header, "blocks": [["short", 0, 10]]}, trace.ticks, (), {})
    assert "another stream" in ft.reference(stale).stale
    other = Trace("cpu-only-trident", {**header, "start_config": "parse 2xcpu/b2, ocr 3xcpu/b8"}, trace.ticks, (), {})
    assert "another starting configuration" in ft.reference(other).stale


def _suite_start():
    """A starting configuration of every documents operator (the policy needs the spec's operators only)."""
    from trident_flows.sim.static_search import StaticConfig

    names = ("parse", "ocr", "langid", "quality", "dedup", "embed")
    return StaticConfig(tuple((n, OpConfig.make(CPU, batch_size=4), 1) for n in names), 0.0)


def test_a_run_is_within_fidelity_only_when_throughput_busy_and_reconfigurations_all_are():
    from benchmarks.sim_fidelity import _within

    row = {"throughput_error": 0.08, "max_busy_error_points": 9.5, "reconfiguration_diff": 1}
    assert _within(row)
    assert not _within({**row, "throughput_error": 0.126})      # a free-running policy that moved differently
    assert not _within({**row, "max_busy_error_points": 12.6})
    assert not _within({**row, "reconfiguration_diff": 4})
    assert not _within({**row, "throughput_error": None})       # nothing compared is not within
