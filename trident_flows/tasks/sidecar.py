"""Task functions of the ``trident-sidecar`` flow: one tick is observe -> pull samples ->
fit and decide -> roll out, each a task run.

Contract:
- ``observe_pipeline`` finds the runner by name in the Ray cluster and returns its state (or
  None when no such runner runs); ``pull_samples`` returns the batch samples since the
  sidecar's cursor; ``decide`` runs the configured policy (fit models, detect the regime,
  optimise, solve the placement: whatever the policy does) and returns a ``Plan`` or None
  with the sidecar's updated memory; ``apply_plan`` hands the plan to the runner, which rolls
  it out, and returns its ``ApplyReport``.
- The policy is built once per runner and policy settings with ``make_policy(name, spec=the
  runner's PipelineSpec, cluster=the cluster capped by the CPU/GPU budgets, **options)``; it
  lives on between ticks (and between flow runs) in the sidecar's memory.
- ``plan_rows`` is a pure function: one table row per operator with what it ran before, what
  the plan asks for, the change and the plan's reason for it.
"""

from __future__ import annotations

from typing import Any, Optional

import ray
from prefect import task
from prefect.cache_policies import NO_CACHE

from trident_flows.scheduler.types import ClusterSpec, Plan
from trident_flows.tasks.sidecar_state import SidecarMemory


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


def memory_key(rid: str, policy: str, options: dict[str, Any]) -> str:
    """Which runner and policy settings a memory belongs to (a change starts the policy afresh)."""
    return f"{rid}|{policy}|{sorted(options.items())}"


def _new_policy(runner_name: str, namespace: str, policy: str, options: dict[str, Any], state: Any) -> Any:
    from trident_flows.scheduler.policies import make_policy

    runner = _runner(runner_name, namespace)
    if runner is None:
        raise RuntimeError(f"pipeline runner {runner_name!r} disappeared from namespace {namespace!r}")
    spec = ray.get(runner.pipeline_spec.remote())
    cpus = min(state.cluster_cpus, options.get("cpu_budget") or state.cluster_cpus)
    gpu_budget = options.get("gpu_budget")
    gpus = state.cluster_gpus if gpu_budget is None else min(state.cluster_gpus, gpu_budget)
    return make_policy(policy, spec=spec, cluster=ClusterSpec.single_node(cpus, int(gpus)), **options)


def decision_reason(policy: Any) -> str:
    """Why the policy's last decision was what it was, when the policy records it (the Trident
    controller's ``last_record``, the baselines' ``last``); "" otherwise."""
    for attr in ("last_record", "last"):
        reason = getattr(getattr(policy, attr, None), "reason", "")
        if reason:
            return str(reason)
    return ""


@task(name="fit-and-decide", cache_policy=NO_CACHE)
def decide(runner_name: str, namespace: str, key: str, policy: str, options: dict[str, Any], state: Any, page: Any,
           memory: Optional[SidecarMemory]) -> tuple[Optional[Plan], str, SidecarMemory]:
    """Run the policy on the state and the new samples; return its plan, its reason and the updated memory."""
    if memory is None or memory.key != key:
        memory = SidecarMemory.fresh(key, _new_policy(runner_name, namespace, policy, options, state))
    controller = memory.policy()
    plan = controller.decide(state, list(page.samples))
    return plan, decision_reason(controller), memory.after_tick(controller, page.next)


@task(name="roll-out", cache_policy=NO_CACHE)
def apply_plan(runner_name: str, namespace: str, plan: Plan) -> Any:
    """Hand the plan to the runner (rolling update) and return its ``ApplyReport``."""
    runner = _runner(runner_name, namespace)
    if runner is None:
        raise RuntimeError(f"pipeline runner {runner_name!r} disappeared from namespace {namespace!r}")
    return ray.get(runner.apply.remote(plan))


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
    if report is None and note:
        outcome = note
    rows = []
    for op_plan in plan.operators:
        before, planned = _current(state, op_plan.operator), _planned(op_plan)
        rows.append({"operator": op_plan.operator, "before": before, "planned": planned, "change": "yes" if before != planned else "no",
                     "reason": op_plan.reason or plan.reason, "rollout": outcome})
    return rows
