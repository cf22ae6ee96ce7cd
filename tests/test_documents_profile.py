"""The document cost-model profile: the fit, and the committed profiles/documents.json."""

from __future__ import annotations

import numpy as np

from trident_flows.pipelines.doc_rows import OPERATOR_NAMES
from trident_flows.pipelines.profile_documents import FEATURES, fit_linear
from trident_flows.runtime.costmodel import PipelineProfile


def test_fit_recovers_a_known_linear_cost():
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(30):
        items, pages = int(rng.integers(1, 16)), float(rng.integers(1, 200))
        seconds = 0.01 + 0.002 * items + 0.05 * pages + rng.normal(0, 1e-4)
        rows.append({"items": items, "features": {"pages": pages}, "s": seconds})
    per_batch, per_item, per_unit, r2 = fit_linear(rows, ("pages",), "s")
    assert abs(per_batch - 0.01) < 2e-3 and abs(per_item - 0.002) < 5e-4 and abs(per_unit["pages"] - 0.05) < 1e-4
    assert r2 > 0.999


def test_fit_never_returns_negative_costs():
    rows = [{"items": n, "features": {"chars": 100.0 * n}, "s": 1.0 - 0.01 * n} for n in range(1, 10)]
    per_batch, per_item, per_unit, _ = fit_linear(rows, ("chars",), "s")
    assert per_batch >= 0 and per_item >= 0 and per_unit["chars"] >= 0


def test_committed_profile_covers_every_operator_and_says_what_was_measured():
    profile = PipelineProfile.load("documents")
    assert tuple(o.name for o in profile.operators) == OPERATOR_NAMES
    for op in profile.operators:
        assert op.features == FEATURES[op.name]
        cpu = op.device("cpu")
        assert cpu.cold_start_s >= 0 and cpu.seconds(1, profile.workloads["long"]) > 0
    assert set(profile.workloads) == {"short", "long", "scans"}
    assert profile.workloads["scans"]["scanned_pages"] > profile.workloads["long"]["scanned_pages"]
    assert profile.workloads["long"]["chunks"] > profile.workloads["short"]["chunks"]
    ocr = profile.operator("ocr").device("cpu")
    assert ocr.seconds(1, profile.workloads["scans"]) > 10 * ocr.seconds(1, profile.workloads["short"])
    embed = profile.operator("embed")
    assert set(embed.devices) == {"cpu", "gpu"}
    # the gpu entry says whether it was measured, and says so truly: derived unless CUDA was there
    derived = "NOT measured" in embed.notes and "NOT measured" in profile.measured_on["gpu"]
    assert derived != bool(profile.measured_on["cuda"]), (profile.measured_on["cuda"], profile.measured_on["gpu"])
    assert all(k in profile.measured_on for k in ("machine", "date", "what", "fit"))
