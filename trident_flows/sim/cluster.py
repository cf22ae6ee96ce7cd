"""Simulated cluster: node classes from a spec string, nodes, and where a replica lands.

Contract:
- ``parse_cluster("8x(cpus=96,gpus=8,gpu_mem=80GiB)+2x(cpus=32,host_mem=256GiB)")`` returns a
  ``ClusterSpec`` (one ``NodeClass`` per ``COUNTx(...)`` term, named ``c0``, ``c1``, ... unless
  ``name=`` is given). Keys: ``cpus`` (required), ``gpus``, ``gpu_mem``, ``host_mem`` (sizes
  such as ``80GiB``, ``512MiB``, ``1.5TB``), ``nic`` (the node's network link, each direction:
  ``NodeClass.nic_bandwidth_bps``; unset = cross-node traffic not constrained), ``host_device``
  (host<->accelerator bandwidth: ``NodeClass.host_device_bandwidth_bps``), rates as ``100Gbps``
  (bits) or ``16GBps`` (bytes) per second, and ``name``. A bad term is refused naming it and the
  expected form; ``net`` (which once meant host<->device) is refused with the two keys to write instead.
- ``SimCluster(spec)`` holds the nodes: free CPUs, one ``SimDevice`` per GPU, free host memory.
  ``place(config, holder, resident_bytes, host_bytes)`` puts one replica on the first live
  node with room (first fit, like a packing scheduler; a CPU replica first looks for a node
  where it leaves one CPU per unclaimed GPU): CPUs, a device with a free share of
  at least ``config.gpus`` (fractional) or ``int(gpus)`` free devices, host memory; it returns
  a ``Placement`` or ``None`` (no room: the replica stays pending). ``release`` gives it back.
  ``fail_node(i)`` marks node ``i`` dead (its replicas are lost; the runner re-queues their work).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from trident_flows.core.types import ClusterSpec, NodeClass, OpConfig
from trident_flows.core.units import parse_rate, parse_size
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

    def place(self, config: OpConfig, holder: str, resident_bytes: int, host_bytes: int) -> Placement | None:
        if config.gpus <= 0:
            # a CPU replica first leaves one CPU per unclaimed GPU of a node free, so that CPU work
            # does not strand the GPUs (a GPU replica holds a CPU too); if none has room, anywhere
            return self._place(config, holder, resident_bytes, host_bytes, reserve=True) or \
                self._place(config, holder, resident_bytes, host_bytes, reserve=False)
        return self._place(config, holder, resident_bytes, host_bytes, reserve=False)

    def _place(self, config: OpConfig, holder: str, resident_bytes: int, host_bytes: int, reserve: bool) -> Placement | None:
        for node in self.nodes:
            kept = sum(1 for d in node.devices if d.gpu_share <= 1e-9) if reserve else 0
            if not node.alive or node.free_cpus - kept + 1e-9 < config.cpus or node.free_host_bytes < host_bytes:
                continue
            if config.gpus <= 0:
                chosen: list[SimDevice] = []
                share = 0.0
            elif config.gpus < 1:
                chosen = [d for d in node.devices if d.gpu_share + config.gpus <= 1 + 1e-9][:1]
                share = config.gpus
                if not chosen:
                    continue
            else:
                need = int(round(config.gpus))
                chosen = [d for d in node.devices if d.gpu_share <= 1e-9][:need]
                share = 1.0
                if len(chosen) < need:
                    continue
            if chosen and not chosen[0].hold(holder, resident_bytes):
                continue
            node.free_cpus -= config.cpus
            node.free_host_bytes -= host_bytes
            for d in chosen:
                d.gpu_share += share
            return Placement(node, tuple(chosen), share)
        return None

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
