"""The sidecar's memory between flow runs, kept in the Ray cluster by a named, detached actor.

Contract:
- ``SidecarMemory`` is what one sidecar remembers about one pipeline runner: which runner and
  policy settings it belongs to (``key``), the policy object itself (pickled, so the store never
  needs the policy's code; empty until the first tick that asks it), the tick loop's ``LoopState``
  (the sample cursor and the loop's counts: ``cursor``, ``ticks`` and ``plans_applied`` read it), the
  live view's history, the ``RunRecord`` of the run's account (every tick's counts, every decision
  and its outcome) and the ids of the artifacts it updates in place.
- ``load_memory`` / ``save_memory`` read and write it through the actor
  ``trident-sidecar-<runner_name>`` in the runner's namespace (created when missing). The actor
  outlives the flow run that created it, so a scheduled sidecar deployment (one tick per run)
  continues where the previous run stopped.
- ``forget_memory`` kills the actor (the pipeline finished or is gone).
No Prefect import: this is Ray code the sidecar's tasks call.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Optional

import ray
from ray import cloudpickle

from trident_flows.control.run_record import RunRecord
from trident_flows.loop.tick_loop import LoopState
from trident_flows.tasks.live_view import LiveHistory


def memory_actor_name(runner_name: str) -> str:
    return f"trident-sidecar-{runner_name}"


@dataclass(frozen=True)
class SidecarMemory:
    """The sidecar's state for one runner and one policy configuration."""

    key: str
    policy_blob: bytes = b""
    loop: LoopState = field(default_factory=LoopState)
    view: LiveHistory = LiveHistory()
    live_artifact_id: Optional[str] = None
    decisions_artifact_id: Optional[str] = None
    record: RunRecord = field(default_factory=RunRecord)

    @property
    def cursor(self) -> int:
        return self.loop.cursor

    @property
    def ticks(self) -> int:
        return self.loop.ticks

    @property
    def plans_applied(self) -> int:
        return self.loop.applied

    def policy(self) -> Any | None:
        """The policy as it was after the last tick that asked it (None before the first)."""
        return cloudpickle.loads(self.policy_blob) if self.policy_blob else None

    def kept(self, policy: Any) -> "SidecarMemory":
        return replace(self, policy_blob=cloudpickle.dumps(policy))

    def observed(self, state: Any) -> "SidecarMemory":
        return replace(self, view=self.view.observe(state))

    def decided(self, row: dict[str, Any]) -> "SidecarMemory":
        return replace(self, view=self.view.decided(row))


class _Store:
    """Holds one ``SidecarMemory`` (as an opaque value)."""

    def __init__(self) -> None:
        self._memory: SidecarMemory | None = None

    def load(self) -> SidecarMemory | None:
        return self._memory

    def save(self, memory: SidecarMemory) -> None:
        self._memory = memory


def _store(runner_name: str, namespace: str) -> Any:
    return ray.remote(_Store).options(name=memory_actor_name(runner_name), namespace=namespace, lifetime="detached",
                                      get_if_exists=True, num_cpus=0).remote()


def load_memory(runner_name: str, namespace: str) -> SidecarMemory | None:
    """What the sidecar remembers about ``runner_name`` (None the first time)."""
    return ray.get(_store(runner_name, namespace).load.remote())


def save_memory(runner_name: str, namespace: str, memory: SidecarMemory) -> None:
    ray.get(_store(runner_name, namespace).save.remote(memory))


def forget_memory(runner_name: str, namespace: str) -> bool:
    """Kill the memory actor of ``runner_name`` if there is one; True if one was killed."""
    try:
        actor = ray.get_actor(memory_actor_name(runner_name), namespace=namespace)
    except ValueError:
        return False
    ray.kill(actor)
    return True
