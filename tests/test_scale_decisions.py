"""Scale decisions (planning/scale.py): what to request from the autoscaler for a deadline or a budget (pure: no Ray)."""

from __future__ import annotations

import math

import pytest

from trident_flows.core.types import CPU, OpConfig
from trident_flows.planning.catalogue import Catalogue, NodeType, PlanningError
from trident_flows.planning.scale import NodePool, RunGoal, ScaleAction, decide_scale, parse_deadline
from trident_flows.scheduler.placement.types import OperatorDemand, PlacementOption

NOW = 1_000_000.0
# one CPU operator doing 1 item/s per replica (one replica per CPU): the base node (2 CPUs) does 2 items/s
DEMANDS = [OperatorDemand("work", 1.0, (PlacementOption.from_rate(OpConfig.make(CPU, batch_size=4), 1.0),))]
# c2: 2 CPUs for 1.0/h; c4: 4 CPUs for 1.5/h (cheaper per CPU); 1 minute of start-up
POOL = NodePool(Catalogue((NodeType("c2", 2, 1.0, max_count=4), NodeType("c4", 4, 1.5, max_count=2)), startup_minutes=1.0), 0.5)
BASE = POOL.base_node(2)


def deadline_in(seconds: float) -> RunGoal:
    return RunGoal(deadline_at=NOW + seconds)


def test_a_deadline_the_base_node_meets_requests_nothing():
    d = decide_scale(DEMANDS, POOL, BASE, {}, {}, items_left=200, now=NOW, goal=deadline_in(200))  # 100 s on the base node
    assert d.action == ScaleAction.KEEP and d.counts == {} and POOL.bundles(d.counts) == []
    assert d.predicted_items_per_s == pytest.approx(2.0, rel=0.01) and d.predicted_finish_s == pytest.approx(100, rel=0.01)


def test_a_deadline_the_base_node_misses_asks_for_the_least_cost_per_item_counting_start_up():
    # 1200 items in 600 s: the base alone (2 items/s) needs all 600 s, past the 10% margin. After the 60 s start-up the
    # cluster must do (1200 - 2*60) / (540 - 60) = 2.25 items/s; per item, base + c4 (2.0/h for 6/s) beats base + c2 (1.5/h for 4/s)
    d = decide_scale(DEMANDS, POOL, BASE, {}, {}, items_left=1200, now=NOW, goal=deadline_in(600))
    assert d.action == ScaleAction.ADD and d.counts == {"c4": 1}
    assert d.predicted_finish_s <= 600 * 0.9 + 1e-6
    assert POOL.bundles(d.counts) == [{"CPU": 4.0, "c4": 1.0}]
    assert "start-up" in d.reason and d.predicted_cost > 0


def test_nodes_held_and_no_longer_needed_are_given_back_and_needed_ones_kept():
    held = {"c4": 2}
    # few items left: the base alone finishes 20 items in 10 s, far before the deadline
    back = decide_scale(DEMANDS, POOL, BASE, held, held, items_left=20, now=NOW, goal=deadline_in(600))
    assert back.action == ScaleAction.GIVE_BACK and back.counts == {} and "given back" in back.reason
    # many items left: 2x c4 + base (10 items/s) are needed for 5000 items in 600 s
    keep = decide_scale(DEMANDS, POOL, BASE, held, held, items_left=5000, now=NOW, goal=deadline_in(600))
    assert keep.action == ScaleAction.KEEP and keep.counts == held


# a light operator (100 items/s per replica) and a heavy one (1 item/s): the LP relaxation gives the light one a hundredth
# of a CPU and rates the base node (2 CPUs) at 2/1.01 = 1.98 items/s; with whole replicas each holds a CPU: 1 item/s
LIGHT_HEAVY = [OperatorDemand("light", 1.0, (PlacementOption.from_rate(OpConfig.make(CPU, batch_size=4), 100.0),)),
               OperatorDemand("heavy", 1.0, (PlacementOption.from_rate(OpConfig.make(CPU, batch_size=4), 1.0),))]


def test_a_cluster_whose_whole_replica_rate_misses_the_deadline_gets_nodes_added():
    # 190 items in 200 s: the relaxation's 1.98 items/s finish in 96 s (KEEP, the bench elastic defect); whole replicas
    # take 190 s, past the 10% margin (180 s), so nodes are requested and the prediction is the whole-replica one
    d = decide_scale(LIGHT_HEAVY, POOL, BASE, {}, {}, items_left=190, now=NOW, goal=deadline_in(200))
    assert d.action == ScaleAction.ADD and d.nodes >= 1
    assert d.predicted_finish_s <= 200 * 0.9 + 1e-6
    alone = decide_scale(LIGHT_HEAVY, POOL, BASE, {}, {}, items_left=100, now=NOW, goal=deadline_in(1000))
    assert alone.action == ScaleAction.KEEP and alone.predicted_items_per_s == pytest.approx(1.0, rel=0.01)


