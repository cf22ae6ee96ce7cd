"""The resource and throughput model of a placement, shared by the MILP, the transition planner and
the exhaustive-search check (pure functions, no solver state).

Contract:
- A placement is ``Counts``: ``Key(operator, option, node_class) -> replicas``.
- ``effective_gpus``: the GPU fraction a replica requests so that Ray's per-GPU accounting also
  keeps device memory within one GPU.
- ``ineligibility``: why an option cannot run on a node class (an ``Ineligibility``, or None).
- ``usage_vector`` / ``class_capacity``: a replica's (CPUs, GPUs, host memory) and a class's totals.
- ``pack_class``: packs a class's replicas onto its nodes and GPUs and returns what does not fit;
  aggregate sums alone are not sound (a node's CPUs can be stranded next to a full GPU).
- ``throughput_of``: the input items/s a placement sustains (``max T`` with every operator's
  capacity >= work_per_item * T, capped by host<->device bandwidth and, per ``network_edges``, the
  network links). A ``NodeClass`` field that is 0 (memory, bandwidths) does not constrain.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Mapping, NamedTuple, Sequence

import highspy
import numpy as np

from trident_flows.core.types import CPU, ClusterSpec, NodeClass
from trident_flows.scheduler.placement.types import GiB, OperatorDemand, PlacementOption


class Key(NamedTuple):
    """Where replicas of one placement option run: operator name, index of its option, node class."""

    operator: str
    option: int
    node_class: str


SPLIT_SEP = "#node"  # a small class modelled node by node: "gpu#node0", "gpu#node1", ...
Counts = Mapping[Key, int]
_EPS = 1e-9


def _gib(n: float) -> str:
    return f"{n / GiB:.3g} GiB"


def base_class(name: str) -> str:
    """The node class a per-node model class belongs to (``"gpu#node1"`` -> ``"gpu"``)."""
    return name.split(SPLIT_SEP, 1)[0]


def effective_gpus(option: PlacementOption, node_class: NodeClass) -> float:
    """GPUs one replica of ``option`` requests on ``node_class``, so that Ray's per-GPU fraction
    accounting also keeps device memory within one GPU: a fractional replica needing fraction ``f = max(gpus, device memory / GPU memory)``
    requests ``1 / floor(1 / f)``, i.e. the share of the GPU it really takes when as many
    as fit share one GPU, so aggregate GPU sums match per-GPU packing."""
    g = option.config.gpus
    if option.config.device == CPU or g <= 0:
        return 0.0
    if g >= 1 or node_class.gpu_memory_bytes <= 0:
        return float(g)
    f = max(g, option.device_mem_bytes / node_class.gpu_memory_bytes)
    per_gpu = math.floor(1.0 / f + 1e-9)
    return 1.0 / per_gpu if per_gpu >= 1 else math.inf


class Unfit(str, Enum):
    """What keeps an option off a node class."""

    NOT_ALLOWED = "not_allowed"        # the operator or option names other node classes
    NO_DEVICE = "no_device"            # the class has no accelerator of the option's device
    GPU_MEMORY = "gpu_memory"          # one replica's device memory exceeds one GPU's
    WHOLE_GPUS = "whole_gpus"          # over 1 GPU but not a whole number
    GPUS_PER_NODE = "gpus_per_node"    # more GPUs per replica than a node has
    CPUS = "cpus"                      # more CPUs per replica than a node has
    HOST_MEMORY = "host_memory"        # more host memory per replica than a node has


@dataclass(frozen=True)
class Ineligibility:
    """Why an option cannot run on a node class: the ``kind`` for control flow, ``text`` for people."""

    kind: Unfit
    text: str

    def __str__(self) -> str:
        return self.text


def ineligibility(demand: OperatorDemand, option: PlacementOption, node_class: NodeClass) -> Ineligibility | None:
    """Why ``option`` of ``demand`` cannot run on ``node_class``; ``None`` when it can."""
    cfg = option.config
    if not demand.allows(option, base_class(node_class.name)):
        return Ineligibility(Unfit.NOT_ALLOWED, f"not allowed on node class {node_class.name!r}")
    if cfg.device != CPU:
        if node_class.gpus <= 0 or node_class.accelerator != cfg.device:
            return Ineligibility(Unfit.NO_DEVICE, f"needs a {cfg.device} device")
        if option.device_mem_bytes > node_class.gpu_memory_bytes:
            return Ineligibility(Unfit.GPU_MEMORY, f"needs {_gib(option.device_mem_bytes)} GPU memory")
        if cfg.gpus > 1 and cfg.gpus != int(cfg.gpus):
            return Ineligibility(Unfit.WHOLE_GPUS, f"gpus={cfg.gpus} is over 1 but not a whole number (Ray needs whole GPUs above 1)")
        if effective_gpus(option, node_class) > node_class.gpus + _EPS:
            return Ineligibility(Unfit.GPUS_PER_NODE, f"needs {cfg.gpus:g} GPUs on one node")
    if cfg.cpus > node_class.cpus + _EPS:
        return Ineligibility(Unfit.CPUS, f"needs {cfg.cpus:g} CPUs per replica")
    if node_class.host_memory_bytes and option.host_mem_bytes > node_class.host_memory_bytes:
        return Ineligibility(Unfit.HOST_MEMORY, f"needs {_gib(option.host_mem_bytes)} host memory per replica")
    return None


def no_fit_message(demand: OperatorDemand, cluster: ClusterSpec) -> str:
    """The error for an operator none of whose options fits any node class."""
    gpu_classes = [n for n in cluster.node_classes if n.gpus > 0]
    largest_gpu = max((n.gpu_memory_bytes for n in gpu_classes), default=0)
    parts = []
    for opt in demand.options:
        unfit = [r for nc in cluster.node_classes if (r := ineligibility(demand, opt, nc))]
        kinds = {r.kind for r in unfit}
        label = opt.config.label()
        if Unfit.GPU_MEMORY in kinds and largest_gpu:
            parts.append(f"{label} needs {_gib(opt.device_mem_bytes)} GPU memory, largest GPU has {_gib(largest_gpu)}")
        elif Unfit.NO_DEVICE in kinds and not gpu_classes:
            parts.append(f"{label} needs a {opt.config.device} device, the cluster has none")
        elif Unfit.CPUS in kinds:
            parts.append(f"{label} needs {opt.config.cpus:g} CPUs per replica, largest node has "
                         f"{max(n.cpus for n in cluster.node_classes):g}")
        elif Unfit.HOST_MEMORY in kinds:
            parts.append(f"{label} needs {_gib(opt.host_mem_bytes)} host memory per replica, largest node has "
                         f"{_gib(max(n.host_memory_bytes for n in cluster.node_classes))}")
        else:
            parts.append(f"{label}: " + "; ".join(sorted({r.text for r in unfit})))
    return f"operator {demand.name!r} fits no device: " + "; ".join(parts)


def usage_vector(option: PlacementOption, node_class: NodeClass) -> tuple[float, float, float]:
    """(cpus, gpus, host memory bytes) one replica of ``option`` holds on ``node_class``."""
    return (option.config.cpus, effective_gpus(option, node_class), float(option.host_mem_bytes))


def class_capacity(node_class: NodeClass) -> tuple[float, float, float]:
    """Aggregate (cpus, gpus, host memory) of a class; ``inf`` for unmodelled host memory."""
    mem = node_class.host_memory_bytes * node_class.count if node_class.host_memory_bytes else math.inf
    return (node_class.cpus * node_class.count, float(node_class.gpus * node_class.count), float(mem))


def _place_on_node(state: tuple, item: tuple[float, float, float], want: int) -> tuple[tuple, int]:
    """Put up to ``want`` replicas of ``item`` on one node; returns (new state, placed)."""
    cpu_free, mem_free, gpu_free = state
    cpus, g, mem = item
    k = want
    if cpus > 0:
        k = min(k, int((cpu_free + _EPS) // cpus))
    if mem > 0 and math.isfinite(mem_free):  # inf // mem is nan: unmodelled host memory bounds nothing
        k = min(k, int((mem_free + _EPS) // mem))
    if g <= 0 or k <= 0:
        return ((cpu_free - k * cpus, mem_free - k * mem, gpu_free), max(k, 0))
    free = list(gpu_free)
    placed = 0
    if g >= 1:
        whole = [i for i, f in enumerate(free) if f >= 1 - _EPS]
        placed = min(k, len(whole) // int(g))
        for i in whole[: placed * int(g)]:
            free[i] = 0.0
    else:
        for i, f in enumerate(free):
            fit = min(k - placed, int((f + _EPS) // g))
            free[i] = f - fit * g
            placed += fit
            if placed == k:
                break
    return ((cpu_free - placed * cpus, mem_free - placed * mem, tuple(free)), placed)


def pack_class(node_class: NodeClass, items: Mapping[Key, tuple[int, tuple[float, float, float]]]) -> dict[Key, int]:
    """Pack ``items`` (key -> (replicas, usage vector)) onto the class's individual nodes
    and their GPUs; returns the replicas that did not fit (empty when all fit). Two
    heuristics are tried (an even spread, then first-fit decreasing); the better one counts."""
    left = _spread(node_class, items)
    if not left:
        return left
    other = _first_fit(node_class, items)
    return other if sum(other.values()) < sum(left.values()) else left


def _first_fit(node_class: NodeClass, items: Mapping[Key, tuple[int, tuple[float, float, float]]]) -> dict[Key, int]:
    """First-fit decreasing: GPU replicas first (largest fraction first, which packs
    divisible fractions such as 1, 1/2, 1/4 perfectly), then the rest by size; each kind
    fills nodes in order."""
    mem_cap = float(node_class.host_memory_bytes) if node_class.host_memory_bytes else math.inf
    groups: list[list] = [[(float(node_class.cpus), mem_cap, (1.0,) * node_class.gpus), node_class.count]]

    def size(vec: tuple[float, float, float]) -> float:
        return max(vec[0] / node_class.cpus, vec[1] / max(node_class.gpus, 1), vec[2] / mem_cap if math.isfinite(mem_cap) else 0.0)

    left: dict[Key, int] = {}
    for key, (count, vec) in sorted(items.items(), key=lambda kv: (-kv[1][1][1], -size(kv[1][1]))):
        remaining = count
        i = 0
        while remaining > 0 and i < len(groups):
            state, n = groups[i]
            new_state, k = _place_on_node(state, vec, remaining)
            if k == 0:
                i += 1
                continue
            full = min(n, remaining // k)  # k <= remaining, so at least one node takes k
            groups[i:i + 1] = [[new_state, full]] + ([[state, n - full]] if n > full else [])
            remaining -= full * k
            i += 1
        if remaining:
            left[key] = remaining
    return left


def _spread(node_class: NodeClass, items: Mapping[Key, tuple[int, tuple[float, float, float]]]) -> dict[Key, int]:
    """Largest replicas first, each kind is spread evenly over the nodes (the least loaded
    nodes take the remainder), which keeps every node's mix close to the class average
    that the MILP's aggregate constraints see; what a node cannot take then goes first-fit
    to any node with room. Identical node states are kept as one group, so the cost does
    not grow with ``count``."""
    mem_cap = float(node_class.host_memory_bytes) if node_class.host_memory_bytes else math.inf
    n_gpus = max(node_class.gpus, 1)

    def size(vec: tuple[float, float, float]) -> float:
        return max(vec[0] / node_class.cpus, vec[1] / n_gpus, vec[2] / mem_cap if math.isfinite(mem_cap) else 0.0)

    def load(state: tuple) -> float:
        cpu_free, mem_free, gpu_free = state
        mem = (mem_cap - mem_free) / mem_cap if math.isfinite(mem_cap) else 0.0
        return (node_class.cpus - cpu_free) / node_class.cpus + mem + (node_class.gpus - sum(gpu_free)) / n_gpus

    groups: dict[tuple, int] = {(float(node_class.cpus), mem_cap, (1.0,) * node_class.gpus): node_class.count}
    left: dict[Key, int] = {}
    for key, (count, vec) in sorted(items.items(), key=lambda kv: -size(kv[1][1])):
        q, extra = divmod(count, node_class.count)
        spread: dict[tuple, int] = {}
        overflow = 0
        for state, n in sorted(groups.items(), key=lambda sn: load(sn[0])):
            more = min(extra, n)
            extra -= more
            for nodes, want in ((more, q + 1), (n - more, q)):
                if nodes:
                    new_state, placed = _place_on_node(state, vec, want)
                    overflow += (want - placed) * nodes
                    spread[new_state] = spread.get(new_state, 0) + nodes
        groups = spread
        for state in sorted(groups, key=load):  # first fit of what the even spread could not place
            if not overflow:
                break
            n = groups[state]
            new_state, k = _place_on_node(state, vec, overflow)
            if k == 0:
                continue
            full = min(n, overflow // k)
            groups[state] -= full
            if not groups[state]:
                del groups[state]
            groups[new_state] = groups.get(new_state, 0) + full
            overflow -= full * k
            if 0 < overflow < k and state in groups:  # one more node takes the rest
                rest_state, k2 = _place_on_node(state, vec, overflow)
                groups[state] -= 1
                if not groups[state]:
                    del groups[state]
                groups[rest_state] = groups.get(rest_state, 0) + 1
                overflow -= k2
        if overflow:
            left[key] = overflow
    return left


def pack_cluster(demands: Sequence[OperatorDemand], cluster: ClusterSpec, counts: Counts) -> dict[Key, int]:
    """``pack_class`` for every class: the replicas of ``counts`` that fit on no node."""
    by_name = {d.name: d for d in demands}
    left: dict[Key, int] = {}
    for nc in cluster.node_classes:
        items = {key: (n, usage_vector(by_name[key.operator].options[key.option], nc)) for key, n in counts.items() if key.node_class == nc.name and n > 0}
        left.update(pack_class(nc, items))
    return left


def operator_capacity(demand: OperatorDemand, counts: Counts) -> float:
    """Items/s of ``demand``'s replicas in ``counts`` ignoring bandwidth limits."""
    per_option: dict[int, int] = {}
    for (op, k, _), n in counts.items():
        if op == demand.name:
            per_option[k] = per_option.get(k, 0) + n
    return sum(demand.options[k].rate_at(n) for k, n in per_option.items())


