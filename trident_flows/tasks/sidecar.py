"""What one sidecar tick does against the pipeline runner: observe, pull samples, decide, roll out.

Contract:
- ``observe`` finds the runner by name in the Ray cluster and returns (runner id, state), or
  None when no such runner runs (or it went away mid-call); ``pull_samples`` returns the batch
  samples after the sidecar's cursor; ``pipeline_spec_of`` the PipelineSpec the runner started with; ``make_policy_for`` builds the configured policy once per
  runner and policy settings (``make_policy(name, spec=the runner's PipelineSpec, cluster=the
  cluster capped by the CPU/GPU budgets, **the other options)``).
- These are plain functions, not Prefect task runs: a tick that only observes leaves no trace
  in Prefect's database. ``roll_out`` is the one task run a tick can make: one per decision
  the policy hands to the runner, named after it, returning the ``Applied`` of the apply step
  (``loop.apply.apply_plan``: the runner's report and its ``ApplyOutcome``, which the flow's
  ``TickLoop`` hands to the policy); a runner that raises, or is gone, is a refusal, not a failed flow.
"""

from __future__ import annotations

from typing import Any, Optional

import ray
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from trident_flows.core.state import ApplyOutcome, ApplyReport
from trident_flows.core.types import ClusterSpec, Plan
from trident_flows.loop.apply import Applied, apply_plan
from trident_flows.tasks.decision import read_outcome


def _runner(runner_name: str, namespace: str) -> Any | None:
    from trident_flows.control.launch import find_runner

    try:
        return find_runner(runner_name, namespace)
    except LookupError:
        return None


def runner_id(runner: Any) -> str:
    """A stable identity of one runner actor (a new run under the same name gets a new one)."""
    return runner._actor_id.hex()


def observe(runner_name: str, namespace: str) -> Optional[tuple[str, Any]]:
    """(runner id, RunnerState) of the named runner, or None when none runs in ``namespace``."""
    runner = _runner(runner_name, namespace)
    if runner is None:
        return None
    try:
        return runner_id(runner), ray.get(runner.state.remote())
    except ray.exceptions.RayActorError:  # killed between the lookup and the call: the pipeline ended
        return None


def pull_samples(runner_name: str, namespace: str, since: int) -> Any:
    """The runner's batch samples after sequence number ``since`` (a ``SamplePage``)."""
    runner = _runner(runner_name, namespace)
    if runner is None:
        raise LookupError(f"pipeline runner {runner_name!r} disappeared from namespace {namespace!r}")
    return ray.get(runner.samples.remote(since))


def memory_key(rid: str, policy: str, options: dict[str, Any]) -> str:
    """Which runner and policy settings a memory belongs to (a change starts the policy afresh)."""
    return f"{rid}|{policy}|{sorted(options.items())}"


def pipeline_spec_of(runner_name: str, namespace: str) -> Any:
    """The PipelineSpec the named runner started with."""
    runner = _runner(runner_name, namespace)
    if runner is None:
        raise LookupError(f"pipeline runner {runner_name!r} disappeared from namespace {namespace!r}")
    return ray.get(runner.pipeline_spec.remote())


def output_note_of(runner_name: str, namespace: str) -> str:
    """The named runner's pipeline's note that outputs can differ by configuration ("" when no quality knob is tunable)."""
    from trident_flows.pipelines.quality import output_note

    try:
        return output_note(pipeline_spec_of(runner_name, namespace))
    except LookupError:
        return ""


# Options that cap the cluster a policy plans for rather than being options of the policy itself.
BUDGETS = ("cpu_budget", "gpu_budget")


def make_policy_for(runner_name: str, namespace: str, policy: str, options: dict[str, Any], state: Any) -> Any:
    """The policy ``policy`` for the named runner's pipeline on its cluster, within the budgets."""
    from trident_flows.scheduler.policies import make_policy

    runner = _runner(runner_name, namespace)
    if runner is None:
        raise LookupError(f"pipeline runner {runner_name!r} disappeared from namespace {namespace!r}")
    spec = ray.get(runner.pipeline_spec.remote())
    cpus = min(state.cluster_cpus, options.get("cpu_budget") or state.cluster_cpus)
    gpu_budget = options.get("gpu_budget")
    gpus = state.cluster_gpus if gpu_budget is None else min(state.cluster_gpus, gpu_budget)
    policy_options = {k: v for k, v in options.items() if k not in BUDGETS}
    return make_policy(policy, spec=spec, cluster=ClusterSpec.single_node(cpus, int(gpus)), **policy_options)


@task(name="roll-out", cache_policy=NO_CACHE)
def roll_out(runner_name: str, namespace: str, plan: Plan, sentence: str) -> Applied:
    """Hand one decision's plan to the runner (a rolling update) and return what became of it."""
    logger = get_run_logger()
    logger.info("%s", sentence)
    runner = _runner(runner_name, namespace)
    if runner is None:
        error = f"pipeline runner {runner_name!r} is gone from namespace {namespace!r}"
        applied = Applied(None, ApplyOutcome.refused(error), error)
    else:
        def apply(plan: Plan) -> ApplyReport:
            try:
                return ray.get(runner.apply.remote(plan))
            except ray.exceptions.RayError as exc:  # a plan the runner refuses, or a runner that went away
                raise (getattr(exc, "cause", None) or exc) from None  # the runner's own error, without Ray's task wrapper

        applied = apply_plan(apply, plan)
    logger.info("%s", read_outcome(applied.report, applied.error).text())
    return applied
