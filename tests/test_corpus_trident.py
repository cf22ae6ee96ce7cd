"""The corpus-trident benchmark's pure parts: its figures, the targets the headroom picks, the stream's sizing and the
static-default it starts from."""

from __future__ import annotations

import pytest

from benchmarks import corpus_trident, corpus_workloads
from benchmarks.suite_sim import SystemRun


def _runs(static_default: float, s_star: float, trident: float, oracle: float, s_star_ooms: int = 0) -> dict[str, SystemRun]:
    rates = {"static-default": static_default, "static-hindsight": s_star, "trident": trident, "oracle": oracle}
    return {name: SystemRun(name, items_per_s=rate, ooms=s_star_ooms if name == "static-hindsight" else 0, items_lost=0)
            for name, rate in rates.items()}


def test_with_much_headroom_trident_is_held_to_the_oracle_and_its_gain_is_counted():
    s = corpus_trident.summarise(_runs(8.0, 10.0, 12.0, 13.0), [0, 1, 0])
    assert s["headroom"] == pytest.approx(1.3) and s["headroom_class"] == "high"
    assert s["t_over_oracle"] == pytest.approx(12 / 13) and s["gain_captured"] == pytest.approx(2 / 3)
    assert s["trident_vs_static_default"] == pytest.approx(1.5) and s["trident_ooms_max_run"] == 1
    goals = corpus_trident.targets({"w": s})
    assert set(goals) == {"w.t_over_oracle", "w.trident_ooms_max_run", "w.items_lost", "w.trident_unfinished_runs"}
    assert goals["w.t_over_oracle"].met(s["t_over_oracle"]) and not goals["w.trident_ooms_max_run"].met(1)  # S* had none


def test_below_the_low_headroom_no_gain_is_reported_and_trident_is_held_to_the_best_static():
    s = corpus_trident.summarise(_runs(8.0, 10.0, 9.6, 10.4, s_star_ooms=2), [0])
    assert s["headroom"] == pytest.approx(1.04) and s["headroom_class"] == "low" and s["gain_captured"] is None
    goals = corpus_trident.targets({"w": s})
    assert "w.t_over_oracle" not in goals
    assert not goals["w.trident_vs_static_hindsight"].met(s["trident_vs_static_hindsight"])  # 0.96 < 0.97
    assert goals["w.trident_ooms_max_run"].met(2) and not goals["w.trident_ooms_max_run"].met(3)  # S*'s own OOMs bound it


def test_between_the_two_headrooms_only_ooms_and_loss_are_targets():
    s = corpus_trident.summarise(_runs(8.0, 10.0, 10.5, 11.0), [0])
    assert s["headroom_class"] == "middle" and s["gain_captured"] == pytest.approx(0.5)
    assert set(corpus_trident.targets({"w": s})) == {"w.trident_ooms_max_run", "w.items_lost", "w.trident_unfinished_runs"}


def test_an_oracle_slower_than_the_best_static_is_the_best_static():
    s = corpus_trident.summarise(_runs(8.0, 10.0, 10.0, 9.0), [0])
    assert s["headroom"] == pytest.approx(1.0) and s["headroom_class"] == "low" and s["t_over_oracle"] == pytest.approx(1.0)


def test_a_stream_gets_the_fewest_shards_that_last_the_hours():
    def blocks(shards: int) -> list[tuple[str, int]]:  # alternating sources, 10 items a shard
        return [("fast" if k % 2 == 0 else "slow", 10) for k in range(shards)]

    rates = {"fast": 10.0, "slow": 1.0}  # a pair of shards takes 11 s
    assert corpus_trident.shards_for(blocks, rates, 110.0, 1) == 20
    assert corpus_trident.shards_for(blocks, rates, 111.0, 1) == 21
    assert corpus_trident.shards_for(blocks, rates, 5.0, 7) == 7  # never fewer than the corpus's own


def test_static_default_is_one_nodes_default_layout_on_every_node():
    one = corpus_trident.static_default(corpus_workloads.CORPORA["documents-corpus"], 1)
    eight = corpus_trident.static_default(corpus_workloads.CORPORA["documents-corpus"], 8)
    assert [(n, c) for n, c, _ in one.assignment] == [(n, c) for n, c, _ in eight.assignment]
    assert [8 * r for _, _, r in one.assignment] == [r for _, _, r in eight.assignment]
    assert sum(r for _, c, r in one.assignment if c.device == "cpu") <= 16


def test_references_are_reused_only_from_a_result_of_the_same_stream_on_as_many_nodes():
    from types import SimpleNamespace

    workload = SimpleNamespace(schedule=(("web", 2000), ("archive", 1000)))
    earlier = {"schedule": [["web", 2000], ["archive", 1000]], "stream": {"nodes": 8}, "static_hindsight": [], "oracle_blocks": []}
    previous = {"raw": {"documents-corpus": earlier}, "provenance": {"commit": "abc"}}
    kept = corpus_trident.reusable(previous, "documents-corpus", workload, {"nodes": 8})
    assert kept is not None and kept["_commit"] == "abc"
    assert corpus_trident.reusable(previous, "documents-corpus", workload, {"nodes": 1}) is None
    assert corpus_trident.reusable(previous, "video-corpus", workload, {"nodes": 8}) is None
    longer = SimpleNamespace(schedule=(("web", 2000), ("archive", 2000)))
    assert corpus_trident.reusable(previous, "documents-corpus", longer, {"nodes": 8}) is None
    assert corpus_trident.reusable(None, "documents-corpus", workload, {"nodes": 8}) is None


