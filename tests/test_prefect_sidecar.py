"""The trident-sidecar flow against a running emulated pipeline on the shared Ray cluster, started
apart from it (the scheduled form): it finds the runner by name, pulls samples, decides, rolls
the plan out as one task run, publishes the decision as a table artifact (a plain sentence
first) and emits ``trident.plan.applied``; its memory survives between flow runs and a long
run ticks until the pipeline finishes."""

from __future__ import annotations

import json
import time

import pytest
import ray
from test_runtime_support import small_pipeline

from trident_flows.blocks import TridentSettingsBlock
from trident_flows.control.launch import start_runner
from trident_flows.core.decision import Decision
from trident_flows.core.state import ApplyStatus, RunnerSettings
from trident_flows.core.types import OperatorPlan, Plan, ReplicaGroup
from trident_flows.flows.trident_sidecar import PLAN_APPLIED, trident_sidecar
from trident_flows.scheduler import policies
from trident_flows.tasks.sidecar_state import load_memory

pytestmark = [pytest.mark.prefect, pytest.mark.ray]
NAMESPACE = "trident-tests"


class GrowBusiest:
    """Test policy: once, give the busiest operator one more replica of its current config."""

    name = "grow-busiest"

    def __init__(self, **_options):
        self.done = False
        self.told = []  # the outcomes the sidecar reported through observe_apply

    def observe_apply(self, plan, outcome):
        self.told.append((plan.operators[0].operator, outcome.status, outcome.steps_done))

    def decide(self, state, samples):
        if self.done:
            return Decision.no_change()
        self.done = True
        op = max(state.operators, key=lambda o: (o.busy_fraction, o.queue_items))
        (config, count), = op.configs().items()
        return Decision.roll_out(Plan((OperatorPlan(op.name, (ReplicaGroup(config, count + 1),), reason=f"{op.name} is the busiest operator"),),
                                      reason=f"grow {op.name}"), f"grow {op.name}")


@pytest.fixture
def grow_policy(monkeypatch):
    monkeypatch.setitem(policies.POLICIES, "grow-busiest", f"{__name__}:GrowBusiest")
    return TridentSettingsBlock(policy="grow-busiest", min_new_samples=1, tick_interval_s=0.2)


def _start(name, n, out):
    spec = small_pipeline(n, time_scale=8.0)
    runner = start_runner(spec, out / name, name=name, namespace=NAMESPACE, settings=RunnerSettings(shard_items=64))
    deadline = time.monotonic() + 60
    while not ray.get(runner.samples.remote(0)).samples:
        assert time.monotonic() < deadline, "the pipeline produced no batch samples"
        time.sleep(0.2)
    return runner


def _stop(runner):
    ray.get(runner.stop.remote())
    ray.kill(runner)


def _read_back(flow_run_id, runner_name):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]), key=ArtifactFilterKey(any_=[f"trident-decisions-{runner_name}"])))
        deadline = time.monotonic() + 30
        while True:  # events are persisted asynchronously by the server
            events = client.read_events(EventFilter(event=EventNameFilter(name=[PLAN_APPLIED]),
                                                    resource=EventResourceFilter(id=[f"trident.pipeline.{NAMESPACE}.{runner_name}"])), limit=50)
            if events.events or time.monotonic() > deadline:
                return artifacts, events.events
            time.sleep(0.5)


def test_sidecar_applies_a_plan_and_publishes_it(prefect_harness, ray_cluster, grow_policy, tmp_path):
    runner = _start("sidecar-apply", 1500, tmp_path)
    try:
        before = {o.name: len(o.active) for o in ray.get(runner.state.remote()).operators}
        state = trident_sidecar(trident=grow_policy, runner_name="sidecar-apply", return_state=True)
        assert state.is_completed(), state.message
        result = state.result()
        assert result["status"] == "applied" and result["ticks"] == 1 and result["plans_applied"] == 1
        assert result["tuned_flow_run_id"] is None  # no document-curation run names this runner
        grown = result["last"]["plan"]["operators"][0]["operator"]
        after = {o.name: len(o.active) for o in ray.get(runner.state.remote()).operators}
        assert after[grown] == before[grown] + 1

        artifacts, events = _read_back(state.state_details.flow_run_id, "sidecar-apply")
        assert len(artifacts) == 1  # on the sidecar's own run, as no tuned run is known
        (row,) = json.loads(artifacts[0].data)
        sentence = f"{grown[:1].upper() + grown[1:]} is the bottleneck: {grown} {before[grown]} -> {before[grown] + 1} replicas"
        assert row["decision"] == sentence and row["outcome"].startswith("applied in")
        assert len(events) == 1
        assert events[0].payload["decision"] == sentence
        assert events[0].payload["plan"]["operators"][0]["operator"] == grown
        assert events[0].payload["outcome"]["status"] == "applied"

        memory = load_memory("sidecar-apply", NAMESPACE)
        assert memory.ticks == 1 and memory.plans_applied == 1 and memory.cursor > 0
        assert memory.policy().told == [(grown, ApplyStatus.LANDED, 1)]  # the policy kept between runs was told its plan landed
        second = trident_sidecar(trident=grow_policy, runner_name="sidecar-apply")  # the next scheduled run
        assert second["status"] == "unchanged"  # the policy's state (done=True) came back from the cluster
        assert load_memory("sidecar-apply", NAMESPACE).ticks == 2
    finally:
        _stop(runner)
    assert trident_sidecar(trident=grow_policy, runner_name="sidecar-apply")["status"] == "no-pipeline"
    assert load_memory("sidecar-apply", NAMESPACE) is None  # the memory of a gone pipeline is dropped


def test_sidecar_long_run_with_the_trident_controller_ticks_until_the_pipeline_finishes(prefect_harness, ray_cluster, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, FlowRunFilter, FlowRunFilterId

    runner = _start("sidecar-long", 300, tmp_path)
    try:
        state = trident_sidecar(trident=TridentSettingsBlock(policy="trident", tick_interval_s=0.5, min_new_samples=4),
                                runner_name="sidecar-long", until_finished=True, return_state=True)
        final = ray.get(runner.state.remote())
    finally:
        _stop(runner)
    assert state.is_completed(), state.message
    result = state.result()
    assert result["status"] == "finished" and result["ticks"] >= 2
    assert final.finished and final.items_written + final.items_dead_lettered == 300 and not final.error
    with get_client(sync_client=True) as client:
        flow_run_id = state.state_details.flow_run_id
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
        task_runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    live = [a for a in artifacts if a.key == "trident-live-sidecar-long"]
    assert len(live) == 1 and "The pipeline finished" in live[0].data  # one live view, updated in place to the end
    assert len(task_runs) == result["decisions"] < result["ticks"]  # one task run per decision, none per tick
    assert load_memory("sidecar-long", NAMESPACE) is None
    # what only the policy can tell for the curation run's account, taken at the pipeline's end
    figures = result["account_figures"]
    assert figures.policy == "trident" and len(figures.record.decisions) == result["decisions"]
    assert len(figures.record.points) >= result["ticks"] and figures.record.points[-1].items_done == 300
    assert figures.estimate.items_per_s is not None or figures.estimate.note.startswith("no estimate: ")
