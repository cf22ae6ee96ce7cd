"""The video cost model: the fit, the committed profile's contract, and the emulated video pipeline built from it."""

from __future__ import annotations

import numpy as np
import pytest

from trident_flows.core.types import CPU, GPU
from trident_flows.pipelines import emulated_video
from trident_flows.pipelines.profile_video import FEATURES, MODEL_OPS, fit
from trident_flows.runtime.costmodel import PipelineProfile
from trident_flows.runtime.spec import ERROR, ID, SOURCE_ID, rows_to_batch


def test_fit_recovers_a_linear_cost_and_reports_its_error():
    rng = np.random.default_rng(0)
    points = []
    for items in (1, 2, 4, 8):
        for _ in range(3):
            pixels = items * rng.uniform(1e5, 1e6)
            points.append({"items": items, "features": {"pixels": pixels, "duration_s": items * 3.0},
                           "cpu_s": 0.05 + 0.01 * items + 2e-7 * pixels, "peak_bytes": 1000 * items + 3.0 * pixels})
    coef, wape_s, wape_m = fit(points, (("pixels",), ("pixels",)))
    assert coef["per_batch_s"] == pytest.approx(0.05, rel=1e-3)
    assert coef["per_item_s"] == pytest.approx(0.01, rel=1e-3)
    assert coef["per_unit_s"]["pixels"] == pytest.approx(2e-7, rel=1e-3)
    assert coef["per_unit_bytes"]["pixels"] == pytest.approx(3.0, rel=1e-3)
    assert wape_s < 1e-6 and wape_m < 1e-6
    noisy = [dict(p, cpu_s=p["cpu_s"] * (1.5 if k % 2 else 0.5)) for k, p in enumerate(points)]
    assert fit(noisy, (("pixels",), ("pixels",)))[1] > 0.2


@pytest.fixture(scope="module")
def profile() -> PipelineProfile:
    return PipelineProfile.load("video")


def test_committed_profile_is_measured_and_says_what_is_derived(profile):
    names = [o.name for o in profile.operators]
    assert names == list(emulated_video.OPERATORS) and set(MODEL_OPS) < set(names)
    assert profile.measured_on["date_utc"] and profile.measured_on["cores"] >= 1
    for op in profile.operators:
        cpu = op.device(CPU)
        assert cpu.seconds(1, profile.workloads["long"]) > 0, op.name
        assert cpu.resident_bytes > 0
        assert set(op.features) == set(FEATURES[op.name][0] + FEATURES[op.name][1])
        if op.name in MODEL_OPS:
            assert "DERIVED, NOT MEASURED" in op.notes
            assert op.device(GPU).seconds(4, profile.workloads["long"]) < cpu.seconds(4, profile.workloads["long"])
        else:
            assert GPU not in op.devices
    assert profile.operator("scenes").selectivity > 1.0


def test_regimes_differ_where_the_paper_says_they_do(profile):
    small, hd, long = (profile.workloads[r] for r in ("small", "hd", "long"))
    assert hd["pixels"] / hd["frames"] > 4 * small["pixels"] / small["frames"]  # resolution
    assert long["duration_s"] > 3 * max(small["duration_s"], hd["duration_s"])  # length
    decode = profile.operator("decode").device(CPU)
    assert decode.seconds(1, hd) > decode.seconds(1, small)
    for regime in profile.workloads.values():  # every operator's features reach it through the stream
        assert all(f in regime for op in profile.operators for f in op.features)


def test_emulated_video_pipeline_splits_and_accounts_for_every_video(profile):
    spec = emulated_video.build(synth=12, seed=1, profile=profile, time_scale=1e-4)
    assert [o.name for o in spec.operators] == list(emulated_video.OPERATORS)
    assert {o.name for o in spec.operators if o.config.device == GPU} == set(MODEL_OPS)
    assert sum(o.replicas for o in spec.operators) == 8
    rows = list(spec.source())
    assert len(rows) == 12 and {r["regime"] for r in rows} == {"small", "hd", "long"}
    batch = rows_to_batch(rows)
    for op in spec.operators:  # in-process, on CPU (GPU replicas need the runtime's emulated devices)
        batch = op.build(op.config.with_changes(device=CPU, gpus=0.0))(batch)
    ids = [str(i) for i in batch[ID]]
    assert len(ids) == len(set(ids)) and len(ids) > len(rows)
    assert {str(s) for s in batch[SOURCE_ID]} == {r[ID] for r in rows}
    assert all(i.startswith(f"{s}/") for i, s in zip(ids, batch[SOURCE_ID]))
    assert not any(batch[ERROR])


def test_emulated_video_refuses_input_files():
    with pytest.raises(ValueError, match="--synth"):
        emulated_video.build(input="videos/")
