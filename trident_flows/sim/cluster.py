"""Simulated cluster: node classes from a spec string, nodes, and where a replica lands.

Contract:
- ``parse_cluster("8x(cpus=96,gpus=8,gpu_mem=80GiB)+2x(cpus=32,host_mem=256GiB)")`` returns a
  ``ClusterSpec`` (one ``NodeClass`` per term, named ``c0``, ``c1``, ... unless ``name=``). Keys:
  ``cpus`` (required), ``gpus``, ``gpu_mem``, ``host_mem`` (sizes such as ``80GiB``), ``nic`` and
  ``host_device`` (rates as ``100Gbps`` or ``16GBps``), ``name``. A bad term is refused naming it
  and the expected form; the retired key ``net`` is refused with the two keys to write instead.
- ``SimCluster(spec)`` holds the nodes (free CPUs, one ``SimDevice`` per GPU, free host memory).
  ``place(...)`` puts one replica on a live node with room, ranked as the live runtime's
  ``NodePlacer`` ranks them (a ``Placement``, or None); ``pin(config)`` is the node a replica with
  no room waits for; ``release`` gives a placement back; ``fail_node(i)`` marks node ``i`` dead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from trident_flows.core.types import ClusterSpec, NodeClass, OpConfig
from trident_flows.core.units import parse_rate, parse_size
from trident_flows.runtime.node_placement import leaves_free_gpus_usable
from trident_flows.sim.memory import SimDevice

_KEYS = ("cpus", "gpus", "gpu_mem", "host_mem", "nic", "host_device", "name")
_TERM = re.compile(r"^\s*(\d+)\s*x\s*\((.*)\)\s*$")
FORM = "COUNTx(cpus=N,gpus=N,gpu_mem=SIZE,host_mem=SIZE,nic=RATE,host_device=RATE), terms joined by '+', e.g. '8x(cpus=96,gpus=8,gpu_mem=80GiB)'"
# a node's host memory when the spec does not say: large enough never to bind (the live runtime does not model it either)
DEFAULT_HOST_MEMORY = 1 << 50


def parse_cluster(text: str) -> ClusterSpec:
    """A ClusterSpec from a spec string (see the module docstring)."""
    classes = []
    for k, term in enumerate(text.split("+")):
        m = _TERM.match(term)
        if not m:
            raise ValueError(f"cluster term {term.strip()!r} is not of the form {FORM}")
        fields: dict[str, str] = {}
        for part in filter(None, (p.strip() for p in m.group(2).split(","))):
            key, sep, value = part.partition("=")
            if key.strip() == "net":
                raise ValueError(f"cluster term {term.strip()!r}: 'net' is ambiguous; write nic={value.strip()} for the node's network "
                                 f"link or host_device={value.strip()} for host<->accelerator bandwidth")
            if not sep or key.strip() not in _KEYS:
                raise ValueError(f"cluster term {term.strip()!r}: unknown or malformed {part!r}; keys are {', '.join(_KEYS)} ({FORM})")
            fields[key.strip()] = value.strip()
        if "cpus" not in fields:
            raise ValueError(f"cluster term {term.strip()!r} needs cpus=N ({FORM})")
        gpus = int(fields.get("gpus", "0"))
        if gpus > 0 and "gpu_mem" not in fields:
            raise ValueError(f"cluster term {term.strip()!r} has gpus={gpus} but no gpu_mem; add e.g. gpu_mem=80GiB")
        classes.append(NodeClass(fields.get("name", f"c{k}"), int(m.group(1)), float(fields["cpus"]), gpus,
                                 parse_size(fields["gpu_mem"], "gpu_mem") if gpus else 0,
                                 parse_size(fields["host_mem"], "host_mem") if "host_mem" in fields else 0,
                                 parse_rate(fields["host_device"], "host_device") if "host_device" in fields else 0.0,
                                 nic_bandwidth_bps=parse_rate(fields["nic"], "nic") if "nic" in fields else 0.0))
    return ClusterSpec(tuple(classes))


@dataclass
class SimNode:
    index: int
    node_class: NodeClass
    free_cpus: float
    free_host_bytes: int
    devices: list[SimDevice]
    alive: bool = True


@dataclass(frozen=True)
class Placement:
    node: SimNode
    devices: tuple[SimDevice, ...]  # the kernel runs on the first; empty for a CPU replica
    gpu_share: float                # share taken on each device (config.gpus for a fraction, else 1)


class SimCluster:
    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.nodes: list[SimNode] = []
        for nc in spec.node_classes:
            for _ in range(nc.count):
                i = len(self.nodes)
                devs = [SimDevice(f"node{i}:gpu{g}", nc.gpu_memory_bytes) for g in range(nc.gpus)]
                self.nodes.append(SimNode(i, nc, nc.cpus, nc.host_memory_bytes or DEFAULT_HOST_MEMORY, devs))

    @property
    def total_cpus(self) -> float:
        return sum(n.node_class.cpus for n in self.nodes if n.alive)

    @property
    def total_gpus(self) -> float:
        return float(sum(len(n.devices) for n in self.nodes if n.alive))

    @property
    def devices(self) -> list[SimDevice]:
        return [d for n in self.nodes for d in n.devices]

    def place(self, config: OpConfig, holder: str, resident_bytes: int, host_bytes: int, only: SimNode | None = None) -> Placement | None:
        """Put one replica on a live node with room (CPUs, a device with a free share of at least ``config.gpus``
        (fractional) or ``int(gpus)`` free devices, host memory, the device memory its resident bytes need), chosen
        as the live runtime's ``runtime.node_placement.NodePlacer.choose`` does: a node without GPUs for a replica
        that needs none, for one a node it leaves a CPU per free GPU on, then the most free CPUs (ties: the lowest
        node index); ``only``: that node or none. Returns a ``Placement``, or None when no node has room."""
        nodes = (only,) if only is not None else self.nodes
        roomy = [n for n in nodes if n.alive and self._has_room(n, config, host_bytes)]
        for node in sorted(roomy, key=lambda n: self._rank(n, config), reverse=True):
            placement = self._take(node, config, holder, resident_bytes, host_bytes)
            if placement is not None:
                return placement
        return None

    def pin(self, config: OpConfig) -> SimNode | None:
        """The node a replica with no room waits for, as the runtime pins it there (hard node affinity) and Ray queues
        it until that node has room: the live node large enough, ranked as ``place`` ranks them; None if no live node
        is large enough."""
        pool = [n for n in self.nodes if n.alive and n.node_class.cpus + 1e-9 >= config.cpus and len(n.devices) + 1e-9 >= config.gpus]
        return max(pool, key=lambda n: self._rank(n, config)) if pool else None

    @staticmethod
    def _rank(node: SimNode, config: OpConfig) -> tuple[bool, bool, float, int]:
        # NodePlacer.choose: GPU nodes stay free for GPU work, a CPU per free GPU is left, then the most free CPUs
        free_gpus = sum(1 for d in node.devices if d.gpu_share <= 1e-9)
        return (config.gpus > 0 or not node.devices, leaves_free_gpus_usable(config.cpus, config.gpus, node.free_cpus, free_gpus),
                node.free_cpus, -node.index)

    @staticmethod
    def _has_room(node: SimNode, config: OpConfig, host_bytes: int) -> bool:
        if node.free_cpus + 1e-9 < config.cpus or node.free_host_bytes < host_bytes:
            return False
        if config.gpus <= 0:
            return True
        if config.gpus < 1:
            return any(d.gpu_share + config.gpus <= 1 + 1e-9 for d in node.devices)
        return sum(1 for d in node.devices if d.gpu_share <= 1e-9) >= int(round(config.gpus))

    def _take(self, node: SimNode, config: OpConfig, holder: str, resident_bytes: int, host_bytes: int) -> Placement | None:
        """Claim the replica's resources on ``node`` (which has room); None when its device lacks the memory."""
        if config.gpus <= 0:
            chosen: list[SimDevice] = []
            share = 0.0
        elif config.gpus < 1:
            chosen = [d for d in node.devices if d.gpu_share + config.gpus <= 1 + 1e-9][:1]
            share = config.gpus
        else:
            chosen = [d for d in node.devices if d.gpu_share <= 1e-9][:int(round(config.gpus))]
            share = 1.0
        if chosen and not chosen[0].hold(holder, resident_bytes):
            return None
        node.free_cpus -= config.cpus
        node.free_host_bytes -= host_bytes
        for d in chosen:
            d.gpu_share += share
        return Placement(node, tuple(chosen), share)

    def release(self, placement: Placement, holder: str, config: OpConfig, host_bytes: int) -> None:
        node = placement.node
        node.free_cpus += config.cpus
        node.free_host_bytes += host_bytes
        for d in placement.devices:
            d.gpu_share = max(0.0, d.gpu_share - placement.gpu_share)
        if placement.devices:
            placement.devices[0].release(holder)

    def fail_node(self, index: int) -> SimNode:
        if not 0 <= index < len(self.nodes):
            raise ValueError(f"node_loss names node {index}, but the cluster has nodes 0..{len(self.nodes) - 1}")
        node = self.nodes[index]
        node.alive = False
        return node
