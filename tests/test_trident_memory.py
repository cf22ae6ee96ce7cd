"""Trident's memory across runs: plain JSON that round-trips, atomic writes, and a cold start (with one line) for anything off."""

from __future__ import annotations

import json
from pathlib import Path

from builders import batch_sample

from trident_flows.core.types import BatchSample, ClusterSpec, OpConfig, Outcome
from trident_flows.pipelines.emulated import Stage, emulated_pipeline
from trident_flows.runtime.costmodel import PipelineProfile
from trident_flows.scheduler.trident.memory import MAX_SAMPLES, PipelineIdentity, RegimeEntry, TridentMemory, load, memory_of, merged, same_regime, save

CPU4, GPU8 = OpConfig.make("cpu", batch_size=4), OpConfig.make("gpu", batch_size=8)


def _pipeline(name: str = "docs", profile: str = "documents") -> PipelineIdentity:
    loaded = PipelineProfile.load(profile)
    stages = [Stage(op.name, CPU4, 1) for op in loaded.operators]
    return PipelineIdentity.of(emulated_pipeline(loaded, stages, name=name, items=10, regimes=None, seed=0))


def _sample(op: str, k: int, outcome: Outcome = Outcome.OK) -> BatchSample:
    return batch_sample(operator=op, replica_id=f"r{k}", config=CPU4, start=float(k), end=k + 0.5, busy_s=0.4, items_in=4,
                        features={"pages": 8.0}, peak_host_mem_bytes=1000, outcome=outcome)


def _memory(pipeline: PipelineIdentity, cpus: int = 16, gpus: int = 0) -> TridentMemory:
    regime = RegimeEntry({"pages": 2.0, "scanned_pages": 0.0}, {"ocr": ((CPU4, 2),), "embed": ((CPU4, 10),)}, 30.0)
    return memory_of(pipeline, ClusterSpec.single_node(cpus, gpus), {"ocr": [_sample("ocr", k) for k in range(3)] + [_sample("ocr", 9, Outcome.OOM)]},
                     {"ocr": {"cpu": 1.5}}, [regime])


def test_a_memory_round_trips_through_its_file_as_plain_json(tmp_path: Path):
    pipeline = _pipeline()
    memory = _memory(pipeline)
    uri = str(tmp_path / "out" / "trident-memory.json")
    save(memory, uri)
    data = json.loads(Path(uri).read_text())
    assert data["schema"] == "trident-memory" and data["version"] == 1
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["trident-memory.json"]  # the temporary object was moved
    found = load(uri, pipeline, ClusterSpec.single_node(16, 0))
    assert found.warning is None and found.memory == memory
    assert found.memory.operators["ocr"].samples[-1].outcome is Outcome.OOM  # where memory ran out is remembered


def test_no_memory_yet_is_a_cold_start_without_a_warning(tmp_path: Path):
    found = load(str(tmp_path / "none.json"), _pipeline(), ClusterSpec.single_node(16, 0))
    assert found.memory is None and found.warning is None


def test_a_corrupt_or_foreign_memory_is_a_cold_start_with_one_line(tmp_path: Path):
    pipeline = _pipeline()
    cluster = ClusterSpec.single_node(16, 0)
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text('{"schema": "trident-memory", "version": 1, "pipel')
    found = load(str(corrupt), pipeline, cluster)
    assert found.memory is None and "unreadable" in found.warning and "\n" not in found.warning
    future = tmp_path / "future.json"
    future.write_text(json.dumps({**_memory(pipeline).to_data(), "version": 99}))
    found = load(str(future), pipeline, cluster)
    assert found.memory is None and "version 99" in found.warning
    malformed = tmp_path / "malformed.json"
    malformed.write_text(json.dumps({**_memory(pipeline).to_data(), "regimes": [{"signature": {}}]}))
    found = load(str(malformed), pipeline, cluster)
    assert found.memory is None and "malformed" in found.warning
    other = tmp_path / "other.json"
    save(_memory(_pipeline("videos", "video")), str(other))
    found = load(str(other), pipeline, cluster)
    assert found.memory is None and "another pipeline" in found.warning and "\n" not in found.warning


def test_a_memory_from_a_larger_cluster_keeps_its_measurements_and_rescales_its_allocations(tmp_path: Path):
    pipeline = _pipeline()
    uri = str(tmp_path / "m.json")
    big = _memory(pipeline, cpus=16)
    save(big, uri)
    found = load(uri, pipeline, ClusterSpec.single_node(2, 0))
    assert "16 CPUs" in found.warning and "2 / 0" in found.warning and "\n" not in found.warning
    assert found.memory.operators == big.operators  # per-replica measurements hold on any cluster
    (regime,) = found.memory.regimes
    assert regime.allocation == {"ocr": ((CPU4, 1),), "embed": ((CPU4, 1),)}  # 2 x 1/8 -> at least 1; 10 x 1/8 -> 1
    gpu_memory = memory_of(pipeline, ClusterSpec.single_node(16, 2), {}, {}, [RegimeEntry({"pages": 1.0}, {"embed": ((GPU8, 2),)}, 9.0)])
    save(gpu_memory, uri)
    found = load(uri, pipeline, ClusterSpec.single_node(16, 0))
    assert found.memory.regimes == () and "GPUs this cluster lacks" in found.warning


def test_the_next_run_keeps_the_newest_batches_and_counts_a_regime_seen_again():
    pipeline = _pipeline()
    first = _memory(pipeline)
    again = RegimeEntry({"pages": 2.2, "scanned_pages": 0.0}, {"ocr": ((CPU4, 3),)}, 31.0)
    new = RegimeEntry({"pages": 40.0, "scanned_pages": 40.0}, {"ocr": ((CPU4, 12),)}, 2.0)
    batches = [_sample("ocr", 100 + k) for k in range(MAX_SAMPLES)]
    second = memory_of(pipeline, ClusterSpec.single_node(16, 0), {"ocr": batches}, {"ocr": {"cpu": 2.0}}, [again, new])
    both = merged(first, second)
    assert both.runs == 2 and both.operators["ocr"].samples == tuple(batches) and both.operators["ocr"].cold_start_s == {"cpu": 2.0}
    assert [(r.seen, r.predicted_items_per_s) for r in both.regimes] == [(2, 31.0), (1, 2.0)]
    assert same_regime({"pages": 2.0}, {"pages": 2.4}) and not same_regime({"pages": 2.0}, {"pages": 40.0})
    assert merged(None, second) == second


def test_two_builds_of_the_documents_pipeline_are_one_pipeline_and_a_quality_change_is_another(tmp_path: Path):
    from trident_flows.pipelines.documents import build
    from trident_flows.pipelines.synth_documents import generate

    generate(tmp_path / "pdfs", n=4, regimes="short:4", seed=0)
    first, second = build(input=tmp_path / "pdfs"), build(input=tmp_path / "pdfs")
    assert first.operator("dedup").params != second.operator("dedup").params  # each run has its own near-duplicate index
    assert PipelineIdentity.of(first) == PipelineIdentity.of(second)
    stricter = build(input=tmp_path / "pdfs", quality={"ocr.dpi": 200})
    assert PipelineIdentity.of(stricter) != PipelineIdentity.of(first)
