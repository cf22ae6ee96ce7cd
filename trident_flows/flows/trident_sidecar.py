"""The ``trident-sidecar`` flow: Trident ticks against a pipeline running on the same Ray cluster.

Contract:
- Finds the pipeline runner by name (``runner_name``) in the cluster's namespace. Each tick is
  a sequence of task runs: observe-pipeline -> pull-samples -> fit-and-decide -> roll-out (the
  last only when the policy returns a plan).
- Two ways to run it: as a scheduled deployment (``until_finished=False``: one tick per flow
  run; the policy's state and the sample cursor live in a detached Ray actor between runs), or
  as one long run (``until_finished=True``: ticks every ``tick_interval_s`` until the pipeline
  finishes or ``max_ticks`` is reached).
- Every tick that decides publishes a table artifact (key ``trident-plan-<runner>``) with each
  operator's configuration before and after and the reason for every change (a scheduled run
  publishes one even when it only waits for samples); an applied plan also emits
  the Prefect event ``trident.plan.applied`` with the plan and the rollout report.
- When the runner is gone or finished, the sidecar's memory actor is removed.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Optional

import ray
from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.events import emit_event

from trident_flows.blocks import RayClusterBlock, TridentSettingsBlock
from trident_flows.tasks.sidecar import apply_plan, decide, memory_key, observe_pipeline, plan_rows, pull_samples
from trident_flows.tasks.sidecar_state import forget_memory, load_memory, save_memory

PLAN_APPLIED = "trident.plan.applied"


def policy_options(settings: TridentSettingsBlock) -> dict[str, Any]:
    """What the policy factory is given besides the policy name."""
    return {"memory_safety_margin": settings.memory_safety_margin, "cpu_budget": settings.cpu_budget,
            "gpu_budget": settings.gpu_budget, "max_changes": settings.max_reconfigurations_per_tick}


def _artifact_key(runner_name: str) -> str:
    return "trident-plan-" + "".join(c if c.isalnum() else "-" for c in runner_name.lower()).strip("-")


def _tick(runner_name: str, namespace: str, settings: TridentSettingsBlock, publish_waiting: bool = True) -> dict[str, Any]:
    """One observe -> pull -> decide -> roll-out tick; returns what happened. A tick that only
    waits for samples publishes no artifact unless ``publish_waiting``."""
    logger = get_run_logger()
    found = observe_pipeline(runner_name, namespace)
    if found is None:
        forget_memory(runner_name, namespace)
        return {"status": "no-pipeline"}
    rid, state = found
    if state.finished:
        forget_memory(runner_name, namespace)
        return {"status": "finished", "items_written": state.items_written}
    options = policy_options(settings)
    key = memory_key(rid, settings.policy, options)
    memory = load_memory(runner_name, namespace)
    since = memory.cursor if memory is not None and memory.key == key else 0
    page = pull_samples(runner_name, namespace, since)
    plan, report, note = None, None, ""
    waiting = len(page.samples) < settings.min_samples
    if waiting:
        note = f"waiting for samples: {len(page.samples)} new, a decision needs {settings.min_samples}"
    else:
        plan, reason, memory = decide(runner_name, namespace, key, settings.policy, options, state, page, memory)
        if plan is None:
            note = f"policy {settings.policy!r} kept the current configuration" + (f": {reason}" if reason else "")
        else:
            rollout = apply_plan(runner_name, namespace, plan, return_state=True)
            if rollout.is_completed():
                report = rollout.result()
                if report.ok and report.steps_done:
                    memory = replace(memory, plans_applied=memory.plans_applied + 1)
            else:
                note = f"the runner refused the plan: {rollout.message}"
        save_memory(runner_name, namespace, memory)
    rows = plan_rows(state, plan, report, note)
    applied = report is not None and report.ok and bool(report.steps_done)
    headline = plan.reason if plan is not None else note
    if not waiting or publish_waiting:
        create_table_artifact(rows, key=_artifact_key(runner_name),
                              description=f"Trident plan for {state.pipeline} ({settings.policy}): {headline}; "
                                          f"{state.throughput:.1f} items/s over {len(page.samples)} new samples")
    if applied:
        emit_event(PLAN_APPLIED, resource={"prefect.resource.id": f"trident.pipeline.{namespace}.{runner_name}",
                                           "prefect.resource.name": runner_name, "trident.pipeline": state.pipeline},
                   payload={"policy": settings.policy, "plan": plan.to_dict(), "report": report.to_dict(), "changes": rows})
        logger.info("applied plan: %s (%d steps, dip %.0f%%)", plan.reason, len(report.steps_done), 100 * report.dip)
    elif waiting:
        logger.debug("no decision: %s", note)
    else:
        logger.info("no change: %s", report.reason if report is not None and report.ok else (report.error if report else headline))
    failed = (report is not None and not report.ok) or (plan is not None and report is None)
    return {"status": "applied" if applied else ("failed" if failed else "unchanged"),
            "reason": headline, "samples": len(page.samples), "throughput": state.throughput,
            "plan": plan.to_dict() if plan is not None else None, "report": report.to_dict() if report is not None else None}


@flow(name="trident-sidecar", description="Trident ticks (observe, decide, roll out) against a running pipeline.")
def trident_sidecar(cluster: Optional[RayClusterBlock] = None, trident: Optional[TridentSettingsBlock] = None,
                    runner_name: str = "trident-runner", until_finished: bool = False, max_ticks: Optional[int] = None) -> dict[str, Any]:
    """Tick once (scheduled mode) or until the pipeline finishes (``until_finished``)."""
    logger = get_run_logger()
    cluster = cluster or RayClusterBlock()
    settings = trident or TridentSettingsBlock()
    connection = cluster.connect()
    ticks: list[dict[str, Any]] = []
    try:
        while True:
            result = _tick(runner_name, connection.namespace, settings, publish_waiting=not until_finished)
            if result["status"] in ("no-pipeline", "finished"):
                logger.info("pipeline runner %r in namespace %r: %s", runner_name, connection.namespace, result["status"])
                break
            ticks.append(result)
            if not until_finished or (max_ticks is not None and len(ticks) >= max_ticks):
                break
            time.sleep(settings.tick_interval_s)
    finally:
        if connection.started_by_us:
            ray.shutdown()
    return {"status": result["status"], "ticks": len(ticks), "plans_applied": sum(t["status"] == "applied" for t in ticks),
            "last": ticks[-1] if ticks else result}
