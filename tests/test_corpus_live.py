"""The pure parts of corpus-trident's live section (``benchmarks.corpus_live``): how its streams are cut and sized, its
summary and targets, and that a live run keeps the simulated section of the report it replaces."""

from __future__ import annotations

import json
import os

import pytest

from benchmarks import closed_loop_suite, corpus_live, corpus_trident, corpus_workloads
from benchmarks.closed_loop_runs import RunRecord
from benchmarks.suite_sim import SystemRun
from trident_flows.core.types import OpConfig, OperatorPlan, Plan, ReplicaGroup


@pytest.mark.parametrize("name", corpus_workloads.CORPORA)
def test_a_live_stream_is_the_fewest_first_shards_lasting_the_live_seconds_at_a_rate_the_runtime_moves(name: str):
    workload, stream, sizing = corpus_live.live_stream(name, quick=False)
    corpus = corpus_workloads.CORPORA[name]
    assert workload.schedule == tuple(corpus.model.blocks(sizing["shards"], corpus_workloads.SEED))  # the corpus's own order
    assert stream.items == sum(n for _, n in workload.schedule) == sizing["items"]
    assert stream.time_scale == sizing["time_scale"] == corpus_live.TIME_SCALES[name]
    rates = sizing["model_static_items_per_s"]

    def seconds(shards: int) -> float:
        return sum(n / rates[source] for source, n in corpus.model.blocks(shards, corpus_workloads.SEED))

    assert seconds(sizing["shards"]) == pytest.approx(sizing["model_static_s"]) and sizing["model_static_s"] >= corpus_live.LIVE_S
    assert seconds(sizing["shards"] - 1) < corpus_live.LIVE_S
    assert sizing["model_static_s"] <= 8 * 60  # S* about 6-8 minutes live
    assert max(sizing["model_best_items_per_s"].values()) <= corpus_live.MAX_ITEMS_PER_S
    assert max(sizing["model_static_rows_per_s"].values()) <= corpus_live.MAX_ROWS_PER_S
    assert len(workload.schedule) >= 2  # trident meets at least one change of source


def test_the_quick_stream_cuts_every_block_of_the_live_stream_to_a_few_items():
    full, _, _ = corpus_live.live_stream("documents-corpus", quick=False)
    quick, stream, sizing = corpus_live.live_stream("documents-corpus", quick=True)
    cap = corpus_live.QUICK_BLOCK_ITEMS["documents-corpus"]
    assert [s for s, _ in quick.schedule] == [s for s, _ in full.schedule]
    assert quick.schedule == tuple((s, min(n, cap)) for s, n in full.schedule) and sizing["quick"]
    assert stream.regimes == ",".join(f"{s}:{n}" for s, n in quick.schedule)


def test_a_time_scale_the_runtime_cannot_move_is_refused(monkeypatch):
    monkeypatch.setitem(corpus_live.TIME_SCALES, "documents-corpus", 0.1)  # web documents at ~170 items/s
    with pytest.raises(ValueError, match="past the 100 the runtime moves"):
        corpus_live.live_stream("documents-corpus", quick=False)


def test_a_time_scale_whose_rows_the_runtime_cannot_move_is_refused(monkeypatch):
    # video: scenes splits each video into 33.4 clips, so at 0.3 the clips source's best static sends ~370 rows/s into motion
    assert corpus_live.rows_per_item(corpus_workloads.corpus_workload("video-corpus", False)[0].profile) == pytest.approx(234 / 7)
    monkeypatch.setitem(corpus_live.TIME_SCALES, "video-corpus", 0.3)
    with pytest.raises(ValueError, match="rows/s into one operator"):
        corpus_live.live_stream("video-corpus", quick=False)


def _record(system: str, rate: float | None, ooms: int | None = 0, lost: int | None = 0, error: str = "") -> RunRecord:
    return RunRecord(system, "corpus", 0, 100, items_per_s=rate, ooms=ooms, items_lost=lost, error=error)


def _sim(s_star: float | None, trident: float | None, repeats: list[float | None] | None = None) -> corpus_live.Simulated:
    runs = {"static-hindsight": SystemRun("static-hindsight", items_per_s=s_star), "trident": SystemRun("trident", items_per_s=trident)}
    return corpus_live.Simulated(None, runs, 0, 0.0, repeats if repeats is not None else [trident])  # type: ignore[arg-type]


def test_the_summary_sets_each_simulated_rate_over_its_live_one():
    s = corpus_live.summarise([_record("static-hindsight", 10.0, ooms=2), _record("trident", 9.0, ooms=1)], _sim(10.5, 8.0), [9.9])
    assert s["static_hindsight_items_per_s"] == 10.0 and s["trident_items_per_s"] == 9.0
    assert s["trident_vs_static_hindsight"] == pytest.approx(0.9)
    assert s["sim_over_live"] == pytest.approx({"static-hindsight": 1.05, "trident": 8.0 / 9.0})
    assert s["sim_throughput_error"] == pytest.approx({"static-hindsight": 0.05, "trident": 1.0 / 9.0})
    assert s["trident_replayed_over_live"] == pytest.approx(1.1) and s["trident_live_runs"] == 1
    assert s["trident_ooms_max_run"] == 1 and s["best_static_ooms"] == 2 and s["items_lost"] == 0
    goals = corpus_live.targets({"w": s})
    assert set(goals) == {"w.sim_throughput_error.static-hindsight", "w.sim_throughput_error.trident", "w.items_lost",
                          "w.trident_ooms_max_run"}
    assert goals["w.sim_throughput_error.static-hindsight"].met(0.05) and not goals["w.sim_throughput_error.trident"].met(1 / 9)
    assert goals["w.trident_ooms_max_run"].met(2) and not goals["w.trident_ooms_max_run"].met(3)  # S*'s own OOMs bound trident's


