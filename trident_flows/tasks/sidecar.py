"""Task functions of the ``trident-sidecar`` flow: one tick is observe -> pull samples ->
fit and decide -> roll out, each a task run.

Contract:
- ``observe_pipeline`` finds the runner by name in the Ray cluster and returns its state (or
  None when no such runner runs); ``pull_samples`` returns the batch samples since the
  sidecar's cursor; ``decide`` runs the configured policy (fit models, detect the regime,
  optimise, solve the placement: whatever the policy does) inside the sidecar's detached
  state actor and returns a ``Plan`` or None; ``apply_plan`` hands the plan to the runner,
  which rolls it out, and returns its ``ApplyReport``.
- ``plan_rows`` is a pure function: one table row per operator with what it ran before, what
  the plan asks for, the change and the plan's reason for it.
"""

from __future__ import annotations

from typing import Any, Optional

import ray
from prefect import task
from prefect.cache_policies import NO_CACHE

from trident_flows.scheduler.types import Plan
from trident_flows.tasks.sidecar_state import sidecar_state


def _runner(runner_name: str, namespace: str) -> Any | None:
    from trident_flows.runtime.launch import find_runner

    try:
        return find_runner(runner_name, namespace)
    except LookupError:
        return None


def runner_id(runner: Any) -> str:
    """A stable identity of one runner actor (a new run under the same name gets a new one)."""
    return runner._actor_id.hex()


@task(name="observe-pipeline", cache_policy=NO_CACHE)
def observe_pipeline(runner_name: str, namespace: str) -> Optional[tuple[str, Any]]:
    """(runner id, RunnerState) of the named runner, or None when none runs in ``namespace``."""
    runner = _runner(runner_name, namespace)
    if runner is None:
        return None
    return runner_id(runner), ray.get(runner.state.remote())


@task(name="pull-samples", cache_policy=NO_CACHE)
def pull_samples(runner_name: str, namespace: str, since: int) -> Any:
    """The runner's batch samples after sequence number ``since`` (a ``SamplePage``)."""
    runner = _runner(runner_name, namespace)
    if runner is None:
        raise RuntimeError(f"pipeline runner {runner_name!r} disappeared from namespace {namespace!r}")
    return ray.get(runner.samples.remote(since))


@task(name="fit-and-decide", cache_policy=NO_CACHE)
def decide(runner_name: str, namespace: str, rid: str, policy: str, options: dict[str, Any], state: Any, page: Any) -> Optional[Plan]:
    """Run the policy on the state and the new samples (in the sidecar's state actor)."""
    actor = sidecar_state(runner_name, namespace)
    return ray.get(actor.decide.remote(rid, policy, options, state, page.samples, page.next))


@task(name="roll-out", cache_policy=NO_CACHE)
def apply_plan(runner_name: str, namespace: str, plan: Plan) -> Any:
    """Hand the plan to the runner (rolling update) and return its ``ApplyReport``."""
    runner = _runner(runner_name, namespace)
    if runner is None:
        raise RuntimeError(f"pipeline runner {runner_name!r} disappeared from namespace {namespace!r}")
    report = ray.get(runner.apply.remote(plan))
    if report.ok and report.steps_done:
        ray.get(sidecar_state(runner_name, namespace).plan_applied.remote())
    return report


def _current(state: Any, operator: str) -> str:
    try:
        counts = state.operator(operator).configs(include_canary=True)
    except KeyError:
        return "-"
    return ", ".join(f"{n} x {cfg.label()}" for cfg, n in sorted(counts.items(), key=lambda kv: kv[0].label())) or "0"


def _planned(op_plan: Any) -> str:
    parts = [f"{g.replicas} x {g.config.label()}" + (f" on {g.node_class}" if g.node_class else "") for g in op_plan.groups if g.replicas]
    if op_plan.canary is not None:
        parts.append(f"canary {op_plan.canary.label()}")
    return ", ".join(parts) or "0"


def plan_rows(state: Any, plan: Optional[Plan], report: Any = None, note: str = "") -> list[dict[str, Any]]:
    """One row per operator: before, planned, changed?, reason (and the rollout's outcome)."""
    if plan is None:
        return [{"operator": op.name, "before": _current(state, op.name), "planned": _current(state, op.name), "change": "no",
                 "reason": note or "policy kept the current configuration"} for op in state.operators]
    outcome = ""
    if report is not None:
        outcome = (f"applied {len(report.steps_done)} step(s) in {report.seconds:.1f}s, dip {report.dip:.0%}" if report.ok
                   else f"apply failed: {report.error}") if report.steps_done or not report.ok else f"not rolled out: {report.reason}"
    rows = []
    for op_plan in plan.operators:
        before, planned = _current(state, op_plan.operator), _planned(op_plan)
        rows.append({"operator": op_plan.operator, "before": before, "planned": planned, "change": "yes" if before != planned else "no",
                     "reason": op_plan.reason or plan.reason, "rollout": outcome})
    return rows
