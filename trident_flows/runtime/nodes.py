"""The live Ray nodes as node classes, and whether a set of replicas fits them node by node (pure; no Ray import).

Contract:
- ``read_nodes(raw, gpu_memory_bytes)``: ``ray.nodes()`` as the alive ``state.NodeState``s, sorted
  by id, identical nodes sharing a stable, descriptive ``node_class``.
- A node's network link is declared by its Ray label ``trident.nic`` (``NIC_LABEL``, e.g.
  ``trident.nic=100Gbps``) as ``NodeState.nic_bandwidth_bps``; a label that is not a rate raises
  ``RuntimeConfigError`` naming the node and what to write.
- ``pack(nodes, replicas)`` places ``(label, node_class or None, cpus, gpus)`` replicas on the
  nodes, largest first, each on the node of its class with the most free CPUs, and returns the
  labels that fit nowhere; ``check_fits`` raises ``RuntimeConfigError`` naming the class, the
  replicas and what to change. GPUs are counted per node in total.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

from trident_flows.core.state import NodeState, RuntimeConfigError
from trident_flows.core.units import parse_rate

GiB = 2**30
# Ray's own resources, not a node's hardware: per-node and head markers, the object store.
_NOT_HARDWARE = ("CPU", "GPU", "memory", "object_store_memory")
_EPS = 1e-6
NIC_LABEL = "trident.nic"  # a node's declared network link (Ray labels are strings: "100Gbps", "12.5GBps")


def _hardware(resources: Mapping[str, float]) -> tuple[str, tuple[tuple[str, float], ...]]:
    accelerator = ""
    custom = []
    for key, value in resources.items():
        if key in _NOT_HARDWARE or key.startswith("node:"):
            continue
        if key.startswith("accelerator_type:"):
            accelerator = key.split(":", 1)[1]
            continue
        custom.append((key, float(value)))
    return accelerator, tuple(sorted(custom))


def class_name(cpus: float, gpus: float, memory_bytes: int, accelerator: str = "", custom: Iterable[tuple[str, float]] = ()) -> str:
    """The name of the class of nodes with these resources (see ``read_nodes``)."""
    parts = [f"{cpus:g}cpu"]
    if gpus:
        parts.append(f"{gpus:g}gpu")
    if accelerator:
        parts.append(accelerator)
    parts += [name if value == 1 else f"{name}{value:g}" for name, value in custom]
    parts.append(f"{int(memory_bytes // GiB)}g")
    return "-".join(parts)


def read_nodes(raw: Sequence[Mapping[str, Any]], gpu_memory_bytes: int = 0) -> tuple[NodeState, ...]:
    """The alive nodes of ``ray.nodes()`` output as ``NodeState``s, sorted by id.

    Identical nodes share a ``node_class``: the same CPUs, GPUs, accelerator type, custom resources, declared
    link and memory in whole GiB (two raylets on one machine report memory a few MiB apart). The class name
    says what the nodes are (``4cpu-1gpu-A100-16g``), so it stays the same from one read to the next while the
    hardware does: a node joining a class raises its count, new hardware adds a class, and a class whose last
    node left disappears."""
    nodes = []
    for node in raw:
        if not node.get("Alive"):
            continue
        res = dict(node.get("Resources") or {})
        cpus, gpus = float(res.get("CPU", 0.0)), float(res.get("GPU", 0.0))
        memory = int(res.get("memory", 0))
        accelerator, custom = _hardware(res)
        nic_text = str((node.get("Labels") or {}).get(NIC_LABEL, "")).strip()
        try:
            nic = parse_rate(nic_text, NIC_LABEL) if nic_text else 0.0
        except ValueError as exc:
            raise RuntimeConfigError(f"node {node['NodeID']}: label {exc}; start the node with e.g. "
                                     f"'ray start --labels {NIC_LABEL}=100Gbps', or without the label") from None
        name = class_name(cpus, gpus, memory, accelerator, custom) + (f"-nic{nic / 1e9:g}GBps" if nic else "")
        nodes.append(NodeState(str(node["NodeID"]), name, cpus, gpus, memory, int(gpu_memory_bytes) if gpus else 0, accelerator, custom,
                               "node:__internal_head__" in res, nic))
    return tuple(sorted(nodes, key=lambda n: n.node_id))


def classes(nodes: Sequence[NodeState]) -> dict[str, list[NodeState]]:
    """Nodes per class name, in node id order."""
    out: dict[str, list[NodeState]] = {}
    for n in nodes:
        out.setdefault(n.node_class, []).append(n)
    return out


Replica = tuple[str, "str | None", float, float]  # (label, node class or None = anywhere, cpus, gpus)


def pack(nodes: Sequence[NodeState], replicas: Sequence[Replica], held: Mapping[str, tuple[float, float]] | None = None) -> list[str]:
    """Labels of the ``replicas`` that fit no node (see the module docstring). ``held`` is what
    each node id already holds, as (cpus, gpus)."""
    free = {n.node_id: [n.cpus - (held or {}).get(n.node_id, (0.0, 0.0))[0], n.gpus - (held or {}).get(n.node_id, (0.0, 0.0))[1]]
            for n in nodes}
    unplaced = []
    # classed replicas first (they have fewer choices), then the largest
    for label, node_class, cpus, gpus in sorted(replicas, key=lambda r: (r[1] is None, -r[3], -r[2], r[0])):
        fits = [n for n in nodes if (node_class is None or n.node_class == node_class)
                and free[n.node_id][0] + _EPS >= cpus and free[n.node_id][1] + _EPS >= gpus]
        if not fits:
            unplaced.append(label)
            continue
        best = max(fits, key=lambda n: (free[n.node_id][0], n.node_id))
        free[best.node_id][0] -= cpus
        free[best.node_id][1] -= gpus
    return unplaced


def check_fits(nodes: Sequence[NodeState], replicas: Sequence[Replica]) -> None:
    """Raise ``RuntimeConfigError`` when some ``replicas`` fit no node (see the module docstring)."""
    unplaced = pack(nodes, replicas)
    if not unplaced:
        return
    by_class = classes(nodes)
    counts: dict[str, int] = {}
    for label in unplaced:
        counts[label] = counts.get(label, 0) + 1
    wanted = {r[1] for r in replicas if r[0] in counts}
    where = "; ".join(f"class {c}: {len(by_class.get(c, []))} node(s) of {by_class[c][0].cpus:g} CPUs, {by_class[c][0].gpus:g} GPUs"
                      if c in by_class else f"class {c}: no live node" for c in sorted(w for w in wanted if w is not None))
    raise RuntimeConfigError(f"the plan does not fit the live nodes: {', '.join(f'{n} x {label}' for label, n in counts.items())} "
                             f"fit no node ({where or 'any class'}); plan for the nodes the cluster has now "
                             f"({', '.join(f'{c} x{len(ns)}' for c, ns in by_class.items()) or 'none'})")


def total(nodes: Sequence[NodeState]) -> tuple[float, float]:
    """(CPUs, GPUs) of the nodes."""
    return math.fsum(n.cpus for n in nodes), math.fsum(n.gpus for n in nodes)
