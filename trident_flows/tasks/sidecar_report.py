"""How the sidecar reports in Prefect, on the flow run of the pipeline it tunes.

Contract:
- ``find_curation_run(runner_name)``: the running ``document-curation`` flow run whose pipeline
  registers under ``runner_name`` (None when none); ``sidecar_run_of(curation_flow_run_id)``: the
  sidecar subflow run it started; ``related_of(flow_run_id)``: a decision event's related
  resources (the tuned flow run, its flow and deployment).
- ``emit_decision(...)``: one event per decision the runner was handed (``trident.plan.applied`` /
  ``.partial`` / ``.refused``), with sentence, figures, outcome and raw reason in its payload.
- ``emit_scale(...)`` / ``scale_row(...)``: a scale decision that changed the request to Ray's autoscaler
  as an event (``trident.scale.add`` / ``.give_back``: reason, nodes, predicted effect) and a row of the
  decisions table (a plan's columns).
- ``Publisher``: the ``trident-live-<runner>`` and ``trident-decisions-<runner>`` artifacts on the
  tuned run (else the sidecar's own), created once and updated in place.
"""

from __future__ import annotations

import json
import time
from typing import Any, Optional
from uuid import UUID

import httpx
from prefect.client.orchestration import get_client
from prefect.events import emit_event

from trident_flows.planning.scale import ScaleAction, ScaleDecision
from trident_flows.tasks.decision import Explanation, Outcome

CURATION_FLOW = "document-curation"
EVENTS = {"applied": "trident.plan.applied", "partial": "trident.plan.partial", "refused": "trident.plan.refused"}
SCALE_EVENT = "trident.scale.{action}"
PLAN_APPLIED = EVENTS["applied"]


def _key(prefix: str, runner_name: str) -> str:
    return prefix + "".join(c if c.isalnum() else "-" for c in runner_name.lower()).strip("-")


def _runner_name_of(parameters: dict[str, Any]) -> Optional[str]:
    pipeline = parameters.get("pipeline")
    if isinstance(pipeline, dict):
        return pipeline.get("runner_name", "trident-runner")
    return None


def find_curation_run(runner_name: str) -> Optional[str]:
    """The running document-curation flow run whose pipeline is named ``runner_name``, if any."""
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType
    from prefect.client.schemas.objects import StateType

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=[CURATION_FLOW])),
                                     flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING]))))
    for run in runs:
        if _runner_name_of(run.parameters) == runner_name:
            return str(run.id)
    return None


def sidecar_run_of(curation_flow_run_id: Any) -> Optional[str]:
    """The id of the trident-sidecar subflow run a document-curation run started (None without one)."""
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterParentFlowRunId

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["trident-sidecar"])),
                                     flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[curation_flow_run_id])))
    return str(runs[0].id) if runs else None


def related_of(flow_run_id: str) -> list[dict[str, str]]:
    """The tuned flow run, its flow and its deployment as related resources of an event."""
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(UUID(flow_run_id))
        flow = client.read_flow(run.flow_id)
        deployment = client.read_deployment(run.deployment_id) if run.deployment_id else None
    related = [{"prefect.resource.id": f"prefect.flow-run.{run.id}", "prefect.resource.role": "flow-run", "prefect.resource.name": run.name},
               {"prefect.resource.id": f"prefect.flow.{flow.id}", "prefect.resource.role": "flow", "prefect.resource.name": flow.name}]
    if deployment is not None:
        related.append({"prefect.resource.id": f"prefect.deployment.{deployment.id}", "prefect.resource.role": "deployment",
                        "prefect.resource.name": deployment.name})
    return related


def emit_decision(namespace: str, runner_name: str, pipeline: str, policy: str, explained: Explanation, outcome: Outcome,
                  plan: dict[str, Any], related: list[dict[str, str]]) -> Any:
    """The event of one decision (see the module docstring)."""
    return emit_event(EVENTS[outcome.status],
                      resource={"prefect.resource.id": f"trident.pipeline.{namespace}.{runner_name}", "prefect.resource.name": runner_name,
                                "trident.pipeline": pipeline},
                      related=related,
                      payload={"decision": explained.sentence, "outcome": outcome.to_dict(), "policy": policy,
                               "figures": explained.to_dict(), "plan": plan})


def _rounded(value: Optional[float], digits: int = 2) -> Any:
    """A figure of the decisions table: rounded, or ``-`` where there is none."""
    return "-" if value is None else round(value, digits)


