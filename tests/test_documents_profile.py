"""The document cost-model profile: the fit, and the committed profiles/documents.json."""

from __future__ import annotations

import numpy as np
import pytest

from trident_flows.pipelines.doc_rows import OPERATOR_NAMES
from trident_flows.pipelines.profile_documents import FEATURES, fit_by_page_type, fit_linear
from trident_flows.pipelines.profile_measure import LoadWatch, PeakRss, run_load
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


def _ocr_rows(rng: np.random.Generator) -> list[dict]:
    """Batches of born-digital documents (OCR skipped: 1 ms per batch + 0.1 ms per page) and of documents with
    scanned pages (3 s each, +-30% noise per batch), as the OCR operator's samples."""
    rows = []
    for scanned_docs in (False, True):
        for items in (1, 2, 4, 1, 2, 4):
            pages = float(rng.integers(1, 4) * items)
            scanned = float(rng.integers(1, 5) * items) if scanned_docs else 0.0
            seconds = 0.001 + 0.0001 * pages + 3.0 * scanned * (1 + rng.uniform(-0.3, 0.3))
            rows.append({"items": items, "features": {"pages": pages + scanned, "scanned_pages": scanned}, "cpu_s": seconds})
    return rows


def test_page_type_fit_charges_born_digital_pages_what_skipping_costs():
    rows = _ocr_rows(np.random.default_rng(1))
    per_batch, per_item, per_unit, r2 = fit_by_page_type(rows, "cpu_s")
    born = [r for r in rows if r["features"]["scanned_pages"] == 0]
    skip = max(r["cpu_s"] for r in born)
    assert per_batch + per_item + per_unit["pages"] * 3 <= skip * 1.01  # a born-digital batch costs no more than skipping did
    assert abs(per_unit["scanned_pages"] - 3.0) < 0.3 and r2 > 0.9


def test_page_type_fit_never_returns_negative_costs():
    rows = [{"items": 1, "features": {"pages": 2.0, "scanned_pages": 0.0}, "cpu_s": 0.01},
            {"items": 1, "features": {"pages": 2.0, "scanned_pages": 1.0}, "cpu_s": 0.0}]
    per_batch, per_item, per_unit, _ = fit_by_page_type(rows, "cpu_s")
    assert min(per_batch, per_item, *per_unit.values()) >= 0


def test_the_rss_sampler_counts_its_own_cpu_seconds():
    import time

    with PeakRss() as peak:
        time.sleep(0.3)
    assert peak.peak > 0 and 0 < peak.cpu_s < 0.3


def test_a_run_records_the_load_it_was_measured_at():
    with LoadWatch(interval_s=0.01) as watch:
        import time

        time.sleep(0.05)
    load = run_load(watch, {"ALONE": "1", "ALONE_LOAD_BEFORE": "0.42"})
    assert load["before"] == 0.42 and load["before_from"] == "ALONE_LOAD_BEFORE" and load["alone"] is True
    assert load["during"]["samples"] >= 1 and load["during"]["max"] >= load["during"]["median"] >= 0
    assert run_load(watch, {})["before_from"] == "getloadavg" and run_load(watch, {})["alone"] is False


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


@pytest.mark.parametrize("name", ["documents", "documents-rapidocr"])
def test_committed_ocr_costs_born_digital_pages_what_skipping_costs(name: str):
    profile = PipelineProfile.load(name)
    ocr = profile.operator("ocr")
    assert ocr.features == FEATURES["ocr"]
    short, scans = profile.workloads["short"], profile.workloads["scans"]
    for device, cost in ocr.devices.items():
        born_batch = cost.seconds(16, {f: 16 * v for f, v in short.items()})  # 16 born-digital documents: OCR skipped
        assert born_batch < 0.05 * cost.seconds(1, scans), (name, device, born_batch)
        assert cost.per_unit_s["pages"] < 0.01 * cost.per_unit_s["scanned_pages"], (name, device)


@pytest.mark.parametrize("name", ["documents", "documents-rapidocr"])
def test_committed_profile_records_machine_load_and_inputs(name: str):
    measured = PipelineProfile.load(name).measured_on
    load = measured["load"]
    assert load["before"] < load["cpus"] and not load["overloaded"], load  # measured on a quiet machine
    assert load["during"]["samples"] >= 1 and load["during"]["median"] is not None
    assert {"short", "long", "scans"} <= set(measured["corpus"])
    assert sum(r["scanned_pages"] for r in measured["corpus"].values()) > 0
    assert "ocr/cpu" in measured["entries"]
    for entry in measured["entries"].values():
        assert entry["machine"] and entry["date"] and entry["load_before"] >= 0 and entry["load_during"]["samples"] >= 1
        assert entry["inputs"] and all(r["batches"] >= 1 for r in entry["inputs"].values())
    by_page = measured["ocr_seconds_by_page_type"]
    cpu = by_page["cpu"] if "cpu" in by_page else by_page
    assert cpu["born_digital_page_s"] < 0.01 * cpu["scanned_page_s"]
