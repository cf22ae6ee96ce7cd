"""From the runner's state to the placement's inputs: work per input item."""

from __future__ import annotations

import pytest
from builders import operator_state, runner_state

from trident_flows.scheduler.placement.inputs import work_per_item


def _op_state(name, items_in, forwarded):
    return operator_state(name=name, items_in=items_in, items_out=items_in, config_epoch=1, busy_fraction=0.5, items_forwarded=forwarded)


def _runner_state(ops):
    return runner_state(operators=tuple(ops), items_in=ops[0].items_in, wall_s=10.0)


def test_work_per_item_uses_each_operators_own_split_and_filter_ratio_not_pipeline_lag():
    # decode took 100 videos and forwarded 100; scenes cut 100 videos into 500 clips; the last operator has
    # only taken 40 clips so far (the rest are queued): its work per video is still 5, not 0.4
    state = _runner_state([_op_state("decode", 100, 100), _op_state("scenes", 100, 500), _op_state("safety", 40, 0)])
    assert work_per_item(state) == pytest.approx({"decode": 1.0, "scenes": 1.0, "safety": 5.0})
    # a later regime cuts 10 clips per video: the recent interval decides, not the run's start
    later = _runner_state([_op_state("decode", 130, 130), _op_state("scenes", 130, 800), _op_state("safety", 300, 0)])
    assert work_per_item(later, [state]) == pytest.approx({"decode": 1.0, "scenes": 1.0, "safety": 10.0})
    # a filter that drops half its items halves the work of everything after it
    filtered = _runner_state([_op_state("parse", 50, 25), _op_state("embed", 20, 0)])
    assert work_per_item(filtered) == pytest.approx({"parse": 1.0, "embed": 0.5})