class NetworkEdge(NamedTuple):
    """Stored batches flowing from ``demands[producer]`` to ``demands[consumer]``: bytes per item of each."""

    producer: int
    consumer: int
    consumed_bytes_per_item: float  # per consumer item (its input_bytes_per_item)
    produced_bytes_per_item: float  # per producer item: the same bytes, over the producer's items


def network_edges(demands: Sequence[OperatorDemand], cluster: ClusterSpec) -> tuple[NetworkEdge, ...]:
    """The edges whose traffic the network rows count: none unless a class declares ``nic_bandwidth_bps``.

    When a class declares ``nic_bandwidth_bps`` and an operator reads ``input_bytes_per_item`` > 0 from the
    operator before it, the items/s each operator serves on each class (its "flow", summing to
    ``work_per_item * T``) set the bytes/s that edge produces and consumes there; what a class both produces and
    consumes is read on the node that holds it (the runner hands a batch to a replica on its node when one is
    free), the rest crosses nodes: per class, bytes/s in and bytes/s out each <= ``nic_bandwidth_bps * count``.
    A class of several nodes is taken as spread evenly over them (what ``pack_class`` tries first), so its own
    nodes' traffic among themselves is not seen; a small cluster is modelled node by node (``placement.milp``).
    A plan names node classes, not nodes: among identical nodes, keeping producer and consumer together is left
    to the runtime's node choice (it spreads replicas) and its dispatch (it prefers the replica beside the batch)."""
    if not any(nc.nic_bandwidth_bps > 0 for nc in cluster.node_classes):
        return ()
    return tuple(NetworkEdge(i - 1, i, d.input_bytes_per_item, d.input_bytes_per_item * d.work_per_item / demands[i - 1].work_per_item)
                 for i, d in enumerate(demands) if i > 0 and d.input_bytes_per_item > 0)


