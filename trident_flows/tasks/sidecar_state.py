"""The sidecar's memory between flow runs: a named, detached Ray actor per pipeline runner.

Contract:
- ``sidecar_state(runner_name, namespace)`` returns the actor ``trident-sidecar-<runner_name>``
  in ``namespace``, creating it when missing; it outlives the flow run that created it, so a
  scheduled sidecar deployment (one tick per run) keeps the policy's state and the sample
  cursor in the Ray cluster.
- The actor holds one policy instance for one runner: when the runner (by actor id) or the
  policy settings change, it starts afresh, building the policy with the runner's
  ``PipelineSpec`` and a ``ClusterSpec`` of the cluster capped by the CPU/GPU budgets.
  ``decide`` runs the policy on the runner's state and the new samples and advances the
  cursor; the decision is returned, never applied here.
- ``forget_sidecar_state`` kills the actor (the pipeline finished or is gone).
No Prefect import: this is Ray code the Prefect tasks call.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import ray

from trident_flows.scheduler.types import BatchSample, ClusterSpec, Plan


def state_actor_name(runner_name: str) -> str:
    return f"trident-sidecar-{runner_name}"


class SidecarState:
    """Policy state, sample cursor and counters of the sidecar for one pipeline runner."""

    def __init__(self, runner_name: str, namespace: str) -> None:
        self._runner_name = runner_name
        self._namespace = namespace
        self._policy: Any = None
        self._key: tuple[Any, ...] | None = None
        self._cursor = 0
        self._ticks = 0
        self._plans_applied = 0

    def _ensure(self, runner_id: str, policy: str, options: Mapping[str, Any], state: Any) -> None:
        from trident_flows.scheduler.policies import make_policy

        key = (runner_id, policy, tuple(sorted(options.items())))
        if key == self._key:
            return
        runner = ray.get_actor(self._runner_name, namespace=self._namespace)
        spec = ray.get(runner.__ray_call__.remote(lambda r: r.spec))
        cpus = min(state.cluster_cpus, options.get("cpu_budget") or state.cluster_cpus)
        gpus = min(state.cluster_gpus, options.get("gpu_budget") if options.get("gpu_budget") is not None else state.cluster_gpus)
        self._policy = make_policy(policy, spec=spec, cluster=ClusterSpec.single_node(cpus, int(gpus)), **dict(options))
        self._key, self._cursor, self._ticks, self._plans_applied = key, 0, 0, 0

    def cursor(self, runner_id: str, policy: str, options: Mapping[str, Any], state: Any) -> int:
        """The sample cursor for this runner and policy (0 after a reset)."""
        self._ensure(runner_id, policy, options, state)
        return self._cursor

    def decide(self, runner_id: str, policy: str, options: Mapping[str, Any], state: Any, samples: Sequence[BatchSample],
               next_cursor: int) -> Plan | None:
        """Run the policy on the runner's state and new samples; advance the cursor."""
        self._ensure(runner_id, policy, options, state)
        plan = self._policy.decide(state, list(samples))
        self._cursor = next_cursor
        self._ticks += 1
        return plan

    def plan_applied(self) -> int:
        self._plans_applied += 1
        return self._plans_applied

    def counters(self) -> dict[str, int]:
        return {"ticks": self._ticks, "plans_applied": self._plans_applied, "cursor": self._cursor}


def sidecar_state(runner_name: str, namespace: str) -> Any:
    """The detached state actor of the sidecar for ``runner_name`` (created when missing)."""
    actor = ray.remote(SidecarState).options(name=state_actor_name(runner_name), namespace=namespace, lifetime="detached",
                                             get_if_exists=True, num_cpus=0, max_concurrency=1)
    return actor.remote(runner_name, namespace)


def forget_sidecar_state(runner_name: str, namespace: str) -> bool:
    """Kill the state actor of ``runner_name`` if there is one; True if one was killed."""
    try:
        actor = ray.get_actor(state_actor_name(runner_name), namespace=namespace)
    except ValueError:
        return False
    ray.kill(actor)
    return True
