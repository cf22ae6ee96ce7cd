"""Where the runner's replicas run: the live nodes it tracks, the node each new replica is pinned to,
and a record of where every replica ran.

Contract:
- ``NodePlacer(gpu_memory_bytes)`` keeps the live nodes (``nodes.read_nodes``); ``update(raw)``
  replaces them and returns the node ids that joined and left. The runner calls it every
  ``REFRESH_S`` seconds.
- ``choose(cpus, gpus, held, node_class=None, prefer=None, shares=None)``: the node a new replica goes to (one
  with room, ranked; else the largest queue-able one; None when no live node is large enough).
- ``free(held, shares=None)``: node id -> (CPUs, GPUs) each live node has left after ``held``; with
  ``shares`` (node id -> ``GpuShare`` of each GPU replica there) a node's GPUs are counted device by
  device (``gpus_free``), as Ray places them and as the simulator counts them.
- ``strategy(node_id)``: Ray's hard node affinity (``soft=False``): a replica runs on the node the
  plan named or not at all.
- ``ran(operator, replica_id, node_id)`` records a replica warm on a node; ``replicas_by_node()``
  is node id -> operator -> replicas that ran there during the run.
"""

from __future__ import annotations

import time
from typing import Any, Mapping, NamedTuple, Sequence

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


class GpuShare(NamedTuple):
    """What one GPU replica holds on its node: its GPUs, on the devices Ray gave it (empty until it is warm)."""

    gpus: float
    device_ids: tuple[str, ...] = ()


def gpus_free(devices: int, shares: Sequence[GpuShare]) -> float:
    """The GPUs a node of ``devices`` GPUs has left for a new replica: its whole free devices plus the largest share
    left on one device in use (Ray gives a fractional replica its share of one device, and a replica of one GPU or
    more whole free devices: two half-free devices hold no whole-GPU replica). A replica whose devices are not known
    yet takes them as Ray would: a fraction on the first device with room, whole GPUs on the first free devices."""
    load: dict[str, float] = {}
    for share in shares:
        for device in share.device_ids:
            load[device] = load.get(device, 0.0) + share.gpus / len(share.device_ids)
    known = sorted(load, key=lambda d: (not d.isdigit(), int(d) if d.isdigit() else 0, d))
    slots = [load[d] for d in known] + [0.0] * max(0, devices - len(known))
    for share in (s for s in shares if not s.device_ids):
        if share.gpus < 1.0:
            k = next((k for k, used in enumerate(slots) if used + share.gpus <= 1.0 + _EPS), None)
            if k is not None:
                slots[k] += share.gpus
            continue
        for _ in range(round(share.gpus)):
            k = next((k for k, used in enumerate(slots) if used <= _EPS), None)
            if k is not None:
                slots[k] = 1.0
    return free_on_devices(slots)


def free_on_devices(loads: Sequence[float]) -> float:
    """The GPUs left for a new replica on devices with these shares taken: the whole free devices plus the largest share
    left on one device in use. The live placer (``gpus_free``) and the simulator's rollout count free GPUs by it."""
    whole = sum(1 for used in loads if used <= _EPS)
    return whole + max((1.0 - used for used in loads if _EPS < used < 1.0 - _EPS), default=0.0)


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
               prefer: str | None = None, shares: Mapping[str, Sequence[GpuShare]] | None = None) -> str | None:
        """The node for a new replica: among the nodes of ``node_class`` (any node when None) large enough to ever
        hold it, one with room after what the runner's own replicas ``held`` (node id -> (cpus, gpus); ``shares``:
        their GPUs device by device, as ``free``), in this
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
        free = self.free(held, shares)

        def rank(n: NodeState) -> tuple:
            suspect = now - self._suspect.get(n.node_id, -SUSPECT_S - 1) < SUSPECT_S
            return (not suspect, prefer is not None and n.node_class == prefer, gpus > 0 or n.gpus == 0,
                    leaves_free_gpus_usable(cpus, gpus, *free[n.node_id]), free[n.node_id][0], n.node_id)
        roomy = [n for n in pool if free[n.node_id][0] + _EPS >= cpus and free[n.node_id][1] + _EPS >= gpus]
        return max(roomy or pool, key=rank).node_id

    def free(self, held: Mapping[str, tuple[float, float]],
             shares: Mapping[str, Sequence[GpuShare]] | None = None) -> dict[str, tuple[float, float]]:
        """Node id -> the (CPUs, GPUs) each live node has left after what the runner's replicas ``held`` there; with
        ``shares`` (node id -> each GPU replica's ``GpuShare``) its GPUs device by device (``gpus_free``)."""
        left: dict[str, tuple[float, float]] = {}
        for n in self.nodes:
            cpus, gpus = held.get(n.node_id, (0.0, 0.0))
            free_gpus = n.gpus - gpus if shares is None else gpus_free(int(round(n.gpus)), shares.get(n.node_id, ()))
            left[n.node_id] = (n.cpus - cpus, free_gpus)
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
