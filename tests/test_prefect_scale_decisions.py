"""flows/trident_sidecar.py: a scale decision that changes the request to Ray's autoscaler is shown like any other
decision: an event and a row of the decisions table, with its reason and predicted effect (no Ray, no Prefect server)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from trident_flows.control.elastic import ElasticScaler
from trident_flows.core.state import NodeState, OperatorState, ReplicaState, RunnerState
from trident_flows.core.types import CPU, OpConfig
from trident_flows.flows import trident_sidecar
from trident_flows.planning.catalogue import Catalogue, NodeType
from trident_flows.planning.scale import NodePool, RunGoal, ScaleAction, ScaleDecision
from trident_flows.tasks.sidecar_report import scale_row, scale_sentence
from trident_flows.tasks.sidecar_state import SidecarMemory

POOL = NodePool(Catalogue((NodeType("c4", 4, 1.5, max_count=2),), startup_minutes=1.0), 0.5)
HEAD = NodeState("head", "2cpu-4g", 2, 0, 4 * 2**30, is_head=True)
CONFIG = OpConfig.make(CPU, batch_size=4)


def _state(done: int, wall_s: float) -> RunnerState:
    """One operator with a replica per head CPU, each doing 1 item/s."""
    replicas = tuple(ReplicaState(f"r{i}", f"a{i}", CONFIG, warm=True, draining=False, canary=False, inflight=0,
                                  busy_fraction=done / (2 * wall_s), batches=done // 8, config_epoch=0) for i in range(2))
    op = OperatorState("work", replicas, queue_items=0, queue_bytes=0, items_in=done, items_out=done, config_epoch=0, busy_fraction=1.0,
                       errors=0, ooms=0)
    return RunnerState("documents", (op,), items_in=done, items_written=done, items_dead_lettered=0, items_dropped=0, rows_written=done,
                       input_closed=False, finished=False, wall_s=wall_s, throughput=done / wall_s, cluster_cpus=2.0, cluster_gpus=0.0,
                       reconfigurations=0, ooms=0, nodes=(HEAD,))


class _Clock:
    t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


class _Publisher:
    def __init__(self) -> None:
        self.tables: list[list[dict]] = []

    def decisions(self, artifact_id: str | None, rows: list[dict], description: str) -> str:
        self.tables.append(rows)
        return "artifact-1"


@pytest.fixture
def tuner(monkeypatch):
    clock, events = _Clock(), []
    monkeypatch.setattr(trident_sidecar, "get_run_logger", lambda: logging.getLogger("test"))
    monkeypatch.setattr(trident_sidecar, "emit_scale", lambda *args: events.append(args))
    t = object.__new__(trident_sidecar._Tuner)  # the tuner's scale step alone, without a flow run around it
    t.namespace, t.runner_name, t.related, t.publisher = "ns", "runner", [], _Publisher()
    t.settings, t._output_note = SimpleNamespace(policy="trident"), ""  # the table's description: policy, no output note
    t.scaler = ElasticScaler(POOL, RunGoal(deadline_at=clock.t + 600), items_total=1300, request=lambda **kw: None, interval_s=10, clock=clock)
    return t, clock, events


def test_a_scale_decision_is_an_event_and_a_row_of_the_decisions_table(tuner):
    t, clock, events = tuner
    memory = t._scale(_state(0, 1.0), SidecarMemory("k"))  # no operator has worked: a wait, nothing shown
    assert memory.view.decisions == () and events == []
    clock.t += 50  # 100 items in 50 s at 2 items/s: 1200 left in 550 s, the head alone needs 600
    memory = t._scale(_state(100, 50.0), memory)
    [(namespace, runner, pipeline, decision, currency, related)] = events
    assert decision.action == ScaleAction.ADD and dict(decision.counts) == {"c4": 1} and pipeline == "documents"
    [row] = memory.view.decisions
    assert row["decision"] == scale_sentence(decision) and row["decision"].startswith("Request Ray's autoscaler: 1x c4 held: ")
    assert row["start-up (s)"] == 60 and row["predicted after (docs/s)"] == round(decision.predicted_items_per_s, 2)
    assert t.publisher.tables == [[row]] and memory.decisions_artifact_id == "artifact-1"
    clock.t += 10  # the request stands: no new row, no event
    memory = t._scale(_state(120, 60.0), memory)
    assert len(memory.view.decisions) == 1 and len(events) == 1


def test_a_give_back_row_names_what_stays_and_its_gain():
    decision = ScaleDecision(ScaleAction.GIVE_BACK, {}, "no work left: every node given back", predicted_items_per_s=1.0, at=0.0)
    row = scale_row(decision, 2.0, 60.0, 12.0, "items/s")
    assert row["decision"] == "Give back to Ray's autoscaler: no worker node held: no work left: every node given back"
    assert row["gain"] == "-50%" and row["start-up (s)"] == "-" and row["predicted before (items/s)"] == 2.0