def test_trident_runs_live_three_times_where_its_simulated_runs_spread_past_the_tolerance_and_its_median_is_compared():
    assert _sim(1.0, 1.0, [0.95, 1.0, 1.04]).trident_live_runs(quick=False) == 1  # 9.5% apart: one live run is a fair draw
    spread = _sim(1.0, 0.93, [0.78, 0.93, 1.09])
    assert spread.trident_spread == pytest.approx(1.09 / 0.78) and spread.trident_live_runs(quick=False) == corpus_live.LIVE_TRIDENT_RUNS
    assert spread.trident_live_runs(quick=True) == 1
    assert _sim(1.0, 1.0, [1.0, None]).trident_live_runs(quick=False) == corpus_live.LIVE_TRIDENT_RUNS  # a repeat that did not finish
    live = [_record("static-hindsight", 1.0, ooms=5), _record("trident", 0.82, ooms=4), _record("trident", 0.97, ooms=1),
            _record("trident", 0.90, ooms=0)]
    s = corpus_live.summarise(live, spread, [0.82 * 1.05, 0.97 * 0.9, 0.90 * 1.02])
    assert s["trident_items_per_s"] == pytest.approx(0.90) and s["sim_over_live"]["trident"] == pytest.approx(0.93 / 0.90)
    assert s["trident_replayed_over_live"] == pytest.approx(1.02) and s["trident_live_runs"] == 3
    assert s["trident_ooms_max_run"] == 4  # the worst run, against S*'s one run


def test_a_failed_live_run_leaves_its_figures_unknown_and_misses_the_targets():
    s = corpus_live.summarise([_record("static-hindsight", 10.0), _record("trident", None, ooms=None, lost=None, error="RayError: x")],
                              _sim(10.0, None), [None])
    assert s["trident_items_per_s"] is None and s["trident_vs_static_hindsight"] is None
    assert s["sim_over_live"]["trident"] is None and s["sim_throughput_error"]["trident"] is None
    assert s["items_lost"] is None and s["trident_ooms_max_run"] is None and s["trident_replayed_over_live"] is None
    goals = corpus_live.targets({"w": s})
    assert not goals["w.items_lost"].met(None) and not goals["w.sim_throughput_error.trident"].met(None)


def test_the_simulated_counterpart_runs_on_the_live_node_sharing_this_machines_cores():
    w = corpus_live.prepare("documents-corpus", quick=True).sim
    assert w.actor_start.cores(w.cluster.total_cpus) == float(os.cpu_count() or 1)
    assert w.decide_s_per_cpu_s == corpus_live.LIVE_DECIDE_S_PER_CPU_S > 1.0
    cluster = corpus_trident.prepare("documents-corpus", quick=True)[0]  # nodes and a controller with cores of their own
    assert cluster.actor_start.host_cores is None and cluster.decide_s_per_cpu_s == 1.0


def test_a_live_run_s_plans_replay_in_the_simulator_from_its_start():
    c = corpus_live.prepare("documents-corpus", quick=True)
    static = corpus_live.replay(c, _record("trident", 1.0))  # no plan: static-default all along
    plan = Plan((OperatorPlan("embed", (ReplicaGroup(OpConfig("cpu", 1), 1),), "embed on one CPU"),))  # 2 s in: much slower
    moved = _record("trident", 1.0)
    moved.decisions = [{"t": 2.0, "action": "roll_out", "plan": plan.to_dict()}, {"t": 3.0, "action": "none"}]
    assert static is not None and corpus_live.replay(c, moved) < static


def test_the_report_targets_both_sections_under_their_names():
    live = corpus_live.summarise([_record("static-hindsight", 10.0), _record("trident", 10.0)], _sim(10.0, 10.0), [10.0])
    sim = corpus_trident.summarise({name: SystemRun(name, items_per_s=10.0, ooms=0, items_lost=0)
                                    for name in corpus_trident.SYSTEMS}, [0])
    goals = corpus_trident.section_targets({"sim": {"w": sim}, "live": {"w": live}})
    assert "sim.w.items_lost" in goals and "live.w.items_lost" in goals and "live.w.sim_throughput_error.trident" in goals
    assert corpus_trident.section_targets({"sim": {"w": sim}, "live": None}).keys() == {f"sim.{k}" for k in corpus_trident.targets({"w": sim})}


def test_a_result_written_before_the_sections_is_the_simulated_section_a_live_run_keeps(tmp_path):
    previous = tmp_path / "corpus-trident.json"
    previous.write_text(json.dumps({"name": "corpus-trident", "summary": {"documents-corpus": {"headroom": 1.1}}, "notes": "sim notes",
                                    "provenance": {"commit": "abc"}, "raw": {"documents-corpus": {"note": "8 nodes"}}}))
    summary, raw = closed_loop_suite.sections("live", {"documents-corpus": {"trident_items_per_s": 9.0}}, {"documents-corpus": {}}, previous,
                                              unsectioned="sim")
    assert summary == {"live": {"documents-corpus": {"trident_items_per_s": 9.0}}, "sim": {"documents-corpus": {"headroom": 1.1}}}
    assert raw["section"] == "live" and raw["sim"] == {"documents-corpus": {"note": "8 nodes"}}
    assert raw["sim_provenance"] == {"commit": "abc"} and raw["sim_note"] == "sim notes"
    again, raw = closed_loop_suite.sections("sim", {"video-corpus": {}}, {}, previous, unsectioned="sim")  # a new simulated section
    assert again == {"sim": {"video-corpus": {}}, "live": None} and raw["live_provenance"] is None
