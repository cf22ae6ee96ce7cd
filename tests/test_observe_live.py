"""Live traces (format, recording wrapper), the completed-throughput measure, and their replay (no Ray)."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from builders import batch_sample, operator_state, replica_state, runner_state

from benchmarks import observe_live
from benchmarks.live_trace import TRACE_DIR, RecordingPolicy, RunnerPoller, TraceWriter, load, state_from_dict
from trident_flows.core.decision import Decision
from trident_flows.core.state import OperatorState, ReplicaState, RunnerState
from trident_flows.core.types import BatchSample, OpConfig, OperatorPlan, Plan, ReplicaGroup
from trident_flows.scheduler.throughput_measure import completed_input_items, placement_settled, remaining_input_items, stream_positions, sustainable_throughput

A = OpConfig.make(batch_size=8, threads=2)


def _op(name: str, items_in: int, forwarded: int, queue: int = 0) -> OperatorState:
    reps = (replica_state(actor_name="a0", config=A, inflight=1, busy_fraction=0.5, batches=3, cold_start_s=1.5),)
    return operator_state(name=name, replicas=reps, queue_items=queue, queue_bytes=queue * 10, items_in=items_in, items_out=items_in, config_epoch=2,
                          busy_fraction=0.5, items_forwarded=forwarded)


def _state(wall: float, parse: tuple[int, int, int], embed: tuple[int, int, int]) -> RunnerState:
    return runner_state(operators=(_op("parse", *parse), _op("embed", *embed)), items_in=500, wall_s=wall, cluster_gpus=1)


def test_state_round_trips_through_its_dict():
    state = _state(3.0, (100, 90, 40), (45, 0, 5))
    assert state_from_dict(state.to_dict()) == state


def test_completed_throughput_is_not_fooled_by_queues_filling():
    # the head took 400 items in 10 s but the tail finished none of them: nothing completed
    a, b = _state(0.0, (0, 0, 0), (0, 0, 0)), _state(10.0, (400, 400, 100), (0, 0, 400))
    assert sustainable_throughput(a, b) == 0.0
    # the tail took half of what was delivered to it: half the head's position has completed
    c = _state(20.0, (600, 600, 0), (300, 0, 300))
    assert stream_positions(c) == {"parse": 600.0, "embed": 300.0}
    assert completed_input_items(c) == 300.0
    assert sustainable_throughput(b, c) == pytest.approx(30.0)
    with pytest.raises(ValueError, match="pass the earlier one first"):
        sustainable_throughput(c, b)


def test_rows_filtered_upstream_do_not_hold_the_tail_back():
    # parse forwarded 80 of 100 rows (20 filtered): embed having taken all 80 means all 100 inputs are done
    state = _state(5.0, (100, 80, 0), (80, 0, 0))
    assert completed_input_items(state) == 100.0


def test_items_left_are_counted_in_input_items_not_rows():
    # decode read 10 of 20 videos and split them into 50 clips; embed took 25 clips, 25 wait in its queue
    decode = operator_state(name="decode", replicas=(_replica("d0", 9),), items_in=10, items_out=50, config_epoch=1, busy_fraction=0.5, items_forwarded=50)
    embed = operator_state(name="embed", replicas=(_replica("e0", 9),), queue_items=25, queue_bytes=250, items_in=25, items_out=25, config_epoch=1,
                           busy_fraction=0.5)
    state = runner_state(operators=(decode, embed), items_in=10, items_written=25, rows_written=25, wall_s=5.0)
    # 10 videos not read + 5 read and not finished (25 queued clips are 5 videos, not 25 items)
    assert remaining_input_items(state, 20) == 15.0
    assert remaining_input_items(state, None) is None
    # everything read and finished: nothing left, whatever the rows written
    done = runner_state(operators=(replace(decode, items_in=20, items_out=100, items_forwarded=100), replace(embed, queue_items=0, items_in=100)),
                        items_in=20, items_written=100, rows_written=100, input_closed=True, wall_s=9.0)
    assert remaining_input_items(done, 20) == 0.0


class _Inner:
    name = "fake"

    def __init__(self, decision):
        self.decision = decision
        self.last_record = None

    def decide(self, state, samples):
        return self.decision


class _Page:
    def __init__(self, samples, next_):
        self.samples, self.next = samples, next_


class _Handle:
    """Stands in for a runner actor handle: ``samples.remote(since)`` returns what came after ``since``."""

    def __init__(self, samples):
        self._samples = samples
        self.samples = self

    def remote(self, since):
        return _Page(tuple(self._samples[since:]), len(self._samples))


def test_recording_writes_polls_and_decisions_and_returns_the_decision_unchanged(tmp_path: Path, monkeypatch):
    import ray

    monkeypatch.setattr(ray, "get", lambda ref: ref)
    plan = Plan((OperatorPlan("embed", (ReplicaGroup(A, 2),), "more"),), 12.5, "why")
    writer = TraceWriter(tmp_path / "t.jsonl.gz", {"pipeline": "p", "policy": "fake", "blocks": [["short", 0, 10], ["long", 10, 20]]})
    decision = Decision.roll_out(plan, "why")
    policy = RecordingPolicy(_Inner(decision), writer)
    sample = batch_sample(operator="parse", config=A, start=1.0, end=2.0, busy_s=0.5, items_in=8, features={"pages": 12.0})
    poller = RunnerPoller(_Handle([sample]), writer, every_s=0.0)
    poller(_state(1.0, (8, 8, 0), (0, 0, 8)))
    assert policy.decide(_state(1.5, (8, 8, 0), (0, 0, 8)), [sample]) is decision
    poller(_state(2.0, (16, 16, 0), (8, 0, 8)))
    writer.end({"items_in": 16})
    trace = load(tmp_path / "t.jsonl.gz")
    assert [t.state.wall_s for t in trace.ticks] == [1.0, 2.0]
    assert trace.ticks[0].samples == (sample,) and trace.ticks[1].samples == ()   # each sample once
    assert [(d.wall_s, d.plan) for d in trace.decisions] == [(1.5, plan)]
    assert trace.blocks == [("short", 0, 10), ("long", 10, 20)] and trace.summary == {"items_in": 16}


def test_an_incomplete_trace_is_refused(tmp_path: Path):
    TraceWriter(tmp_path / "t.jsonl.gz", {"pipeline": "p"}).end({})
    with pytest.raises(ValueError, match="record it again"):
        load(tmp_path / "t.jsonl.gz")


@pytest.mark.skipif(not (TRACE_DIR / "docs-static.jsonl.gz").exists(), reason="trace not recorded")
def test_replay_of_a_committed_trace_scores_every_figure():
    result = observe_live.run(traces=[TRACE_DIR / "docs-static.jsonl.gz"])
    assert 0 < result.summary["capacity_mape"] < 0.1
    assert result.raw["held_out_windows"] > 50 and result.raw["saturated_spans"] > 0
    trace = result.raw["traces"]["docs-static"]
    # every operator sees the schedule's three switches; the cost-changing ones are found or listed as missed
    assert all(len(t) == 3 for t in trace["truth"].values())
    assert result.raw["switches_observable"] == len(result.raw["switches_missed"]) + sum(
        len(d["delays"]) for d in trace["detection"].values())


def _replica(rid: str, batches: int, warm: bool = True, draining: bool = False) -> ReplicaState:
    return replica_state(replica_id=rid, actor_name=f"a-{rid}", config=A, warm=warm, draining=draining, inflight=1, busy_fraction=0.5,
                         batches=batches, config_epoch=1, cold_start_s=1.5)


def test_a_placement_settles_once_every_replica_finished_a_batch_and_none_drains():
    def state(*replicas: ReplicaState) -> RunnerState:
        op = operator_state(name="ocr", replicas=replicas, queue_items=50, queue_bytes=500, items_in=100, items_out=100, config_epoch=1,
                            busy_fraction=0.9, items_forwarded=100)
        return runner_state(operators=(op,), items_in=100, wall_s=5.0, reconfigurations=1)

    # warm but not yet through its first batch: the operator's output is still the old replica's
    assert not placement_settled(state(_replica("old", 40), _replica("new", 0)), ["ocr"])
    # a replica being drained still adds the old placement's output
    assert not placement_settled(state(_replica("old", 40), _replica("new", 1), _replica("gone", 9, draining=True)), ["ocr"])
    assert not placement_settled(state(_replica("old", 40), _replica("cold", 0, warm=False)), ["ocr"])
    assert placement_settled(state(_replica("old", 40), _replica("new", 1)), ["ocr"])
    assert placement_settled(state(_replica("new", 0)), [])   # nothing changed: nothing to wait for


def _one_block_at_a_time(ends: np.ndarray, blocks: list[tuple[str, float]]) -> "observe_live._Switches":
    """Batches of ``ends`` (sorted), each 0.5 s long and of the block the schedule was in when it began."""
    starts = ends - 0.5
    began = np.searchsorted([t for _, t in blocks], starts, side="right")
    return observe_live._Switches(ends, blocks, starts, began, ("short", *(name for name, _ in blocks)))


def test_a_plan_is_not_scored_on_a_workload_its_bottleneck_had_not_run():
    ends = np.arange(0.0, 20.0, 1.0)    # one batch a second
    switches = {"ocr": _one_block_at_a_time(ends, [("long", 10.0)])}
    # the bottleneck reached the new block after the plan, while it was measured
    assert "after the plan" in observe_live._unseen_workload(switches, decided_at=8.0, until=15.0)
    # ... or three batches before it: its model had not been refitted on the new workload
    assert "finished 3 batch(es)" in observe_live._unseen_workload(switches, decided_at=12.0, until=18.0)
    # a block it has run long enough, or one it reaches after the measurement, is no reason
    assert observe_live._unseen_workload(switches, decided_at=18.0, until=19.0) == ""
    assert observe_live._unseen_workload(switches, decided_at=2.0, until=9.0) == ""


def test_a_report_of_late_batches_from_an_earlier_block_is_not_a_false_alarm():
    truth = [{"index": 100, "old": "scans", "new": "short", "cost_ratio": 150.0, "observable": True}]
    changes = [{"index": 104, "kind": "features"}, {"index": 300, "kind": "features"}]
    reordered = np.zeros(310, dtype=bool)
    # without out-of-order completions the second report matches no switch
    assert observe_live._score_detection(truth, changes, 310, reordered)["false_alarms"] == [changes[1]]
    # five of the eight batches it voted on began in the scans block and completed 200 batches later
    reordered[294:299] = True
    scored = observe_live._score_detection(truth, changes, 310, reordered)
    assert scored["false_alarms"] == [] and scored["out_of_order"] == [changes[1]] and scored["delays"] == [5]


def test_late_batches_are_told_by_their_content_and_the_detector_s_return_is_not_a_false_alarm():
    def sample(chars_per_item: float) -> BatchSample:
        return batch_sample(operator="langid", config=A, items_in=8, features={"chars": 8 * chars_per_item})

    rng = np.random.default_rng(3)
    short, long = [4000 * rng.lognormal(0, 0.2) for _ in range(200)], [40000 * rng.lognormal(0, 0.2) for _ in range(60)]
    # completion order: short, long, short again; eight long batches finish among the second short block's
    content = short[:100] + long + short[100:150] + long[:8] + short[150:]
    regimes = ["short"] * 100 + ["long"] * 60 + ["short"] * (len(content) - 160)
    workloads = {"short": {"chars": 4000.0}, "long": {"chars": 40000.0}}
    elsewhere = observe_live._content_elsewhere([sample(c) for c in content], regimes, workloads)
    assert elsewhere[210:218].all() and elsewhere.sum() == 8
    # a block that completed half out of order: every other batch the truth places in the long block is a late short one
    mixed = [c for pair in zip(long[:30], short[:30]) for c in pair]
    told = observe_live._content_elsewhere([sample(c) for c in short[:50] + mixed], ["short"] * 50 + ["long"] * 60, workloads)
    assert told[51::2].all() and told.sum() == 30
    # the detector went to the long regime on them (0 -> 1) and came back (1 -> 0): both listed apart
    truth = [{"index": 100, "old": "short", "new": "long", "cost_ratio": 1.4, "observable": True},
             {"index": 160, "old": "long", "new": "short", "cost_ratio": 1.4, "observable": True}]
    changes = [{"index": 105, "old": 0, "new": 1}, {"index": 165, "old": 1, "new": 0}, {"index": 217, "old": 0, "new": 1},
               {"index": 226, "old": 1, "new": 0}]
    scored = observe_live._score_detection(truth, changes, len(content), elsewhere)
    assert scored["false_alarms"] == [] and scored["out_of_order"] == changes[2:]
    # without the late batches both reports would be false alarms
    assert observe_live._score_detection(truth, changes, len(content), np.zeros(len(content), dtype=bool))["false_alarms"] == changes[2:]


def test_the_trident_decision_log_measures_completed_input_items_as_the_benchmark_does():
    from trident_flows.core.types import ClusterSpec
    from trident_flows.scheduler.trident_policy import TridentPolicy

    def state(wall: float, videos: int) -> RunnerState:
        # decode splits every video into 5 clips; embed finished all the clips it was given
        decode = operator_state(name="decode", replicas=(_replica("d0", 9),), items_in=videos, items_out=5 * videos, config_epoch=1,
                                busy_fraction=0.5, items_forwarded=5 * videos)
        embed = operator_state(name="embed", replicas=(_replica("e0", 9),), items_in=5 * videos, items_out=5 * videos, config_epoch=1, busy_fraction=0.5)
        return runner_state(operators=(decode, embed), items_in=videos, items_written=5 * videos, rows_written=5 * videos, wall_s=wall)

    policy = TridentPolicy(None, ClusterSpec.single_node(8, 0))
    policy.tick(state(10.0, 10), [])
    record = policy.tick(state(20.0, 30), [])
    # 20 videos in 10 s: 2 input items/s, the unit of every predicted throughput (100 rows were written)
    assert record.pipeline_throughput == pytest.approx(2.0)
    assert record.pipeline_throughput == pytest.approx(sustainable_throughput(state(10.0, 10), state(20.0, 30)))


def test_a_plan_made_before_its_workload_was_seen_is_judged_on_the_models_refitted_when_it_settled():
    ends = np.arange(0.0, 40.0, 0.5)     # the bottleneck finishes two batches a second
    switches = {"ocr": _one_block_at_a_time(ends, [("long", 10.0)])}
    decision = {"queue_aware": 5.0, "queue_aware_bottleneck": "ocr", "busy_time": 5.0}
    settle = {"queue_aware": 2.0, "queue_aware_bottleneck": "ocr", "busy_time": 2.0}
    # decided 1 s into the new block (3 batches), settled 8 s in (17 batches, enough for a refit): the refitted models' prediction
    judged = observe_live._judged_prediction(decision, settle, switches, decided_at=11.0, settled_at=18.0, until=28.0)
    assert judged["status"] == "scored" and judged["predicted_at"] == "settled" and judged["queue_aware"] == 2.0
    assert judged["decision_prediction"] == 5.0 and "finished 3 batch(es)" in judged["decision_unseen"]
    # settled 2 s in (4 batches): neither had seen the workload
    judged = observe_live._judged_prediction(decision, settle, switches, decided_at=11.0, settled_at=12.0, until=22.0)
    assert judged["status"].startswith(observe_live.WORKLOAD_CHANGED) and judged["queue_aware"] == 5.0
    # a decision made on a workload its model had run is judged as it was made
    judged = observe_live._judged_prediction(decision, settle, switches, decided_at=20.0, settled_at=22.0, until=30.0)
    assert judged["predicted_at"] == "decision" and judged["queue_aware"] == 5.0
    # no model at the decision: the refitted models' prediction, when they had seen the workload
    judged = observe_live._judged_prediction({"error": "embed: no model"}, settle, switches, decided_at=1.0, settled_at=2.0, until=9.0)
    assert judged["status"] == "scored" and judged["queue_aware"] == 2.0 and "no model" in judged["decision_unseen"]


def test_a_plan_measured_while_its_bottleneck_still_ran_batches_of_the_block_it_left_is_not_scored():
    # two replicas finish a 1-s batch of the new block each second from t=11, a third runs one batch
    # of the block it left from 10 to 40 s
    ends = np.append(np.arange(11.0, 60.0, 0.5), 40.0)
    starts = np.append(ends[:-1] - 1.0, 10.0)
    began = np.append(np.ones(len(ends) - 1, dtype=int), 0)
    sw = observe_live._Switches(ends, [("long", 11.0)], starts, began, ("short", "long"))
    # 20-30 s: a third of its busy time went to the old block's batch
    assert "on batches of another block than 'long'" in observe_live._mixed_workload("embed", sw, 20.0, 30.0, "then")
    assert observe_live._mixed_workload("embed", sw, 41.0, 51.0, "then") == ""     # the old batch is done
    decision = {"queue_aware": 5.0, "queue_aware_bottleneck": "embed", "busy_time": 5.0}
    judged = observe_live._judged_prediction(decision, {}, {"embed": sw}, decided_at=30.0, settled_at=30.5, until=39.0)
    assert judged["status"].startswith(observe_live.WORKLOAD_CHANGED) and "a mix" in judged["status"]
    # measured once the old batch was done, but predicted while it still held a replica: the model's recent work was a mix
    judged = observe_live._judged_prediction(decision, {}, {"embed": sw}, decided_at=39.0, settled_at=41.0, until=51.0)
    assert judged["status"].startswith(observe_live.WORKLOAD_CHANGED) and "before the prediction" in judged["status"]
    judged = observe_live._judged_prediction(decision, {}, {"embed": sw}, decided_at=51.0, settled_at=52.0, until=60.0)
    assert judged["status"] == "scored"
