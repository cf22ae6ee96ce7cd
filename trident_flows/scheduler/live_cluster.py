"""The cluster a policy plans for, from the live nodes the runner reports (pure).

Contract:
- ``live_cluster(state, given=None)`` is the ``ClusterSpec`` of ``state.nodes`` (the live Ray
  nodes, refreshed by the runner every second): one ``NodeClass`` per node class the runtime
  reads (same name, so a plan's ``ReplicaGroup.node_class`` is a class the runner can place on),
  counting its nodes. Nodes without CPUs are left out (they cannot host a replica). Memory
  figures Ray does not measure, or measures roughly, come from ``given`` (the cluster the policy
  was built with) when it has a class of the same CPUs and GPUs: host memory (Ray's estimate on a
  shared machine is far below what replicas may use), device memory, host<->device bandwidth and
  the network link (``nic_bandwidth_bps``, which Ray does not report at all) unless the node's
  ``trident.nic`` label declares it; else host memory is the node's Ray ``memory``, the network
  link not declared and the rest the ``ClusterSpec.single_node`` defaults. ``None`` when the state lists no nodes (the simulator, an old trace): keep ``given``.
"""

from __future__ import annotations

from typing import Any

from trident_flows.core.types import ClusterSpec, NodeClass

_DEFAULT = ClusterSpec.single_node(1, 1).node_classes[0]


def live_cluster(state: Any, given: ClusterSpec | None = None) -> ClusterSpec | None:
    """The live cluster as node classes (see the module docstring)."""
    groups: dict[str, list[Any]] = {}
    for node in getattr(state, "nodes", ()) or ():
        if node.cpus > 0:
            groups.setdefault(node.node_class, []).append(node)
    if not groups:
        return None
    classes = []
    for name, nodes in sorted(groups.items()):
        node = nodes[0]
        gpus = int(round(node.gpus))
        like = next((nc for nc in (given.node_classes if given else ()) if nc.cpus == node.cpus and nc.gpus == gpus), None)
        host = like.host_memory_bytes if like and like.host_memory_bytes else int(node.memory_bytes) or _DEFAULT.host_memory_bytes
        gpu_mem = (like.gpu_memory_bytes if like and like.gpu_memory_bytes else node.gpu_memory_bytes or _DEFAULT.gpu_memory_bytes) if gpus else 0
        bandwidth = like.host_device_bandwidth_bps if like else _DEFAULT.host_device_bandwidth_bps
        classes.append(NodeClass(name, len(nodes), float(node.cpus), gpus, gpu_mem, host, bandwidth,
                                 nic_bandwidth_bps=node.nic_bandwidth_bps or (like.nic_bandwidth_bps if like else 0.0)))
    return ClusterSpec(tuple(classes))
