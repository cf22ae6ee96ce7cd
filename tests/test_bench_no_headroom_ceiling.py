"""``bench no-headroom-ceiling``'s arithmetic (pure): when fixed work is done at growing capacity, and when an
operator's work does not depend on its configuration."""

from __future__ import annotations

import math

import pytest

from benchmarks.no_headroom_ceiling import cost_ratio, finish_bound_s
from trident_flows.runtime.costmodel import DeviceCost


def test_fixed_work_finishes_in_the_phase_where_the_capacity_has_done_it():
    # 10 units: 1/s from t=5 (5 done by t=10), then 2/s: the other 5 take 2.5 s
    assert finish_bound_s(10.0, [(5.0, 1.0), (10.0, 2.0)]) == pytest.approx(12.5)
    assert finish_bound_s(3.0, [(5.0, 1.0), (10.0, 2.0)]) == pytest.approx(8.0)  # done before more capacity comes
    assert finish_bound_s(1.0, [(0.0, 0.0)]) == math.inf


def test_work_is_fixed_only_without_per_batch_costs_and_with_one_cost_ratio():
    gpu = DeviceCost(per_item_s=0.004, per_unit_s={"chunks": 0.0025})
    cpu = DeviceCost(per_item_s=0.08, per_unit_s={"chunks": 0.05})
    ratios, why = cost_ratio({"cpu": cpu, "gpu": gpu}, "gpu")
    assert why == "" and ratios == {"cpu": pytest.approx(20.0), "gpu": 1.0}
    ratios, why = cost_ratio({"cpu": DeviceCost(per_item_s=0.08, per_unit_s={"chunks": 0.01}), "gpu": gpu}, "gpu")
    assert ratios is None and "not one multiple" in why
    ratios, why = cost_ratio({"cpu": DeviceCost(per_item_s=0.08, per_batch_s=0.01), "gpu": gpu}, "gpu")
    assert ratios is None and "per-batch cost" in why
