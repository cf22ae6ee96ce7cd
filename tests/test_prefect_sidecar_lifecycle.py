"""A document-curation run that starts its own trident-sidecar: one sidecar subflow run per
curation run, ended when the pipeline ends; one task run and one event per decision (applied or
refused), the events related to the curation run; ticks that only observe leave no task run;
the decisions and live view are artifacts of the curation run; each shard task run logs its
counts; the flow says how it got its Ray cluster."""

from __future__ import annotations

import json
import re
import time

import pytest

from trident_flows.blocks import TridentSettingsBlock
from trident_flows.core.decision import Decision
from trident_flows.core.types import OperatorPlan, Plan, ReplicaGroup
from trident_flows.flows.document_curation import document_curation
from trident_flows.scheduler import policies

pytestmark = [pytest.mark.prefect, pytest.mark.ray]
RUNNER = "lifecycle-runner"


class GrowThenOverreach:
    """Test policy: first moves a CPU from the CPU operator with the most replicas to the busiest
    other CPU operator (the runner applies it), then asks for a replica holding 64 GPUs (the
    runner refuses it), then keeps the configuration."""

    name = "grow-then-overreach"

    def __init__(self, **_options):
        self.calls = 0

    def decide(self, state, samples):
        self.calls += 1
        cpu_ops = [(op, *next(iter(op.configs().items()))) for op in state.operators
                   if len(op.configs()) == 1 and next(iter(op.configs())).device == "cpu"]
        donor, donor_config, donor_count = max(cpu_ops, key=lambda t: t[2])
        taker, config, count = max((t for t in cpu_ops if t[0] is not donor), key=lambda t: (t[0].busy_fraction, t[0].queue_items))
        if self.calls == 1:
            return Decision.roll_out(Plan((OperatorPlan(donor.name, (ReplicaGroup(donor_config, donor_count - 1),), reason="most replicas"),
                                           OperatorPlan(taker.name, (ReplicaGroup(config, count + 1),), reason="bottleneck: +1 replica")),
                                          reason=f"T=1 input items/s, bottleneck {taker.name}"), f"bottleneck {taker.name}")
        if self.calls == 2:
            greedy = config.with_changes(device="gpu", gpus=64.0)
            return Decision.roll_out(Plan((OperatorPlan(taker.name, (ReplicaGroup(greedy, 1),), reason="overreach"),), reason="overreach"),
                                     "overreach")
        return Decision.no_change()