def test_a_trident_run_stopped_unfinished_leaves_the_items_lost_unknown_and_misses_its_target():
    s = corpus_trident.summarise(_runs(8.0, 10.0, 10.0, 13.0), [0, 0, 0], unfinished=1)
    assert s["trident_unfinished_runs"] == 1 and s["items_lost"] is None
    goals = corpus_trident.targets({"w": s})
    assert not goals["w.items_lost"].met(s["items_lost"]) and not goals["w.trident_unfinished_runs"].met(1)


def test_a_simulated_run_reuses_the_earlier_simulated_section_and_keeps_the_live_one(tmp_path, monkeypatch):
    import json

    seen = []

    def evaluate(name, quick, log, previous):
        seen.append(previous)
        return {"summary": {"headroom": 1.0}, "raw": {"note": name}}

    monkeypatch.setattr(corpus_trident, "evaluate", evaluate)
    live = {"documents-corpus": {"trident_items_per_s": 9.0, "items_lost": 0}}
    previous = tmp_path / "corpus-trident.json"
    previous.write_text(json.dumps({
        "name": "corpus-trident", "quick": True, "summary": {"sim": {"documents-corpus": {"headroom": 1.2}}, "live": live},
        "notes": "the live notes", "provenance": {"commit": "live-commit"},
        "raw": {"section": "live", "live": {"documents-corpus": {}}, "sim": {"documents-corpus": {"schedule": []}, "_run": {"quick": False}},
                "sim_provenance": {"commit": "sim-commit"}, "sim_note": "the sim notes"}}))
    result = corpus_trident.run(quick=False, log=lambda _: None, previous=previous, workloads=("documents-corpus",))
    assert seen == [{"raw": {"documents-corpus": {"schedule": []}, "_run": {"quick": False}}, "provenance": {"commit": "sim-commit"}}]
    assert result.summary == {"sim": {"documents-corpus": {"headroom": 1.0}}, "live": live}
    assert result.raw["section"] == "sim" and result.raw["live_provenance"] == {"commit": "live-commit"}
    assert result.notes.endswith("the live notes") and "live.documents-corpus.items_lost" in result.targets
    corpus_trident.run(quick=True, log=lambda _: None, previous=previous, workloads=("documents-corpus",))
    assert seen[-1] is None  # the earlier simulated section was not quick: its references are not this stream's


def test_every_operator_may_hold_every_cpu_of_the_eight_nodes_as_the_references_may():
    # S* runs 108 OCR replicas on the 8-node documents corpus: trident searches the same space, so no spec cap binds first
    w, _, _ = corpus_trident.prepare("documents-corpus", False)
    spec = w.spec("trident")
    assert w.cluster.total_cpus == 128
    assert all(op.max_replicas >= 128 for op in spec.operators)


def test_the_gap_runs_take_tridents_longest_held_allocation_and_put_its_batches_on_s_star():
    from trident_flows.core.types import OpConfig

    small, large, gpu = OpConfig.make(batch_size=8), OpConfig.make(batch_size=32), OpConfig.make(device="gpu", batch_size=4, gpus=1.0)
    brief = (("ocr", ((large, 4),)), ("embed", ((gpu, 2),)))
    held = (("ocr", ((small, 1), (large, 6))), ("embed", ((gpu, 2),)))
    run = SystemRun("trident", seen={"web": {brief: 3, held: 2}, "archive": {held: 2}})
    assert corpus_trident.most_run(run) == held
    s_star = (("ocr", ((OpConfig.make(batch_size=64), 100),)), ("embed", ((OpConfig.make(device="gpu", batch_size=1, gpus=1.0), 16),)),
              ("dedup", ((OpConfig.make(batch_size=64), 1),)))
    at = corpus_trident.at_batches(s_star, held)
    # each operator's replica count is S*'s; its batch is the one trident ran most replicas of on that device
    assert [(name, [(c.device, c.batch_size, n) for c, n in groups]) for name, groups in at] == [
        ("ocr", [("cpu", 32, 100)]), ("embed", [("gpu", 4, 16)]), ("dedup", [("cpu", 64, 1)])]


def test_the_gap_figures_are_each_gap_runs_rate_over_s_stars():
    choice, at = SystemRun("trident-choice", items_per_s=95.0, items_lost=0), SystemRun("x", items_per_s=None)
    figures = corpus_trident.gap_figures({"trident-choice": ((), choice), "static-hindsight-at-trident-batches": ((), at)},
                                         SystemRun("static-hindsight", items_per_s=100.0, items_lost=0))
    assert figures == {"trident_choice_vs_static_hindsight": pytest.approx(0.95), "static_hindsight_at_trident_batches_vs_static_hindsight": None}
