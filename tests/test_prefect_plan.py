"""The plan-cluster flow: it runs the planner and publishes the options table and the Pareto plot as
artifacts on its run, and returns the recommendation the CLI writes as JSON."""

from __future__ import annotations

import pytest

from trident_flows.flows.plan_cluster import plan_cluster_flow

pytestmark = [pytest.mark.prefect]


def _artifacts(flow_run_id):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        return client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))


def test_plan_cluster_publishes_its_table_and_plot(prefect_harness):
    state = plan_cluster_flow(items=100_000, regimes="short:500,scans:500", deadline_h=12, only=["c16", "c64"], simulate_top=1,
                              artifact_key="plan-test", return_state=True)
    assert state.is_completed(), state.message
    result = state.result()
    assert result["predicted_hours"] <= 12 and set(result["recommended"]) <= {"c16", "c64"}
    artifacts = {a.key: a for a in _artifacts(state.state_details.flow_run_id)}
    table = artifacts["plan-test-options"].data
    rows = table if isinstance(table, list) else __import__("json").loads(table)
    assert rows[0]["option"] == "recommended" and rows[0]["items_per_s"] == pytest.approx(result["predicted_items_per_s"], rel=1e-3)
    markdown = artifacts["plan-test-pareto"].data
    assert "data:image/png;base64," in markdown and "Recommended" in markdown


def test_plan_cluster_refuses_an_unknown_node_class(prefect_harness):
    state = plan_cluster_flow(items=1000, regimes="short:1", deadline_h=5, only=["z9"], return_state=True)
    assert state.is_failed() and "unknown node class 'z9'" in state.message
