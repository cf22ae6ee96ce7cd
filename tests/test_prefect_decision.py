"""Decisions in words a user understands: one plain sentence first, figures in fields, the
solver's details only in the raw reason; outcomes read from the runner's apply report; the
live view's operator table and chart."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from builders import operator_state, replica_state, runner_state
from test_controller import CLUSTER8, SimRunner, two_ops

from trident_flows.core.decision import Action, Decision, Hold, HoldKind
from trident_flows.core.state import ApplyReport, RunnerState
from trident_flows.core.types import CanaryEnd, CanaryVerdict, OpConfig, OperatorPlan, Plan, PlanKind, Rationale, ReplicaGroup
from trident_flows.scheduler.trident_policy import TridentPolicy
from trident_flows.scheduler.trident_settings import TridentSettings
from trident_flows.tasks.decision import explain_hold, read_decision, read_outcome
from trident_flows.tasks.live_view import LiveHistory, chart_png, operator_rows, render_markdown

CPU8 = OpConfig.make("cpu", batch_size=8)

# A reason as the Trident controller writes it when it rolls a plan out, and the typed figures it gives with it.
TRIDENT_REASON = ("predicted 1.5 -> 2.175 input items/s (+45.0%); roll out: T 1.5 -> 2.175 input items/s over a 300 s regime: "
                  "gain 202 items, cost 81 items (2 replicas starting, 40 replica-s of cold start and drain, rollout 20 s); "
                  "T=2.175 input items/s, bottleneck ocr; optimal (highs, 8 ms, gap 3e-06)")
TRIDENT_RATIONALE = Rationale(PlanKind.THROUGHPUT, throughput_before=1.5, throughput_after=2.175, rollout_s=20.0,
                              switch_cost_items=81.0, bottlenecks=("ocr",))
OCR_SENTENCE = "Ocr is the bottleneck for scanned PDFs: ocr 1 -> 3 replicas, expected +45% docs/s, pays back its 20 s start-up in 2 minutes"


def _op(name, replicas, busy=0.5, queue=0, items_in=0):
    reps = tuple(replica_state(replica_id=f"{name}-{k}", config=CPU8, inflight=1, busy_fraction=busy, batches=10) for k in range(replicas))
    return operator_state(name=name, replicas=reps, queue_items=queue, items_in=items_in, items_out=items_in, busy_fraction=busy)


def _state(ops, wall_s=60.0, pipeline="emulated-docs", throughput=1.5):
    return runner_state(pipeline=pipeline, operators=tuple(ops), items_in=400, items_written=90, items_dropped=5, rows_written=90, wall_s=wall_s,
                        throughput=throughput, cluster_gpus=1)


def _ocr_rollout(reason: str) -> tuple[RunnerState, Decision, list]:
    state = _state([_op("parse", 2), _op("ocr", 1, busy=1.0, queue=40)])
    plan = Plan((OperatorPlan("ocr", (ReplicaGroup(CPU8, 3),), "bottleneck: +2 replicas cpu/b8 on node"),), 2.175, reason, TRIDENT_RATIONALE)
    scanned = [SimpleNamespace(operator="ocr", features={"pages": 10, "scanned_pages": 9})]
    return state, Decision.roll_out(plan, reason, 2.175), scanned


def test_a_trident_rollout_reads_as_one_sentence_with_its_figures():
    state, rollout, scanned = _ocr_rollout(TRIDENT_REASON)
    decision = read_decision(state, rollout, scanned, now=0.0)
    assert decision.sentence == OCR_SENTENCE
    assert (decision.throughput_before, decision.throughput_after, decision.startup_s) == (1.5, 2.175, 20.0)
    assert round(decision.payback_s) == 120  # 81 items lost to the switch / 0.675 items/s gained
    assert "highs" not in decision.sentence and "highs" in decision.raw_reason  # solver details only in the raw data


def test_the_sentence_and_figures_come_from_the_plans_typed_rationale_never_from_its_text():
    state, rollout, scanned = _ocr_rollout("")
    decision = read_decision(state, rollout, scanned, now=0.0)
    assert decision.sentence == OCR_SENTENCE and decision.raw_reason == ""
    assert (decision.throughput_before, decision.throughput_after, decision.startup_s, round(decision.payback_s)) == (1.5, 2.175, 20.0, 120)
    # A reason text that says otherwise changes nothing: it is kept for the raw data, never read.
    misleading = ("predicted 9 -> 10 input items/s (+11.1%); roll out: T 9 -> 10 input items/s over a 9 s regime: gain 9 items, "
                  "cost 900 items (rollout 500 s); T=10 input items/s, bottleneck parse; memory safety: parse runs cpu/b64: oom")
    state, rollout, scanned = _ocr_rollout(misleading)
    decision = read_decision(state, rollout, scanned, now=0.0)
    assert decision.sentence == OCR_SENTENCE and decision.raw_reason == misleading


def test_rollbacks_canaries_and_safety_moves_read_from_their_rationale():
    state = _state([_op("parse", 2), _op("ocr", 3, busy=0.4)])
    back = Plan((OperatorPlan("ocr", (ReplicaGroup(CPU8, 1),)),), rationale=Rationale(PlanKind.ROLLBACK, measured_before=2.0, measured_after=1.2))
    assert read_decision(state, Decision.rollback(back)).sentence == ("Rolled back the last change: the pipeline measured 1.2 docs/s after it, "
                                                   "against 2 before (ocr 3 -> 1 replica)")
    big = OpConfig.make("cpu", batch_size=32)
    ended = Plan((OperatorPlan("ocr", (ReplicaGroup(CPU8, 3),)),),
                 rationale=Rationale(PlanKind.CANARY, canaries_ended=(CanaryEnd("ocr", big, CanaryVerdict.ACCEPTED),)))
    assert read_decision(state, Decision.canary(ended, "ended a canary")).sentence == "The canary cpu/b32 of ocr was accepted"
    started = Plan((OperatorPlan("ocr", (ReplicaGroup(CPU8, 3),), canary=big),), rationale=Rationale(PlanKind.CANARY))
    assert read_decision(state, Decision.canary(started, "started a canary")).sentence == "Trying cpu/b32 on one extra ocr replica (a canary) before switching the others"
    safety = Plan((OperatorPlan("ocr", (ReplicaGroup(OpConfig.make("cpu", batch_size=4), 3),)),),
                  rationale=Rationale(PlanKind.MEMORY_SAFETY, unsafe=(("ocr", CPU8),)))
    decision = read_decision(state, Decision.roll_out(safety, "memory safety"))
    assert decision.kind == "memory-safety" and decision.sentence == "Ocr risks running out of memory with cpu/b8: ocr cpu/b8 -> cpu/b4"


def test_the_trident_controllers_own_rollouts_and_rollbacks_read_with_their_figures():
    # Two simulated operators; more than two replicas of b contend, so a rollout is followed by a rollback.
    contention = lambda n: 1.0 if n <= 2 else (2.0 / n) ** 2  # noqa: E731
    runner = SimRunner(two_ops(b={"contention": contention}), [(1e9, {"x": 1.0, "y": 4.0})])
    policy = TridentPolicy(None, CLUSTER8, TridentSettings.from_options(canaries=False, verify_ticks=2))
    states, records = [], []
    for _ in range(14):
        new = runner.advance(2.0)
        states.append(runner.state())
        records.append(policy.tick(states[-1], new))
        if records[-1].decision.plan is not None:
            runner.apply(records[-1].decision.plan)
    decisions = [r.decision for r in records]
    assert decisions[0].hold == Hold(HoldKind.WAITING_FOR_SAMPLES)  # why nothing changed is typed too
    assert all((d.hold is None) == (d.plan is not None) for d in decisions), decisions
    k = next(k for k, d in enumerate(decisions) if d.action == Action.ROLL_OUT)
    rationale = decisions[k].rationale
    assert rationale.kind == PlanKind.THROUGHPUT and rationale.throughput_after == decisions[k].predicted_throughput
    assert 0 < rationale.throughput_before < rationale.throughput_after and rationale.rollout_s > 0 and rationale.bottlenecks
    decision = read_decision(states[k], decisions[k])
    assert decision.sentence.startswith("B is the bottleneck: b 2 -> ") and ", expected +" in decision.sentence
    assert decision.throughput_after == decisions[k].predicted_throughput and decision.raw_reason == decisions[k].plan.reason
    k = next(k for k, d in enumerate(decisions) if d.action == Action.ROLLBACK)
    rollback = read_decision(states[k], decisions[k])
    assert rollback.kind == "rollback" and rollback.sentence.startswith("Rolled back the last change: the pipeline measured ")
    assert decisions[k].rationale.measured_after < decisions[k].rationale.measured_before


def test_a_plan_without_figures_leaves_the_clauses_out_rather_than_guessing():
    state = _state([_op("parse", 1, busy=0.9), _op("embed", 1, busy=0.2)], pipeline="rt-test")
    plan = Plan((OperatorPlan("parse", (ReplicaGroup(CPU8, 2),), "busiest"),))
    decision = read_decision(state, Decision.roll_out(plan, "utilisation thresholds: parse: scale up 1 -> 2"))
    assert decision.sentence == "Parse is the bottleneck: parse 1 -> 2 replicas"
    assert decision.gain is None and decision.payback_s is None
    assert decision.raw_reason == "utilisation thresholds: parse: scale up 1 -> 2"  # the plan gives none: the decision's
    with pytest.raises(ValueError, match="hands no plan"):
        read_decision(state, Decision.no_change())


def test_holds_and_outcomes_are_plain_sentences():
    assert explain_hold(Hold(HoldKind.WAITING_FOR_SAMPLES)) == "Waiting for enough measurements to model every operator"
    assert explain_hold(Hold(HoldKind.DOES_NOT_PAY), "").startswith("A faster configuration exists, but it would not pay back its start-up")
    assert explain_hold(Hold(HoldKind.UNDER_MIN_GAIN, gain=0.02, min_gain=0.05), "") == \
        "The best change would gain +2.0%, under the 5% a change must bring"
    assert explain_hold(None, "DS2 targets equal the current parallelism") == "DS2 targets equal the current parallelism"  # a baseline's words
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
