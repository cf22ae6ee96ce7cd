"""The elastic benchmark's pure parts: node-seconds from Ray's autoscaler samples, and the planner's choice (no Ray)."""

from __future__ import annotations

import pytest

from benchmarks.elastic import cheapest_meeting, planner_options
from benchmarks.node_timeline import NodeSample, NodeSampler, first_at, most_requested, node_cost, node_seconds


def _s(t: float, alive: int, pending: int = 0, requested: int = 0) -> NodeSample:
    return NodeSample(t, {"c1": alive} if alive else {}, {"c1": pending} if pending else {}, requested)


SAMPLES = [_s(0, 0), _s(10, 0, 2, 2), _s(15, 2, 0, 2), _s(100, 2, 0, 0), _s(106, 1), _s(110, 0)]


def test_node_seconds_hold_each_count_until_the_next_sample_within_the_window():
    assert node_seconds(SAMPLES, 0, 200) == {"c1": pytest.approx(2 * 85 + 2 * 6 + 1 * 4)}
    assert node_seconds(SAMPLES, 0, 200, pending=True) == {"c1": pytest.approx(2 * 5 + 2 * 85 + 2 * 6 + 4)}
    # idle after the run's end at 100 s: two nodes for 6 s, one for 4 s, none after the last sample
    assert node_seconds(SAMPLES, 100, 1e9) == {"c1": pytest.approx(16.0)}
    assert node_seconds(SAMPLES, 50, 60) == {"c1": pytest.approx(20.0)}
    assert node_seconds(SAMPLES, 120, 130) == {}


def test_cost_requests_and_first_times_from_samples():
    assert node_cost({"c1": 3600.0, "head": 1800.0}, {"c1": 0.4, "head": 0.3}) == pytest.approx(0.55)
    assert most_requested(SAMPLES, 0, 99) == 2 and most_requested(SAMPLES, 101, 200) == 0
    assert first_at(SAMPLES, 0, lambda s: s.requested > 0) == 10
    assert first_at(SAMPLES, 10, lambda s: sum(s.alive.values()) >= s.requested > 0) == 15
    assert first_at(SAMPLES, 111, lambda s: True) is None


def test_a_sample_reads_the_autoscaler_status_and_a_failed_read_is_counted():
    status = {"workers": {"c1": 1}, "pending_nodes": {"c1": 2}, "requested_bundles": [{"CPU": 1.0}] * 3, "pending_launches": []}
    assert NodeSample.of(5.0, status) == NodeSample(5.0, {"c1": 1}, {"c1": 2}, 3)
    reads = iter([status, RuntimeError("gcs busy")])

    def read():
        value = next(reads, None)
        if isinstance(value, Exception):
            raise value
        if value is None:
            sampler._stopped.set()
            raise RuntimeError("done")
        return value

    sampler = NodeSampler(read, every_s=0.0)
    sampler.start()
    samples = sampler.stop() if sampler._stopped.wait(5) else pytest.fail("sampler did not run")
    assert [s.requested for s in samples] == [3] and sampler.failed == 2
    assert NodeSampler(read).stop() == []  # never started


def test_the_planner_choice_is_the_least_cost_cluster_finishing_by_the_deadline():
    options = planner_options(600)
    hours = [o.hours * 3600 for o in options]
    assert [o.counts.get("c1", 0) for o in options] == [0, 1, 2, 3]
    assert hours == sorted(hours, reverse=True) and [o.cost for o in options] == sorted(o.cost for o in options)
    # the cheapest cluster whose job (start-up included) ends by the deadline: the fewest c1 nodes that make it
    assert cheapest_meeting(options, hours[2] + 1).counts == {"head": 1, "c1": 2}
    assert cheapest_meeting(options, hours[0] + 1).counts == {"head": 1}
    assert cheapest_meeting(options, hours[3] - 1) is None


def test_the_first_run_needs_nodes_and_the_second_does_not_by_the_planner():
    from benchmarks.elastic import sizes

    for quick in (False, True):
        needs, suffices = sizes(quick)
        head_alone = {c.name: planner_options(c.items)[0].hours * 3600 for c in (needs, suffices)}
        assert head_alone["needs-nodes"] > 1.5 * needs.deadline_s
        assert head_alone["head-suffices"] < 0.7 * suffices.deadline_s
        assert cheapest_meeting(planner_options(needs.items), needs.deadline_s) is not None
