"""Decisions in words a user understands: one plain sentence first, figures in fields, the
solver's details only in the raw reason; outcomes read from the runner's apply report; the
live view's operator table and chart."""

from __future__ import annotations

from types import SimpleNamespace

from trident_flows.runtime.state import ApplyReport, OperatorState, ReplicaState, RunnerState
from trident_flows.scheduler.types import OpConfig, OperatorPlan, Plan, ReplicaGroup
from trident_flows.tasks.decision import explain_hold, read_decision, read_outcome
from trident_flows.tasks.live_view import LiveHistory, chart_png, operator_rows, render_markdown

CPU8 = OpConfig.make("cpu", batch_size=8)

# A reason as the Trident controller writes it when it rolls a plan out.
TRIDENT_REASON = ("predicted 1.5 -> 2.175 input items/s (+45.0%); roll out: T 1.5 -> 2.175 input items/s over a 300 s regime: "
                  "gain 202 items, cost 81 items (2 replicas starting, 40 replica-s of cold start and drain, rollout 20 s); "
                  "T=2.175 input items/s, bottleneck ocr; optimal (highs, 8 ms, gap 3e-06)")


def _op(name, replicas, busy=0.5, queue=0, items_in=0):
    reps = tuple(ReplicaState(f"{name}-{k}", f"{name}-{k}", CPU8, True, False, False, 1, busy, 10, 0) for k in range(replicas))
    return OperatorState(name, reps, queue, 0, items_in, items_in, 0, busy, 0, 0)


def _state(ops, wall_s=60.0, pipeline="emulated-docs", throughput=1.5):
    return RunnerState(pipeline, tuple(ops), 400, 90, 0, 5, 90, False, False, wall_s, throughput, 8, 1, 0, 0)


def test_a_trident_rollout_reads_as_one_sentence_with_its_figures():
    state = _state([_op("parse", 2), _op("ocr", 1, busy=1.0, queue=40)])
    plan = Plan((OperatorPlan("ocr", (ReplicaGroup(CPU8, 3),), "bottleneck: +2 replicas cpu/b8 on node"),), 2.175, TRIDENT_REASON)
    scanned = [SimpleNamespace(operator="ocr", features={"pages": 10, "scanned_pages": 9})]
    decision = read_decision(object(), state, plan, scanned, now=0.0)
    assert decision.sentence == ("Ocr is the bottleneck for scanned PDFs: ocr 1 -> 3 replicas, expected +45% docs/s, "
                                 "pays back its 20 s start-up in 2 minutes")
    assert (decision.throughput_before, decision.throughput_after, decision.startup_s) == (1.5, 2.175, 20.0)
    assert round(decision.payback_s) == 120  # 81 items lost to the switch / 0.675 items/s gained
    assert "highs" not in decision.sentence and "highs" in decision.raw_reason  # solver details only in the raw data


def test_a_plan_without_figures_leaves_the_clauses_out_rather_than_guessing():
    state = _state([_op("parse", 1, busy=0.9), _op("embed", 1, busy=0.2)], pipeline="rt-test")
    plan = Plan((OperatorPlan("parse", (ReplicaGroup(CPU8, 2),), "busiest"),), reason="grow parse")
    decision = read_decision(object(), state, plan)
    assert decision.sentence == "Parse is the bottleneck: parse 1 -> 2 replicas"
    assert decision.gain is None and decision.payback_s is None


def test_holds_and_outcomes_are_plain_sentences():
    assert explain_hold("waiting for samples: no throughput model yet for ocr") == "Waiting for enough measurements to model every operator"
    assert explain_hold("wait (the gain does not pay for the switch): T 1 -> 1.1 input items/s over a 9 s regime").startswith(
        "A faster configuration exists, but it would not pay back its start-up")
    assert explain_hold("predicted gain +2.0% (1 -> 1.02 items/s) is under min_gain 5%: keeping the current placement") == \
        "The best change would gain +2.0%, under the 5% a change must bring"
    applied = read_outcome(ApplyReport(({"kind": "start"},), 12.4, 2.0, 1.8, 0.1))
    assert (applied.status, applied.text()) == ("applied", "applied in 12 s, throughput dip 10%")
    partial = read_outcome(ApplyReport(({"kind": "start"},), 3.0, 2.0, 1.0, 0.5, ok=False, error="step retire failed"))
    assert partial.status == "partial" and "step retire failed" in partial.reason
    assert read_outcome(error="RuntimeConfigError: gpus=64 exceeds the cluster's 2 GPUs").status == "refused"
    assert read_outcome(ApplyReport((), 0.0, 0.0, 0.0, 0.0, reason="the plan equals the current placement")).status == "refused"


def test_live_view_has_per_operator_rates_and_a_chart():
    history = LiveHistory()
    for t in range(4):
        history = history.observe(_state([_op("parse", 2, items_in=10 * t), _op("ocr", 1, queue=5, items_in=4 * t)], wall_s=float(t)))
    history = history.decided({"decision": "x", "outcome": "applied in 1 s", "pipeline time (s)": 2.0})
    state = _state([_op("parse", 2, items_in=30), _op("ocr", 1, queue=5, items_in=12)], wall_s=3.0)
    rows = {r["operator"]: r for r in operator_rows(history, state)}
    assert rows["parse"]["items/s"] == 10.0 and rows["ocr"]["items/s"] == 4.0
    assert rows["ocr"]["queue"] == 5 and rows["parse"]["replicas"] == "2" and rows["parse"]["device"] == "cpu"
    assert chart_png(history, "docs/s")[:8] == b"\x89PNG\r\n\x1a\n"
    markdown = render_markdown(history, state, "Ocr is the bottleneck", "docs/s", "live")
    assert "**Ocr is the bottleneck**" in markdown and "data:image/png;base64," in markdown
