"""The cost model's reused working set (``reused_unit_bytes``): a batch holds it once, for its largest item, alike in
the cost model, the emulated operator and the simulator."""

from __future__ import annotations

import numpy as np
import pytest

from trident_flows.core.types import CPU, OpConfig
from trident_flows.pipelines.emulated import MEMORY_SCALE, EmulatedOperator
from trident_flows.runtime.costmodel import DeviceCost, OperatorCost, PipelineProfile
from trident_flows.runtime.spec import ID
from trident_flows.sim.operator import SimOperator
from trident_flows.sim.workload import FEATURES, Stream

# a decoder: 1 kB per item, 10 B per second of output, and 2 B per pixel of one frame, reused item after item
COST = DeviceCost(per_item_bytes=1000, per_unit_bytes={"duration_s": 10.0}, reused_unit_bytes={"frame_pixels": 2.0},
                  resident_bytes=5)
ROWS = [{ID: "a", "duration_s": 4.0, "frame_pixels": 100.0}, {ID: "b", "duration_s": 2.0, "frame_pixels": 800.0},
        {ID: "c", "duration_s": 6.0, "frame_pixels": 300.0}]


def test_a_batch_holds_the_reused_working_set_once_for_its_largest_item():
    sums = {"duration_s": 12.0, "frame_pixels": 1200.0}
    assert COST.batch_bytes(3, sums, {"frame_pixels": 800.0}) == 3000 + 120 + 1600
    assert COST.batch_bytes(3, sums) == 3000 + 120 + 800  # a planner's mean item: 400 px
    assert COST.peak_bytes(3, sums, {"frame_pixels": 800.0}) == 5 + 4720
    assert DeviceCost(per_item_bytes=7).batch_bytes(2, {"frame_pixels": 9.0}) == 14  # no reused term: as before
    assert COST.feature_names() == ("duration_s", "frame_pixels")


def test_the_reused_term_survives_a_profile_round_trip_and_old_profiles_load_without_it():
    profile = PipelineProfile("p", (OperatorCost("decode", {CPU: COST}, features=("duration_s", "frame_pixels")),))
    assert PipelineProfile.from_dict(profile.to_dict()).operator("decode").device(CPU) == COST
    old = profile.to_dict()
    del old["operators"][0]["devices"][CPU]["reused_unit_bytes"]
    assert PipelineProfile.from_dict(old).operator("decode").device(CPU).reused_unit_bytes == {}


@pytest.mark.parametrize("scales", [None, (1.0, 1.0, 4.0)])
def test_the_emulated_operator_and_the_simulator_charge_the_same_bytes(scales):
    rows = [dict(r, **({MEMORY_SCALE: s} if scales else {})) for r, s in zip(ROWS, scales or (1.0,) * 3)]
    op_cost = OperatorCost("decode", {CPU: COST}, features=("duration_s", "frame_pixels"))
    live = EmulatedOperator(OpConfig.make(CPU), name="decode", cost=op_cost, time_scale=0.0)
    batch = {k: np.array([r[k] for r in rows]) for k in rows[0]}
    keep = np.ones(3, dtype=bool)
    work = live._work_bytes(batch, keep, 3, live.workload_features(batch))
    per_row = [s * (1000 + 10.0 * r["duration_s"]) for r, s in zip(ROWS, scales or (1.0,) * 3)]
    largest = max(s * 2.0 * r["frame_pixels"] for r, s in zip(ROWS, scales or (1.0,) * 3))
    assert work == int(sum(per_row) + largest)
    stream = Stream.from_rows(rows, ("duration_s", "frame_pixels"))
    taken = stream.take(3)
    sim = SimOperator(op_cost, stream.features)
    _, sim_bytes = sim.batch_cost(CPU, taken, taken[:, FEATURES:].sum(axis=0), stream.uniform_memory)
    assert sim_bytes == work
