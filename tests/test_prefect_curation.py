"""The document-curation flow on Ray (prefect-ray): every input item is accounted for, the run is
followed by a progress artifact and summarised by a table artifact, and re-running it into the
same output location writes no duplicate rows."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import TEST_CPUS

import trident_flows.flows.document_curation as curation
from trident_flows.flows.document_curation import document_curation
from trident_flows.runtime.sink import read_ids

pytestmark = [pytest.mark.prefect, pytest.mark.ray]
STATIC = {"policy": "static"}  # these tests check the curation itself: the pipeline runs as configured, with no sidecar


def _artifacts(flow_run_id):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        return client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))


def _task_runs(flow_run_id):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        return client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))


@pytest.mark.models
def test_document_curation_accounts_for_every_item_and_reruns_idempotently(curated_documents):
    settings, state = curated_documents  # the clean run (8 documents, 3 shards, static), shared with test_flow_resume
    out = Path(settings["output_location"])
    assert state.is_completed(), state.message
    summary = state.result()
    assert summary["items_in"] == 8 and summary["shards"] == 3
    assert summary["kept"] + summary["near_duplicates"] + summary["filtered"] + summary["dead_lettered"] == 8
    assert summary["near_duplicates"] >= 1  # the synthetic corpus holds near-duplicates (10%)
    assert summary["duplicate_ids"] == 0
    data, dead = read_ids(out)
    assert len(data) + len(dead) == 8 and len(set(data) | set(dead)) == 8

    flow_run_id = state.state_details.flow_run_id
    shard_runs = [t for t in _task_runs(flow_run_id) if t.name.startswith("curate shard-")]
    assert sorted(t.name for t in shard_runs) == ["curate shard-00000", "curate shard-00001", "curate shard-00002"]
    assert all(t.state.is_completed() for t in shard_runs)
    artifacts = {a.key: a for a in _artifacts(flow_run_id)}
    assert artifacts["curation-curation-test-progress"].data == 100.0
    account = artifacts["curation-curation-test-account"].data
    assert "no decisions: the static policy never changes the configuration" in account and "data:image/png;base64," in account
    table = artifacts["curation-curation-test-summary"].data
    assert "kept" in table and "near-duplicates removed" in table

    again = document_curation(pipeline=settings, trident=STATIC)
    assert again["duplicate_ids"] == 0
    data2, dead2 = read_ids(out)
    assert sorted(data2) == sorted(data) and sorted(dead2) == sorted(dead)
    assert sum(pq.ParquetFile(p).metadata.num_rows for p in (out / "data").glob("*.parquet")) == len(data)


def test_trident_tunes_a_curation_run_unless_told_otherwise():
    """No ``trident`` settings: the run gets a sidecar under the Trident policy; ``policy="static"``: none."""
    import inspect

    from trident_flows.blocks import TridentSettingsBlock
    from trident_flows.scheduler.policies import DEFAULT_POLICY

    assert inspect.signature(document_curation.fn).parameters["trident"].default is None
    assert DEFAULT_POLICY == "trident" and curation.sidecar_settings(None).policy == "trident"
    given = TridentSettingsBlock(policy="ds2", tick_interval_s=2)
    assert curation.sidecar_settings(given) is given
    assert curation.sidecar_settings(TridentSettingsBlock(policy="static")) is None


def test_ray_workers_get_the_api_url_and_a_missing_server_is_refused():
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from trident_flows.flows.prefect_env import PrefectServerRequired, worker_env

    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:4200/api"}):
        assert worker_env()["PREFECT_API_URL"] == "http://127.0.0.1:4200/api"
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        with pytest.raises(PrefectServerRequired, match="PREFECT_API_URL is not set.*export PREFECT_API_URL="):
            worker_env()


def test_a_pipeline_larger_than_the_cluster_is_sized_to_its_nodes(prefect_harness, ray_cluster, tmp_path, monkeypatch,
                                                                   emulated_docs_time_scale):
    """A pipeline whose starting replicas need more CPUs than the cluster has runs sized to the
    live nodes (as ``trident-flows run`` does) instead of being refused, and the flow says where
    its replicas ran."""
    emulated_docs_time_scale(0.1)  # the sizing is the point, not the measured seconds of the emulated operators
    build = curation.build_pipeline

    def wide(name, **options):  # 8 OCR replicas of 1 CPU: 13 CPUs in all, on a cluster of TEST_CPUS
        spec = build(name, **options)
        return replace(spec, operators=tuple(replace(o, replicas=8) if o.name == "ocr" else o for o in spec.operators))

    spec = wide("emulated-docs", synth=1, work_dir=tmp_path / "probe")
    assert sum(o.config.cpus * o.replicas for o in spec.operators) > TEST_CPUS  # would be refused unsized
    monkeypatch.setattr(curation, "build_pipeline", wide)
    out = tmp_path / "curated"
    settings = {"pipeline": "emulated-docs", "synth": 12, "output_location": str(out), "shard_size": 6, "runner_name": "sized-test"}
    summary = curation.document_curation(pipeline=settings, trident=STATIC)
    assert summary["items_in"] == 12 and summary["duplicate_ids"] == 0
    data, dead = read_ids(out)
    assert len(data) + len(dead) == 12
    (node, ran), = summary["replicas_by_node"].items()  # the session's cluster is one node
    assert node == ray_cluster.get_runtime_context().get_node_id()
    # OCR gave up replicas until the pipeline fit the node's CPUs (the other operators hold one each)
    assert ran == {"parse": 1, "ocr": TEST_CPUS - 5, "langid": 1, "quality": 1, "dedup": 1, "embed": 1}
    # the run's account: a static run says it made no decision, and its timeline is written beside the output
    assert summary["decisions"] == [] and summary["decisions_note"] == "no decisions: the static policy never changes the configuration"
    assert summary["estimated_rate_without_trident"] is None and summary["timeline_png"] == str(out.resolve() / "timeline.png")
    assert (out / "timeline.png").read_bytes().startswith(b"\x89PNG")
