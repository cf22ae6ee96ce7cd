"""The rollout-latency benchmark's summary, computed from given per-item times and apply windows (pure: no Ray)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks.rollout_latency import Window, fill_end, groups, per_rollout, summarise, windows_of

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


def test_the_fill_ends_when_the_items_held_stop_growing():
    # a burst of 20 reads in the first 2 s fills the pipeline; from then on one item is read as one is done
    read = np.concatenate([np.arange(20) * 0.1, 2.0 + np.arange(20)])
    done = np.concatenate([2.0 + np.arange(20), 22.0 + np.arange(20)])
    assert fill_end(read, done) == pytest.approx(2.0)
    assert np.flatnonzero(groups(read, done, [])["fill"]).tolist() == list(range(20))


def test_items_are_sorted_into_fill_steady_during_rollout_and_other_applies():
    #                 fill ....................  steady rollout rollout other  lost
    read = np.array([0.0, 0.0, 0.0, 0.0, 10.0, 20.0, 30.0, 40.0, 50.0])
    done = np.array([60.0, 61.0, 62.0, 63.0, 15.0, 28.0, 35.0, 45.0, NAN])
    windows = [Window(26.0, 32.0, True), Window(44.0, 46.0, False)]
    assert fill_end(read, done) == pytest.approx(5.0)  # 4 items held from the start, then as many until the first is done at 15
    g = groups(read, done, windows)
    assert {name: np.flatnonzero(mask).tolist() for name, mask in g.items()} == \
        {"fill": [0, 1, 2, 3], "during_rollout": [5, 6], "during_other_apply": [7], "steady": [4]}
    summary = summarise(read, done, done + 1.0, windows, items_lost=1)
    assert summary["rollouts"] == 1 and summary["other_applies"] == 1
    assert summary["latency_s_p50_steady"] == summary["latency_s_p99_steady"] == pytest.approx(5.0)
    assert summary["latency_s_p50_during_rollout"] == pytest.approx(6.5)
    assert summary["latency_s_p99_during_rollout"] == pytest.approx(np.percentile([8.0, 5.0], 99))
    assert summary["p99_during_rollout_over_steady"] == pytest.approx(np.percentile([8.0, 5.0], 99) / 5.0)
    assert summary["p50_during_rollout_over_steady"] == pytest.approx(1.3)
    assert summary["commit_latency_s_p99_steady"] == pytest.approx(6.0)
    assert (summary["items_fill"], summary["items_steady"], summary["items_during_rollout"], summary["items_during_other_apply"]) == (4, 1, 2, 1)
    assert summary["items_lost"] == 1
    # by completion: only the item done inside the rolling update's window is during it
    by_completion = summary["by_completion"]
    assert (by_completion["items_steady"], by_completion["items_during_rollout"], by_completion["items_during_other_apply"]) == (2, 1, 1)
    assert by_completion["latency_s_p99_steady"] == pytest.approx(5.0) and by_completion["latency_s_p99_during_rollout"] == pytest.approx(8.0)
    assert by_completion["p99_during_rollout_over_steady"] == pytest.approx(1.6)
    rollout = per_rollout(read, done, windows, t0=0.0)
    assert rollout == [{"start_s": 26.0, "seconds": 6.0, "steps": [], "dip": 0.0, "reason": "",
                        "in_flight_items": 2, "in_flight_latency_s_p99": pytest.approx(np.percentile([8.0, 5.0], 99)),
                        "done_before_items": 1, "done_before_latency_s_p99": pytest.approx(5.0),
                        "done_during_items": 1, "done_during_latency_s_p99": pytest.approx(8.0),
                        "done_after_items": 2, "done_after_latency_s_p99": pytest.approx(5.0)}]  # the fill items done at 60-62 left out


def test_without_rolling_updates_the_during_figures_are_none():
    read = np.array([0.0, 1.0, 2.0, 3.0])
    done = np.array([1.0, 2.0, 4.0, 5.0])
    summary = summarise(read, done, np.full(4, NAN), [], items_lost=0)
    assert summary["items_fill"] == 0 and summary["items_steady"] == 4
    assert summary["rollouts"] == 0 and summary["latency_s_p99_during_rollout"] is None
    assert summary["p99_during_rollout_over_steady"] is None and summary["commit_latency_s_p99_steady"] is None
    assert summary["latency_s_p99_steady"] == pytest.approx(np.percentile([1.0, 1.0, 2.0, 2.0], 99))