def test_the_running_cluster_is_rated_by_its_measured_rate_when_given():
    # the model says the base node does 2 items/s (200 items in 100 s of 200); measured on it: 0.5 items/s (400 s)
    kept = decide_scale(DEMANDS, POOL, BASE, {}, {}, items_left=200, now=NOW, goal=deadline_in(200))
    assert kept.action == ScaleAction.KEEP
    d = decide_scale(DEMANDS, POOL, BASE, {}, {}, items_left=200, now=NOW, goal=deadline_in(200), measured_items_per_s=0.5)
    assert d.action == ScaleAction.ADD and d.predicted_finish_s <= 200 * 0.9 + 1e-6


def test_a_new_node_that_would_start_after_the_deadline_is_not_requested():
    d = decide_scale(DEMANDS, POOL, BASE, {}, {}, items_left=1000, now=NOW, goal=deadline_in(50))
    assert d.action == ScaleAction.KEEP and d.counts == {} and "missed" in d.reason


def test_an_unreachable_deadline_asks_for_every_node_and_says_so():
    d = decide_scale(DEMANDS, POOL, BASE, {}, {}, items_left=100_000, now=NOW, goal=deadline_in(600))
    assert d.counts == {"c2": 4, "c4": 2} and "no cluster finishes" in d.reason


def test_no_work_left_gives_every_node_back():
    d = decide_scale(DEMANDS, POOL, BASE, {"c2": 1}, {"c2": 1}, items_left=0, now=NOW, goal=deadline_in(600))
    assert d.action == ScaleAction.GIVE_BACK and d.counts == {} and POOL.bundles(d.counts) == []


def test_a_budget_moves_to_a_cheaper_cluster_per_item_only_within_the_budget():
    # held: 2x c2 (2/h for 4 items/s more) where one c4 gives the same rate for 1.5/h
    held = {"c2": 2}
    d = decide_scale(DEMANDS, POOL, BASE, held, held, items_left=36_000, now=NOW, goal=RunGoal(budget=100.0))
    assert d.action == ScaleAction.ADD and d.counts == {"c4": 1}
    broke = decide_scale(DEMANDS, POOL, BASE, held, held, items_left=36_000, now=NOW, goal=RunGoal(budget=1.0), spent=0.5)
    assert broke.action == ScaleAction.KEEP and broke.counts == held and "budget" in broke.reason


def test_decisions_carry_their_predicted_effect_as_plain_data():
    d = decide_scale(DEMANDS, POOL, BASE, {}, {}, items_left=1200, now=NOW, goal=deadline_in(600)).to_dict()
    assert d["action"] == "add" and d["nodes"] == {"c4": 1} and d["predicted_items_per_s"] > 2 and d["measured_items_per_s"] is None


@pytest.mark.parametrize("text, seconds", [("5400", 5400), ("90m", 5400), ("1.5h", 5400), ("30s", 30)])
def test_deadlines_are_read_as_durations(text, seconds):
    assert parse_deadline(text, NOW) == pytest.approx(NOW + seconds)


def test_deadlines_are_read_as_iso_times_and_bad_ones_refused():
    assert parse_deadline("2100-01-01T00:00+00:00", NOW) == pytest.approx(4102444800.0)
    with pytest.raises(PlanningError, match="ISO 8601"):
        parse_deadline("tomorrow", NOW)
    with pytest.raises(PlanningError, match="not in the future"):
        parse_deadline("2000-01-01T00:00", NOW * 1000)


def test_a_goal_is_one_deadline_or_one_budget():
    with pytest.raises(PlanningError, match="one goal"):
        RunGoal()
    with pytest.raises(PlanningError, match="one goal"):
        RunGoal(deadline_at=NOW, budget=1.0)
    with pytest.raises(PlanningError, match="> 0"):
        RunGoal(budget=-1.0)


def test_a_pool_needs_a_worker_class_and_prices_the_head_from_the_catalogue():
    cat = Catalogue((NodeType("head", 2, 0.7), NodeType("c2", 2, 1.0)))
    pool = NodePool.from_catalogue(cat)
    assert pool.base_price_per_hour == 0.7 and pool.classes.names == ("c2",)
    assert math.isclose(pool.hourly_price({"c2": 2}), 2.7)
    with pytest.raises(PlanningError, match="no worker class"):
        NodePool.from_catalogue(Catalogue((NodeType("head", 2, 0.7),)))
