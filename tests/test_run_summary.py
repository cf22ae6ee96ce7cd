"""The one run summary (``loop.run_summary``): the key set of ``trident-flows run --summary-json``, the curation
flow's figures and the simulator's, each from the one builder."""

from __future__ import annotations

from trident_flows.loop.run_summary import OutputCounts, run_summary

OUTPUTS = OutputCounts(items_written=9, items_dead_lettered=1, items_dropped=3, rows_written=12, duplicate_ids=0)
SUMMARY_JSON_KEYS = {  # trident-flows run --summary-json without an account: docs/architecture.md, "Conventions"
    "pipeline", "policy", "out_dir", "items_in", "items_written", "items_dead_lettered", "items_dropped", "items_missing",
    "rows_written", "duplicate_ids", "wall_s", "throughput_items_per_s", "ooms", "reconfigurations", "rolling_update_dip",
    "decisions_made", "operators", "apply_reports", "error", "output_note", "shards_total", "shards_skipped", "advice",
    "replicas_by_node", "latency_s_p50", "latency_s_p99", "memory_loaded", "memory_regimes_known", "memory_warning",
    "reaction_s_median", "prepositioned_moves", "elastic"}


class _Account:
    def to_dict(self):
        return {"decisions": [], "decisions_note": "no decisions: none", "ooms_avoided": None}


def _report(dip, kinds):
    return {"dip": dip, "steps_done": [{"kind": k} for k in kinds]}


def test_the_summary_json_keys_are_defined_once_and_the_account_is_flattened():
    s = run_summary("p", "static", "/out", None, OUTPUTS, items_in=11, items_done=0, decisions_made=0)
    assert set(s.to_dict()) == SUMMARY_JSON_KEYS
    assert s.items_missing == 1 and s.wall_s == 0.0 and s.throughput_items_per_s == 0.0 and s.operators == {}
    data = run_summary("p", "static", "/out", None, OUTPUTS, items_in=10, items_done=0, decisions_made=0, account=_Account()).to_dict()
    assert set(data) == SUMMARY_JSON_KEYS | {"decisions", "decisions_note", "ooms_avoided"} and data["decisions"] == []


def test_the_curation_figures_and_a_simulations_figures_extend_the_one_summary():
    s = run_summary("p", "trident", "/out", None, OUTPUTS, items_in=10, items_done=0, decisions_made=2, near_duplicates=2,
                    shards_total=3, policy_figures={"memory_loaded": True, "reaction_s_median": 4.0})
    data = s.to_dict()
    assert {k: data[k] for k in ("kept", "near_duplicates", "filtered", "dead_lettered", "shards")} == {
        "kept": 6, "near_duplicates": 2, "filtered": 1, "dead_lettered": 1, "shards": 3}
    assert data["memory_loaded"] is True and data["reaction_s_median"] == 4.0 and "curation" not in data
    sim = run_summary("p", "none", "", None, OUTPUTS, items_in=12, items_done=10, decisions_made=1, items_in_flight=2,
                      simulation={"simulated": True, "decisions": 1}).to_dict()
    assert sim["items_missing"] == 0 and sim["simulated"] is True and sim["decisions"] == sim["decisions_made"] == 1
    assert "simulation" not in sim and SUMMARY_JSON_KEYS <= set(sim)


def test_the_rolling_update_dip_is_the_largest_of_an_apply_that_started_and_retired_replicas():
    reports = [_report(0.9, ["retire", "start"]), _report(0.4, ["start", "retire"]), _report(0.99, ["start"])]
    s = run_summary("p", "ds2", "/out", None, OUTPUTS, items_in=10, items_done=0, decisions_made=3, apply_reports=reports)
    assert s.rolling_update_dip == 0.9 and s.to_dict()["apply_reports"] == reports
    assert run_summary("p", "ds2", "/out", None, OUTPUTS, items_in=10, items_done=0, decisions_made=0).rolling_update_dip == 0.0