def _wait_for(read, ready, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while True:  # logs and events reach the server asynchronously
        value = read()
        if ready(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.5)


def test_curation_run_starts_its_own_sidecar_and_shows_its_decisions(prefect_harness, ray_cluster, tmp_path, monkeypatch,
                                                                     emulated_docs_time_scale):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterParentFlowRunId,
        LogFilter,
        LogFilterFlowRunId,
        LogFilterTaskRunId,
    )
    from prefect.events.filters import EventFilter, EventNameFilter, EventRelatedFilter

    monkeypatch.setitem(policies.POLICIES, "grow-then-overreach", f"{__name__}:GrowThenOverreach")
    # a fifth of the measured costs: the run lasts ~20 s after a ~4 s start, the policy decides in its first seconds
    emulated_docs_time_scale(0.2)
    trident = TridentSettingsBlock(policy="grow-then-overreach", min_new_samples=1, tick_interval_s=0.5)
    pipeline = {"pipeline": "emulated-docs", "synth": 80, "output_location": str(tmp_path / "out"), "shard_size": 20,
                "runner_name": RUNNER}
    state = document_curation(pipeline=pipeline, trident=trident, return_state=True)
    assert state.is_completed(), state.message
    assert state.result()["items_in"] == 80
    curation_id = state.state_details.flow_run_id

    with get_client(sync_client=True) as client:
        curation = client.read_flow_run(curation_id)
        sidecars = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["trident-sidecar"])),
                                         flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[curation_id])))
        assert len(sidecars) == 1  # one sidecar run per curation run, as its subflow
        sidecar = sidecars[0]
        assert sidecar.state.is_completed() and sidecar.name == f"tune {curation.name}"
        shard_runs = [t for t in client.read_task_runs(flow_run_filter=FlowRunFilter(id={"any_": [curation_id]}))
                      if t.name.startswith("curate shard-")]
        sidecar_task_runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id={"any_": [sidecar.id]}))
        # ended when the pipeline ended: after the last shard was committed, before the curation run ended
        assert sidecar.start_time >= curation.start_time
        assert max(t.end_time for t in shard_runs) <= sidecar.end_time <= curation.end_time

        sidecar_logs = _wait_for(lambda: client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[sidecar.id]))),
                                 lambda logs: any(log.message.endswith(": finished") for log in logs))
        assert any(log.message.endswith(": finished") for log in sidecar_logs)  # it saw the pipeline finish

        events = _wait_for(lambda: client.read_events(EventFilter(
            event=EventNameFilter(prefix=["trident.plan."]),
            related=EventRelatedFilter(id=[f"prefect.flow-run.{curation_id}"])), limit=50).events, lambda e: len(e) >= 2)
        by_name = {e.event: e for e in events}
        assert set(by_name) == {"trident.plan.applied", "trident.plan.refused"}
        applied = by_name["trident.plan.applied"]
        assert f"prefect.flow-run.{curation_id}" in {r.id for r in applied.related}
        sentence = re.fullmatch(r"(\w+) is the bottleneck: (\w+) (\d+) -> (\d+) replicas?, (\w+) (\d+) -> (\d+) replicas?",
                                applied.payload["decision"])
        assert sentence and sentence.group(1).lower() == sentence.group(5), applied.payload["decision"]  # the grown operator
        assert int(sentence.group(4)) == int(sentence.group(3)) - 1 and int(sentence.group(7)) == int(sentence.group(6)) + 1
        assert applied.payload["outcome"]["status"] == "applied"
        refused = by_name["trident.plan.refused"].payload["outcome"]
        assert refused["status"] == "refused" and refused["reason"].startswith("RuntimeConfigError: ") and "ray::" not in refused["reason"]

        artifacts = {a.key: a for a in client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[curation_id])))}
        decisions = json.loads(artifacts[f"trident-decisions-{RUNNER}"].data)
        assert [row["decision"] for row in decisions] == [e.payload["decision"] for e in sorted(events, key=lambda e: e.occurred)]
        assert decisions[0]["outcome"].startswith("applied") and decisions[1]["outcome"].startswith("refused")
        live = artifacts[f"trident-live-{RUNNER}"].data
        assert "The pipeline finished" in live and "| operator | items/s | queue | replicas | device |" in live
        assert "data:image/png;base64," in live

        logs = _wait_for(lambda: client.read_logs(log_filter=LogFilter(task_run_id=LogFilterTaskRunId(any_=[t.id for t in shard_runs]))),
                         lambda logs: sum("committed:" in log.message for log in logs) >= len(shard_runs))
        committed = sorted(log.message for log in logs if "committed:" in log.message)
        assert len(committed) == 4 and all("20 items in" in m and "kept" in m and "dead-lettered" in m for m in committed)
        flow_logs = [log.message for log in _wait_for(
            lambda: client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[curation_id]))),
            lambda logs: any(log.message.startswith("curated ") for log in logs))]
        assert any(m.startswith("using the Ray cluster this process is already connected to") for m in flow_logs)
        assert any(m.startswith("preparing 80 synthetic inputs") for m in flow_logs)
        ended = [re.match(r"trident-sidecar ended with the pipeline: (\d+) ticks, (\d+) decisions, (\d+) applied", m) for m in flow_logs]
        ticks, decided, applied_count = next(tuple(map(int, m.groups())) for m in ended if m)
        # task runs per tick bounded: one task run per decision, none for the ticks that only observed
        assert decided == 2 and applied_count == 1 and ticks > decided
        assert sorted(t.name for t in sidecar_task_runs) == sorted(row["decision"] for row in decisions)
