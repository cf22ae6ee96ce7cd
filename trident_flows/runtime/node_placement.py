"""Where the runner's replicas run: the live nodes it tracks, the node each new replica is pinned to,
and a record of where every replica ran.

Contract:
- ``NodePlacer(gpu_memory_bytes)`` keeps the live nodes (``nodes.read_nodes``); ``update(raw)``
  replaces them and returns the node ids that joined and left. The runner calls it every
  ``REFRESH_S`` seconds.
- ``choose(cpus, gpus, held, node_class=None, prefer=None)``: the node a new replica goes to (one
  with room, ranked; else the largest queue-able one; None when no live node is large enough).
- ``free(held)``: node id -> (CPUs, GPUs) each live node has left after ``held``.
- ``strategy(node_id)``: Ray's hard node affinity (``soft=False``): a replica runs on the node the
  plan named or not at all.
- ``ran(operator, replica_id, node_id)`` records a replica warm on a node; ``replicas_by_node()``
  is node id -> operator -> replicas that ran there during the run.
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

from trident_flows.core.state import NodeState
from trident_flows.runtime.nodes import read_nodes

# How often the runner reads ``ray.nodes()``: one GCS call (about 1-5 ms here), so a node that
# joins is planned for within a tick of the control loop (2 s by default).
REFRESH_S = 1.0
# How long a node where a replica died is placed on last: Ray reports a killed node dead only
# after its health checks fail (about 10-30 s with Ray's defaults).
SUSPECT_S = 60.0
_EPS = 1e-6
# CPUs a GPU replica holds beside its GPU (every GPU config of the shipped pipelines asks for one)
CPUS_PER_GPU_REPLICA = 1.0


def leaves_free_gpus_usable(cpus: float, gpus: float, free_cpus: float, free_gpus: float) -> bool:
    """Whether a replica of ``cpus`` / ``gpus`` on a node with ``free_cpus`` / ``free_gpus`` leaves a CPU beside each
    whole free GPU (always, for a GPU replica). The runtime's ``NodePlacer`` and the simulator's cluster rank by it."""
    return gpus > 0 or free_cpus - cpus + _EPS >= int(free_gpus + _EPS) * CPUS_PER_GPU_REPLICA


class NodePlacer:
    """The live nodes and the choice of a node per replica (see the module docstring)."""

    def __init__(self, gpu_memory_bytes: int = 0) -> None:
        self.gpu_memory_bytes = int(gpu_memory_bytes)
        self.nodes: tuple[NodeState, ...] = ()
        self._suspect: dict[str, float] = {}
        self._ran: dict[str, tuple[str, str]] = {}  # replica id -> (operator, node id)

    def update(self, raw: Sequence[Mapping[str, Any]]) -> tuple[set[str], set[str]]:
        """Replace the live nodes with ``raw`` (``ray.nodes()``); returns (joined, left) node ids."""
        before = {n.node_id for n in self.nodes}
        self.nodes = read_nodes(raw, self.gpu_memory_bytes)
        after = {n.node_id for n in self.nodes}
        return after - before, before - after

    def node(self, node_id: str) -> NodeState | None:
        return next((n for n in self.nodes if n.node_id == node_id), None)

    def class_of(self, node_id: str) -> str:
        node = self.node(node_id)
        return node.node_class if node is not None else ""

    def suspect(self, node_id: str) -> None:
        """A replica died on ``node_id``: place new replicas elsewhere for a while."""
        if node_id:
            self._suspect[node_id] = time.monotonic()

    def choose(self, cpus: float, gpus: float, held: Mapping[str, tuple[float, float]], node_class: str | None = None,
               prefer: str | None = None) -> str | None:
        """The node for a new replica: among the nodes of ``node_class`` (any node when None) large enough to ever
        hold it, one with room after what the runner's own replicas ``held`` (node id -> (cpus, gpus)), in this
        order: not a node where a replica died in the last ``SUSPECT_S`` seconds (Ray reports a dead node dead only
        seconds later), of class ``prefer``, a node without GPUs for a replica that needs none (GPU nodes stay free
        for GPU work), for such a replica a node it leaves a CPU per free GPU on (``CPUS_PER_GPU_REPLICA``: a GPU
        replica needs a CPU too, and a GPU whose node's CPUs are all held cannot start one, so a start there would
        wait out the whole start timeout), the most free CPUs. When no node has room, the one of those with the
        most free CPUs (Ray queues the replica there until its resources are free); None when no live node is
        large enough."""
        now = time.monotonic()
        pool = [n for n in self.nodes if (node_class is None or n.node_class == node_class)
                and n.cpus + _EPS >= cpus and n.gpus + _EPS >= gpus]
        if not pool:
            return None
        free = self.free(held)

        def rank(n: NodeState) -> tuple:
            suspect = now - self._suspect.get(n.node_id, -SUSPECT_S - 1) < SUSPECT_S
            return (not suspect, prefer is not None and n.node_class == prefer, gpus > 0 or n.gpus == 0,
                    leaves_free_gpus_usable(cpus, gpus, *free[n.node_id]), free[n.node_id][0], n.node_id)
        roomy = [n for n in pool if free[n.node_id][0] + _EPS >= cpus and free[n.node_id][1] + _EPS >= gpus]
        return max(roomy or pool, key=rank).node_id

    def free(self, held: Mapping[str, tuple[float, float]]) -> dict[str, tuple[float, float]]:
        """Node id -> the (CPUs, GPUs) each live node has left after what the runner's replicas ``held`` there."""
        left: dict[str, tuple[float, float]] = {}
        for n in self.nodes:
            cpus, gpus = held.get(n.node_id, (0.0, 0.0))
            left[n.node_id] = (n.cpus - cpus, n.gpus - gpus)
        return left

    @staticmethod
    def strategy(node_id: str) -> Any:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        return NodeAffinitySchedulingStrategy(node_id, soft=False)

    def ran(self, operator: str, replica_id: str, node_id: str) -> None:
        self._ran[replica_id] = (operator, node_id)

    def replicas_by_node(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for operator, node_id in self._ran.values():
            ops = out.setdefault(node_id, {})
            ops[operator] = ops.get(operator, 0) + 1
        return out
