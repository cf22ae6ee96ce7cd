"""control/elastic.py: scale decisions sent to (a stand-in for) Ray's autoscaler, and the request cleared at the end (no Ray)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from builders import operator_state, replica_state, runner_state

from trident_flows.control.elastic import ElasticScaler
from trident_flows.core.state import NodeState, RunnerState
from trident_flows.core.types import CPU, OpConfig
from trident_flows.planning.catalogue import Catalogue, NodeType
from trident_flows.planning.scale import NodePool, RunGoal, ScaleAction

POOL = NodePool(Catalogue((NodeType("c2", 2, 1.0, max_count=4), NodeType("c4", 4, 1.5, max_count=2)), startup_minutes=1.0), 0.5)
HEAD = NodeState("head", "2cpu-4g", 2, 0, 4 * 2**30, is_head=True)
C4 = NodeState("w1", "4cpu-c4-4g", 4, 0, 4 * 2**30, resources=(("c4", 1.0),))
CONFIG = OpConfig.make(CPU, batch_size=4)


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def state(done: int, wall_s: float, nodes: tuple[NodeState, ...] = (HEAD,), finished: bool = False,
          joined_s: float = 0.0) -> RunnerState:
    """One operator, one replica per CPU of ``nodes`` (warm since ``joined_s`` on a worker node, since the start on the head), each
    busy for as long as 1 item/s takes (the measured rate: 1 item/s a replica)."""
    warm_s = [(n.node_id, wall_s if n.is_head else wall_s - joined_s) for n in nodes for _ in range(int(n.cpus))]
    busy = done / sum(s for _, s in warm_s)
    replicas = tuple(replica_state(replica_id=f"{node}-r{i}", actor_name=f"a{i}", config=CONFIG, busy_fraction=busy, batches=done // 8)
                     for i, (node, _) in enumerate(warm_s))
    op = operator_state(name="work", replicas=replicas, items_in=done, items_out=done, busy_fraction=1.0)
    return runner_state(operators=(op,) if done else (), items_in=done, items_written=done, rows_written=done, input_closed=finished,
                        finished=finished, wall_s=wall_s, throughput=done / max(wall_s, 1e-9), cluster_cpus=2.0, nodes=nodes)


@pytest.fixture
def scaler():
    clock, sent = Clock(), []
    s = ElasticScaler(POOL, RunGoal(deadline_at=clock.t + 600), items_total=1300, request=lambda **kw: sent.append(kw), interval_s=10,
                      clock=clock)
    return s, clock, sent


def test_no_request_before_the_operators_have_worked_and_the_next_tick_asks_again(scaler):
    s, clock, sent = scaler
    clock.t += 48
    before = state(96, 48.0)
    before = replace(before, operators=(replace(before.operators[0], items_in=0),))  # its replicas are warm; none finished a batch yet
    assert s.step(before).action == ScaleAction.WAIT and sent == []
    clock.t += 2  # a tick later, within the interval: the operators have worked, the missed deadline is asked for at once
    d = s.step(state(100, 50.0))
    assert d.action == ScaleAction.ADD and len(sent) == 1


def test_a_missed_deadline_is_requested_by_class_and_the_request_cleared_at_the_end(scaler):
    s, clock, sent = scaler
    clock.t += 50  # 100 items in 50 s at 2 items/s: 1200 left in 550 s, the head alone needs 600
    d = s.step(state(100, 50.0))
    assert d.action == ScaleAction.ADD and d.counts == {"c4": 1}
    assert sent == [{"bundles": [{"CPU": 4.0, "c4": 1.0}]}] and s.nodes_requested == 1
    clock.t += 5
    assert s.step(state(110, 55.0)) is None  # within the interval: no decision
    clock.t += 3  # the node joined; its replicas are first seen warm
    assert s.step(state(116, 58.0, (HEAD, C4), joined_s=58.0)) is None
    clock.t += 57  # 1070 items left in 485 s need it (the head alone: 535 s); the request stands
    d = s.step(state(230, 115.0, (HEAD, C4), joined_s=58.0))
    assert d.action == ScaleAction.KEEP and d.counts == {"c4": 1} and len(sent) == 1
    assert s.decisions[0].measured_items_per_s == pytest.approx(130 / 65)
    assert s.node_seconds == {"c4": pytest.approx(60.0)} and s.spent == pytest.approx(1.5 * 60 / 3600 + 0.5 * 115 / 3600)
    clock.t += 200
    d = s.step(state(1300, 315.0, (HEAD, C4), finished=True))  # every item done: every node given back
    assert d.action == ScaleAction.GIVE_BACK and sent[-1] == {"bundles": []}
    s.release()
    s.release()
    assert sent[-1] == {"bundles": []} and len(sent) == 3
    summary = s.summary()
    assert summary["nodes_requested"] == 1 and summary["request_cleared"] and [x["action"] for x in summary["decisions"]] == ["add", "give_back"]


def test_a_deadline_the_head_meets_requests_no_node(scaler):
    s, clock, sent = scaler
    s.items_total = 600
    clock.t += 50
    d = s.step(state(100, 50.0))
    assert d.action == ScaleAction.KEEP and d.counts == {} and sent == []
    s.release()
    assert sent == [{"bundles": []}] and s.summary()["nodes_requested"] == 0


def test_nodes_are_counted_by_their_class_marker_and_the_rest_are_the_base(scaler):
    s, _, _ = scaler
    other = NodeState("w2", "2cpu-4g", 2, 0, 4 * 2**30)
    assert s.counts((HEAD, C4, other)) == {"c4": 1}
    assert s._base((HEAD, C4, other))[0] == 4


def test_the_rate_measured_on_unchanged_nodes_calibrates_the_decision(scaler):
    s, clock, sent = scaler
    s.items_total = 600
    clock.t += 50  # the operators' rates say the head does 2 items/s: 500 items in 250 s of 550, nothing to add
    assert s.step(state(100, 50.0)).action == ScaleAction.KEEP and sent == []
    clock.t += 20  # on the same nodes only 10 items came out in 20 s: 0.5 items/s, 490 items would take 980 s
    d = s.step(state(110, 70.0))
    assert d.action == ScaleAction.ADD and d.nodes >= 1 and len(sent) == 1


def test_an_interval_with_a_replica_starting_is_not_read_as_the_clusters_rate(scaler):
    s, clock, sent = scaler
    s.items_total = 600
    clock.t += 50  # the head does 2 items/s: 500 items in 250 s of 550, nothing to add
    assert s.step(state(100, 50.0)).action == ScaleAction.KEEP
    clock.t += 20  # 10 items in 20 s, but a replica is in its cold start: the interval says nothing of the nodes' rate
    starting = state(110, 70.0)
    cold = replace(starting.operators[0].replicas[0], replica_id="new", warm=False, busy_fraction=0.0)
    starting = replace(starting, operators=(replace(starting.operators[0], replicas=starting.operators[0].replicas + (cold,)),))
    d = s.step(starting)
    assert d.action == ScaleAction.KEEP and sent == []


def test_rates_are_read_on_the_states_clock_when_the_state_is_older_than_the_decision(scaler):
    s, clock, sent = scaler
    s.items_total = 600
    clock.t += 50
    assert s.step(state(100, 50.0)).action == ScaleAction.KEEP
    clock.t += 60  # an apply blocked the loop: the decision comes 60 s later, on a state read 5 s after the last one
    d = s.step(state(110, 55.0))  # 10 items in the state's 5 s: still 2 items/s, 490 items in 245 s of 490
    assert d.action == ScaleAction.KEEP and sent == []


def test_a_retired_replica_is_forgotten(scaler):
    s, clock, _ = scaler
    clock.t += 50
    s.step(state(100, 50.0))
    first = {r.replica_id for r in state(100, 50.0).operators[0].replicas}
    clock.t += 20  # the head's replicas retired, others serve: a long run keeps only the replicas it still has
    later = state(140, 70.0)
    renamed = tuple(replace(r, replica_id=f"next-{r.replica_id}") for r in later.operators[0].replicas)
    s.step(replace(later, operators=(replace(later.operators[0], replicas=renamed),)))
    assert set(s._warm_since) == {r.replica_id for r in renamed} and not first & set(s._warm_since)