def _bandwidth_bound(demands: Sequence[OperatorDemand], cluster: ClusterSpec, counts: Counts) -> bool:
    by_name = {d.name: d for d in demands}
    return any(n > 0 and by_name[op].options[k].bandwidth_bytes_per_item > 0 and cluster.node_class(c).host_device_bandwidth_bps > 0
               for (op, k, c), n in counts.items())


def throughput_of(demands: Sequence[OperatorDemand], cluster: ClusterSpec, counts: Counts) -> float:
    """Pipeline throughput (input items/s) sustained by the placement ``counts``."""
    edges = network_edges(demands, cluster)
    if not edges and not _bandwidth_bound(demands, cluster, counts):
        return min(operator_capacity(d, counts) / d.work_per_item for d in demands)
    by_name = {d.name: d for d in demands}
    keys = [key for key, n in counts.items() if n > 0]
    # columns: T, capacity per (op, option, class) each under its replicas' full rate, then per edge and class the bytes/s kept local
    upper = [highspy.kHighsInf] + [by_name[op].options[k].rate_per_replica * counts[(op, k, c)] for op, k, c in keys]
    rows: list[tuple[dict[int, float], float, float]] = []  # (coefficients, lower, upper) of "lower <= row <= upper"
    inf = highspy.kHighsInf
    option_keys: dict[tuple[str, int], list[int]] = {}
    for j, (op, k, _) in enumerate(keys, start=1):
        option_keys.setdefault((op, k), []).append(j)
    for (op, k), idx in option_keys.items():  # an option's classes together stay under its curve
        rows.append(({j: 1.0 for j in idx}, -inf, by_name[op].options[k].rate_at(sum(counts[keys[j - 1]] for j in idx))))
    on_edges = {i for e in edges for i in (e.producer, e.consumer)}
    for i, d in enumerate(demands):  # work * T <= capacity; = the items/s served where they set network traffic
        row = {0: d.work_per_item}
        row.update({j: -1.0 for j, (op, _, _) in enumerate(keys, start=1) if op == d.name})
        rows.append((row, 0.0 if i in on_edges else -inf, 0.0))
    for nc in cluster.node_classes:
        if nc.host_device_bandwidth_bps > 0:
            row = {j: by_name[op].options[k].bandwidth_bytes_per_item / 1e9 for j, (op, k, c) in enumerate(keys, start=1)
                   if c == nc.name and by_name[op].options[k].bandwidth_bytes_per_item > 0}
            if row:
                rows.append((row, -inf, nc.host_device_bandwidth_bps / 1e9 * nc.count))
    for nc in cluster.node_classes:
        inbound: dict[int, float] = {}
        outbound: dict[int, float] = {}
        for e in edges:
            consumed = {j: e.consumed_bytes_per_item / 1e9 for j, (op, _, c) in enumerate(keys, start=1)
                        if c == nc.name and op == demands[e.consumer].name}
            produced = {j: e.produced_bytes_per_item / 1e9 for j, (op, _, c) in enumerate(keys, start=1)
                        if c == nc.name and op == demands[e.producer].name}
            inbound.update(consumed)
            outbound.update(produced)
            if consumed and produced:  # local <= consumed and local <= produced
                local = len(upper)
                upper.append(inf)
                rows.append(({local: 1.0, **{j: -v for j, v in consumed.items()}}, -inf, 0.0))
                rows.append(({local: 1.0, **{j: -v for j, v in produced.items()}}, -inf, 0.0))
                inbound[local] = outbound[local] = -1.0
        if nc.nic_bandwidth_bps > 0:
            rows += [(row, -inf, nc.nic_bandwidth_bps / 1e9 * nc.count) for row in (inbound, outbound) if row]
    nvar = len(upper)
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    cost = np.zeros(nvar)
    cost[0] = -1.0
    h.addCols(nvar, cost, np.zeros(nvar), np.array(upper), 0, np.array([], dtype=np.int32), np.array([], dtype=np.int32), np.array([]))
    starts = np.cumsum([0] + [len(r) for r, _, _ in rows[:-1]]).astype(np.int32)
    index = np.array([j for r, _, _ in rows for j in r], dtype=np.int32)
    value = np.array([v for r, _, _ in rows for v in r.values()])
    h.addRows(len(rows), np.array([lo for _, lo, _ in rows]), np.array([hi for _, _, hi in rows]), len(index), starts, index, value)
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        raise RuntimeError(f"throughput LP failed: {h.modelStatusToString(h.getModelStatus())}")
    return float(h.getSolution().col_value[0])
