"""The rollout-latency benchmark's summary, computed from given per-item times and apply windows (pure: no Ray)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks.rollout_latency import FULL, QUICK, Window, groups, offered_times, per_rollout, summarise, windows_of

NAN = math.nan


def _step(kind: str, operator: str = "ocr", count: int = 1) -> dict:
    return {"kind": kind, "operator": operator, "count": count}


def test_apply_reports_become_windows_and_only_start_plus_retire_is_a_rolling_update():
    reports = [
        {"steps_done": [_step("retire"), _step("start", "embed", 2)], "started_at": 100.0, "seconds": 12.5, "reason": "roll out",
         "dip": 0.25},
        {"steps_done": [_step("canary")], "started_at": 200.0, "seconds": 3.0},
        {"steps_done": [], "started_at": 0.0, "seconds": 0.0, "reason": "refused"},  # no step ran: no window
    ]
    windows = windows_of(reports)
    assert windows == [Window(100.0, 112.5, True, ("retire 1 ocr", "start 2 embed"), "roll out", 0.25),
                       Window(200.0, 203.0, False, ("canary 1 ocr",))]


def test_items_are_offered_at_their_shards_time_in_read_order():
    assert offered_times([10.0, 10.5, 11.0], [2, 1, 2]).tolist() == [10.0, 10.0, 10.5, 11.0, 11.0]


def test_the_schedules_leave_steady_time_between_updates_and_make_at_least_three():
    for schedule in (FULL, QUICK):
        assert schedule.updates >= 3 and schedule.settle_s < schedule.warmup_s
        at = schedule.update_at()
        assert at[0] == schedule.warmup_s and np.diff(at).tolist() == [schedule.period_s] * (schedule.updates - 1)
        assert schedule.feed_s == at[-1] + schedule.period_s


def test_items_are_sorted_into_warmup_steady_during_rollout_and_other_applies():
    #                 warmup  steady rollout rollout other  lost
    offered = np.array([0.0, 10.0, 20.0, 30.0, 40.0, 50.0])
    done = np.array([4.0, 14.0, 25.0, 34.0, 44.5, NAN])
    commit = np.array([5.0, 15.0, 28.0, 35.0, 45.0, NAN])
    windows = [Window(26.0, 32.0, True), Window(44.0, 46.0, False)]
    g = groups(offered, commit, windows, warmup_end=5.0)
    assert {name: np.flatnonzero(mask).tolist() for name, mask in g.items()} == \
        {"warmup": [0], "during_rollout": [2, 3], "during_other_apply": [4], "steady": [1]}
    summary = summarise(offered, done, commit, windows, items_lost=1, warmup_end=5.0)
    assert summary["rollouts"] == 1 and summary["other_applies"] == 1
    # the headline runs offered -> committed
    assert summary["latency_s_p50_steady"] == summary["latency_s_p99_steady"] == pytest.approx(5.0)
    assert summary["latency_s_p50_during_rollout"] == pytest.approx(6.5)
    assert summary["latency_s_p99_during_rollout"] == pytest.approx(np.percentile([8.0, 5.0], 99))
    assert summary["p99_during_rollout_over_steady"] == pytest.approx(np.percentile([8.0, 5.0], 99) / 5.0)
    assert summary["p50_during_rollout_over_steady"] == pytest.approx(1.3)
    # offered -> done, grouped by done: item 2 (done at 25) was no longer in flight when the update began at 26
    assert summary["done_latency_s_p99_steady"] == pytest.approx(np.percentile([4.0, 5.0], 99))
    assert summary["done_latency_s_p99_during_rollout"] == pytest.approx(4.0)
    assert summary["done_p99_during_rollout_over_steady"] == pytest.approx(4.0 / np.percentile([4.0, 5.0], 99))
    assert (summary["items_warmup"], summary["items_steady"], summary["items_during_rollout"], summary["items_during_other_apply"]) \
        == (1, 1, 2, 1)
    assert summary["items_lost"] == 1
    # by completion: only the item committed inside the rolling update's window is during it
    by_completion = summary["by_completion"]
    assert by_completion["latency_s_p99_steady"] == pytest.approx(5.0)  # items 1 and 3 (committed at 35, after the update)
    assert by_completion["latency_s_p99_during_rollout"] == pytest.approx(8.0)  # item 2, committed at 28
    rollout = per_rollout(offered, commit, windows, t0=0.0, warmup_end=5.0)
    assert rollout == [{"start_s": 26.0, "seconds": 6.0, "steps": [], "dip": 0.0, "reason": "",
                        "in_flight_items": 2, "in_flight_latency_s_p99": pytest.approx(np.percentile([8.0, 5.0], 99)),
                        "done_before_items": 1, "done_before_latency_s_p99": pytest.approx(5.0),
                        "done_during_items": 1, "done_during_latency_s_p99": pytest.approx(8.0),
                        "done_after_items": 2, "done_after_latency_s_p99": pytest.approx(5.0)}]  # LOCAL_S = 20 s either side


def test_without_rolling_updates_the_during_figures_are_none():
    offered = np.array([0.0, 1.0, 2.0, 3.0])
    done = np.array([1.0, 2.0, 4.0, 5.0])
    summary = summarise(offered, done, done + 0.5, [], items_lost=0)
    assert summary["items_warmup"] == 0 and summary["items_steady"] == 4
    assert summary["rollouts"] == 0 and summary["latency_s_p99_during_rollout"] is None
    assert summary["p99_during_rollout_over_steady"] is None and summary["done_p99_during_rollout_over_steady"] is None
    assert summary["latency_s_p99_steady"] == pytest.approx(np.percentile([1.5, 1.5, 2.5, 2.5], 99))
