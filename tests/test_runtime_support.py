"""Shared helpers of the runtime tests: a small test cost model (millisecond batches) and id checks.

These cost models are test fixtures, not measurements: they exist only to make pipelines of
a known shape run fast.
"""

from __future__ import annotations

import os
from pathlib import Path

from trident_flows.core.types import OpConfig
from trident_flows.pipelines.emulated import Stage, emulated_pipeline
from trident_flows.runtime.costmodel import DeviceCost, OperatorCost, PipelineProfile
from trident_flows.runtime.sink import read_ids

MIB = 2**20
TESTS = Path(__file__).resolve().parent


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a child Python process that imports the test modules (to register a test
    pipeline or benchmark): this process's, with tests/ and the checkout (its ``benchmarks`` package)
    first on PYTHONPATH, plus ``extra``."""
    path = os.pathsep.join(p for p in (str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def tiny_profile() -> PipelineProfile:
    return PipelineProfile(
        name="rt-test",
        operators=(
            OperatorCost("parse", {"cpu": DeviceCost(per_batch_s=0.002, per_item_s=0.001, per_unit_s={"pages": 0.0005})},
                         features=("pages",)),
            OperatorCost("filter", {"cpu": DeviceCost(per_item_s=0.0005)}, selectivity=0.8),
            OperatorCost("embed", {"cpu": DeviceCost(per_item_s=0.004),
                                   "gpu": DeviceCost(per_batch_s=0.002, per_item_s=0.0005, resident_bytes=100 * MIB,
                                                     per_item_bytes=10 * MIB, cold_start_s=0.05)}),
        ),
        workloads={"short": {"pages": 2.0}, "long": {"pages": 20.0}},
    )


def small_pipeline(n: int = 200, *, embed_device: str = "cpu", embed_batch: int = 8, replicas: int = 1, time_scale: float = 1.0,
                   stage_params: dict | None = None, regimes: str = "short:60,long:40"):
    stage_params = stage_params or {}
    embed_cfg = OpConfig.make(embed_device, batch_size=embed_batch)
    stages = [Stage("parse", OpConfig.make("cpu", batch_size=8), replicas, stage_params.get("parse", {})),
              Stage("filter", OpConfig.make("cpu", batch_size=16), 1, stage_params.get("filter", {})),
              Stage("embed", embed_cfg, 1, stage_params.get("embed", {}))]
    return emulated_pipeline(tiny_profile(), stages, name="rt-test", items=n, regimes=regimes, time_scale=time_scale)


def input_ids(spec) -> list[str]:
    return [row["id"] for row in spec.source()]


def assert_exactly_once(spec, out_dir: Path) -> tuple[list[str], list[str]]:
    """Every input id is in the data table or the dead-letter table, exactly once."""
    data, dead = read_ids(out_dir)
    assert len(data) == len(set(data)), "duplicate ids in the data table"
    assert not set(data) & set(dead), "ids both written and dead-lettered"
    assert sorted(data + dead) == sorted(input_ids(spec))
    return data, dead


def docs_test_profile() -> PipelineProfile:
    """A documents-shaped test cost model (six operators, embed on cpu and gpu), millisecond batches."""
    cpu = lambda per_item, **kw: {"cpu": DeviceCost(per_item_s=per_item, **kw)}  # noqa: E731
    return PipelineProfile(
        name="documents-test",
        operators=(
            OperatorCost("parse", cpu(0.0005, per_unit_s={"pages": 0.0002}), features=("pages",)),
            OperatorCost("ocr", cpu(0.0001, per_unit_s={"scanned_pages": 0.002}), features=("scanned_pages",)),
            OperatorCost("langid", cpu(0.0002)),
            OperatorCost("quality", cpu(0.0002), selectivity=0.9),
            OperatorCost("dedup", cpu(0.0003), selectivity=0.95),
            OperatorCost("embed", {"cpu": DeviceCost(per_item_s=0.003),
                                   "gpu": DeviceCost(per_batch_s=0.002, per_item_s=0.0002, resident_bytes=90 * MIB, per_item_bytes=MIB)}),
        ),
        workloads={"short": {"pages": 2.0, "scanned_pages": 0.0, "chars": 3000.0},
                   "long": {"pages": 25.0, "scanned_pages": 3.0, "chars": 60000.0},
                   "scans": {"pages": 4.0, "scanned_pages": 3.5, "chars": 2000.0}},
    )


def build(*, synth: int | None = None, seed: int = 0, regimes: str | None = None, **_):
    """A pipeline-registry entry for the CLI test (``trident_flows.pipelines`` contract)."""
    return small_pipeline(synth or 50, regimes=regimes or "short:30,long:20")
