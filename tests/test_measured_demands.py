"""planning/advice.py ``measured_demands``: per-operator rates and the rows reaching each operator per input item."""

from __future__ import annotations

import pytest

from trident_flows.core.state import OperatorState, ReplicaState, RunnerState
from trident_flows.core.types import CPU, OpConfig
from trident_flows.planning.advice import measured_demands

CONFIG = OpConfig.make(CPU, batch_size=4)


def _operator(name: str, taken: int, forwarded: int, busy_fraction: float, queued: int = 0) -> OperatorState:
    replica = ReplicaState(f"{name}-0", f"{name}-a", CONFIG, warm=True, draining=False, canary=False, inflight=0,
                           busy_fraction=busy_fraction, batches=taken // 4, config_epoch=0)
    return OperatorState(name, (replica,), queue_items=queued, queue_bytes=0, items_in=taken, items_out=forwarded, config_epoch=0,
                         busy_fraction=busy_fraction, errors=0, ooms=0, items_forwarded=forwarded)


def _state(*operators: OperatorState, wall_s: float = 100.0) -> RunnerState:
    return RunnerState("p", operators, items_in=operators[0].items_in, items_written=0, items_dead_lettered=0, items_dropped=0,
                       rows_written=0, input_closed=False, finished=False, wall_s=wall_s, throughput=0.0, cluster_cpus=2.0,
                       cluster_gpus=0.0, reconfigurations=0, ooms=0)


def test_a_backlog_in_front_of_an_operator_does_not_shrink_its_share():
    # every input item was parsed and forwarded; embed took 100 of them so far, 500 wait in its queue
    demands = measured_demands(_state(_operator("parse", 600, 600, 0.1), _operator("embed", 100, 0, 1.0, queued=500)))
    assert [d.work_per_item for d in demands] == [1.0, 1.0]
    assert demands[1].options[0].throughput_curve[0] == (1, pytest.approx(1.0))  # 100 items over 100 busy seconds


def test_a_filter_upstream_scales_the_share_downstream():
    demands = measured_demands(_state(_operator("parse", 600, 600, 0.1), _operator("quality", 600, 300, 0.2),
                                      _operator("embed", 300, 0, 0.5)))
    assert [d.work_per_item for d in demands] == [1.0, 1.0, 0.5]


def test_an_operator_that_has_not_worked_is_named():
    with pytest.raises(ValueError, match="'embed' has not worked yet"):
        measured_demands(_state(_operator("parse", 10, 10, 0.1), _operator("embed", 0, 0, 0.0)))


def test_a_replica_warm_for_less_than_the_run_counts_its_own_warm_seconds():
    def replica(rid: str, cold_start_s: float) -> ReplicaState:
        return ReplicaState(rid, rid, CONFIG, warm=True, draining=False, canary=False, inflight=0, busy_fraction=1.0, batches=10,
                            config_epoch=0, cold_start_s=cold_start_s)

    # a replica warm since the start and one warm for the last 10 s, both always busy: 110 items at 1 item/s each
    op = OperatorState("embed", (replica("old", 0.0), replica("new", 0.0)), queue_items=50, queue_bytes=0, items_in=110, items_out=0,
                       config_epoch=0, busy_fraction=1.0, errors=0, ooms=0)
    [demand] = measured_demands(_state(op), warm_s={"new": 10.0})
    assert demand.options[0].throughput_curve[0] == (1, pytest.approx(1.0))
    # without the caller's seconds, a replica counts as started with the run, less its cold start
    op = OperatorState("embed", (replica("old", 20.0),), queue_items=0, queue_bytes=0, items_in=80, items_out=0, config_epoch=0,
                       busy_fraction=1.0, errors=0, ooms=0)
    [demand] = measured_demands(_state(op))
    assert demand.options[0].throughput_curve[0] == (1, pytest.approx(1.0))