def decision_row(explained: Explanation, outcome: Outcome, pipeline_time_s: float, unit: str) -> dict[str, Any]:
    """One row of the decisions table: the sentence first, then the figures."""
    return {"decision": explained.sentence, "outcome": outcome.text(),
            "time (UTC)": time.strftime("%H:%M:%S", time.gmtime(explained.at)), "pipeline time (s)": round(pipeline_time_s, 1),
            f"predicted before ({unit})": _rounded(explained.throughput_before),
            f"predicted after ({unit})": _rounded(explained.throughput_after),
            "gain": "-" if explained.gain is None else f"{explained.gain:+.0%}",
            "start-up (s)": _rounded(explained.startup_s, 0), "pays back in (s)": _rounded(explained.payback_s, 0)}


def _nodes(counts: dict[str, int]) -> str:
    return " + ".join(f"{n}x {c}" for c, n in counts.items() if n > 0) or "no worker node"


def scale_sentence(decision: ScaleDecision) -> str:
    """A scale decision in words: what is requested of the autoscaler, then why."""
    verb = "Request" if decision.action == ScaleAction.ADD else "Give back to"
    return f"{verb} Ray's autoscaler: {_nodes(dict(decision.counts))} held: {decision.reason}"


def emit_scale(namespace: str, runner_name: str, pipeline: str, decision: ScaleDecision, currency: str,
               related: list[dict[str, str]]) -> Any:
    """The event of one scale decision that changed the request (see the module docstring)."""
    return emit_event(SCALE_EVENT.format(action=decision.action.value),
                      resource={"prefect.resource.id": f"trident.pipeline.{namespace}.{runner_name}", "prefect.resource.name": runner_name,
                                "trident.pipeline": pipeline},
                      related=related, payload={"decision": scale_sentence(decision), "currency": currency, **decision.to_dict()})


def scale_row(decision: ScaleDecision, measured_items_per_s: Optional[float], startup_s: float, pipeline_time_s: float,
              unit: str) -> dict[str, Any]:
    """A scale decision's row of the decisions table (``decision_row``'s columns; the node start-up as the start-up)."""
    before, after = measured_items_per_s, decision.predicted_items_per_s
    return {"decision": scale_sentence(decision), "outcome": "requested of the autoscaler",
            "time (UTC)": time.strftime("%H:%M:%S", time.gmtime(decision.at)), "pipeline time (s)": round(pipeline_time_s, 1),
            f"predicted before ({unit})": _rounded(before), f"predicted after ({unit})": _rounded(after),
            "gain": f"{after / before - 1:+.0%}" if before else "-",
            "start-up (s)": _rounded(startup_s if decision.action == ScaleAction.ADD else None, 0), "pays back in (s)": "-"}


class Publisher:
    """Creates and updates the live-view and decisions artifacts of one tuned pipeline.

    Updates go straight to the API's PATCH: the client's ``update_artifact`` also emits an event per update,
    which would flood the Event Feed with one per tick. They are made at most every ``live_every_s`` seconds
    unless a decision or the pipeline's end forces one."""

    def __init__(self, runner_name: str, flow_run_id: Optional[str], live_every_s: float = 5.0) -> None:
        self.runner_name = runner_name
        self.flow_run_id = flow_run_id
        self.live_every_s = live_every_s
        self._last_live = -float("inf")

    def _put(self, artifact_id: Optional[str], key: str, kind: str, data: Any, description: str) -> str:
        from prefect.client.schemas.actions import ArtifactCreate, ArtifactUpdate

        with get_client(sync_client=True) as client:
            if artifact_id is not None:
                try:
                    client.request("PATCH", "/artifacts/{id}", path_params={"id": artifact_id},
                                   json=ArtifactUpdate(data=data, description=description).model_dump(mode="json", exclude_unset=True))
                    return artifact_id
                except httpx.HTTPStatusError:  # deleted in the UI meanwhile: create it again
                    pass
            created = client.create_artifact(ArtifactCreate(key=key, type=kind, data=data, description=description,
                                                            flow_run_id=UUID(self.flow_run_id) if self.flow_run_id else None))
        return str(created.id)

    def live(self, artifact_id: Optional[str], markdown: str, description: str, force: bool = False) -> Optional[str]:
        """Create or update the live view (throttled unless ``force``); returns its id."""
        if not force and artifact_id is not None and time.monotonic() - self._last_live < self.live_every_s:
            return artifact_id
        self._last_live = time.monotonic()
        return self._put(artifact_id, _key("trident-live-", self.runner_name), "markdown", markdown, description)

    def decisions(self, artifact_id: Optional[str], rows: list[dict[str, Any]], description: str) -> str:
        """Create or update the decisions table; returns its id."""
        return self._put(artifact_id, _key("trident-decisions-", self.runner_name), "table", json.dumps(rows), description)
