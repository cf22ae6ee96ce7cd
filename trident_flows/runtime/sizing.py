"""Sizing a pipeline's starting configuration to the cluster it is given.

A built-in starting configuration names whole CPUs and GPUs per replica; on a smaller cluster it
would be refused. This module shrinks it until it fits, so a pipeline runs on any machine that
runs Python, and a policy grows it from there.

Contract:
- ``fit_to_cluster(spec, cpus, gpus) -> Sizing``: the spec unchanged when it fits; else moved off
  absent GPUs, down to ``min_replicas``, then onto fractional GPUs and CPUs until it fits.
  ``Sizing.notes`` has one line per change, for the console.
- ``fit_to_nodes(spec, nodes)``: the same, with the starting replicas also fitting node by node.
- A spec that cannot fit raises ``RuntimeConfigError`` naming the operator and the option to change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from trident_flows.core.state import RuntimeConfigError
from trident_flows.core.types import CPU, ConfigSpace, OpConfig
from trident_flows.runtime.nodes import pack
from trident_flows.runtime.spec import OperatorSpec, PipelineSpec

# Ray keeps fractional resources to four decimals: shares are rounded down to that grid so
# the replicas' sum never exceeds the cluster.
_GRID = 10_000


@dataclass(frozen=True)
class Sizing:
    """The spec to run and what was changed to make it fit (empty: it fitted as built)."""

    spec: PipelineSpec
    notes: tuple[str, ...] = ()


def _need(ops: list[OperatorSpec]) -> tuple[float, float]:
    return (sum(o.config.cpus * o.replicas for o in ops), sum(o.config.gpus * o.replicas for o in ops))


def _fits(ops: list[OperatorSpec], cpus: float, gpus: float) -> bool:
    need_cpus, need_gpus = _need(ops)
    return need_cpus <= cpus + 1e-9 and need_gpus <= gpus + 1e-9 and all(o.config.gpus <= gpus + 1e-9 for o in ops)


def _share(have: float, need: float) -> float:
    """The fraction of its resources each replica keeps: ``have / need`` rounded down to Ray's grid."""
    return math.floor(have / need * _GRID) / _GRID


def _scaled(value: float, factor: float) -> float:
    scaled = math.floor(value * factor * _GRID) / _GRID
    return float(math.floor(scaled)) if scaled > 1 else scaled  # Ray takes whole numbers above one


def _scale_space(space: ConfigSpace, cpu_factor: float, gpu_factor: float) -> ConfigSpace:
    devices = dict(space.resources)
    devices.update({d: space.resources_for(d) for d in space.devices})
    resources = tuple((d, (_scaled(c, cpu_factor), _scaled(g, gpu_factor) if d != CPU else g)) for d, (c, g) in devices.items())
    return replace(space, resources=resources)


def _to_cpu(op: OperatorSpec) -> OperatorSpec:
    if CPU not in op.space.devices:
        raise RuntimeConfigError(f"operator {op.name!r} runs only on {op.config.device} and the cluster has no GPUs: "
                                 "start Ray with (logical) GPUs, e.g. --gpus 1")
    cpus, _ = op.space.resources_for(CPU)
    return replace(op, config=op.config.with_changes(device=CPU, cpus=cpus, gpus=0.0))


def fit_to_cluster(spec: PipelineSpec, cpus: float, gpus: float) -> Sizing:
    """Shrink ``spec``'s starting configuration until it fits ``cpus`` logical CPUs and ``gpus`` logical GPUs.

    A spec that fits is returned unchanged (a run on a cluster it fits keeps its configuration exactly).
    Otherwise, in this order, until it fits:
    1. with no GPUs, an operator starting on an accelerator moves to the CPU (same batch size and knobs)
       when its search space allows the CPU; one that cannot run on a CPU is refused;
    2. operators above their ``min_replicas`` give up replicas, the one holding most first;
    3. GPU replicas share the GPUs (each holds the same fraction of its GPUs);
    4. every replica holds the same fraction of its CPUs (fractional CPUs, as Ray allows), and the
       operator's search space is scaled alike, so a replica the scheduler adds later is of the same size.
    Fractional Ray CPUs are only an accounting: replicas sharing a core really share it (real operators
    through the OS, emulated ones through the node's core pool, ``runtime.devices.node_cores``)."""
    ops = list(spec.operators)
    if _fits(ops, cpus, gpus):
        return Sizing(spec)
    if cpus <= 0:
        raise RuntimeConfigError(f"the cluster has no CPUs ({cpus:g}): start Ray with some (--cpus)")
    notes: list[str] = []
    if gpus <= 0:
        moved = [o.name for o in ops if o.config.gpus > 0]
        ops = [_to_cpu(o) if o.config.gpus > 0 else o for o in ops]
        if moved:
            notes.append(f"no GPUs: {', '.join(moved)} run{'s' if len(moved) == 1 else ''} on the CPU")
    if not _fits(ops, cpus, gpus):
        before = sum(o.replicas for o in ops)
        while not _fits(ops, cpus, gpus):
            spare = [k for k, o in enumerate(ops) if o.replicas > o.min_replicas]
            if not spare:
                break
            k = max(spare, key=lambda i: (ops[i].replicas, ops[i].config.cpus, -i))
            ops[k] = replace(ops[k], replicas=ops[k].replicas - 1)
        if sum(o.replicas for o in ops) < before:
            notes.append(f"replicas {before} -> {sum(o.replicas for o in ops)} (each operator keeps at least its minimum)")
    need_cpus, need_gpus = _need(ops)
    gpu_factor = _share(gpus, need_gpus) if need_gpus > gpus + 1e-9 else 1.0
    cpu_factor = _share(cpus, need_cpus) if need_cpus > cpus + 1e-9 else 1.0
    if gpu_factor < 1.0 or cpu_factor < 1.0:
        ops = [replace(o, config=OpConfig(o.config.device, o.config.batch_size, _scaled(o.config.cpus, cpu_factor),
                                          _scaled(o.config.gpus, gpu_factor), o.config.knobs),
                       space=_scale_space(o.space, cpu_factor, gpu_factor)) for o in ops]
        if cpu_factor < 1.0:
            notes.append(f"{sum(o.replicas for o in ops)} replicas share {cpus:g} CPUs, each holding "
                         f"{' or '.join(sorted({f'{o.config.cpus:g}' for o in ops}))} CPU")
        if gpu_factor < 1.0:
            notes.append(f"GPU replicas share the GPUs: each holds {gpu_factor:.3g} of the GPUs it was given")
    if not _fits(ops, cpus, gpus):
        need_cpus, need_gpus = _need(ops)
        raise RuntimeConfigError(f"pipeline {spec.name!r} needs {need_cpus:g} CPUs and {need_gpus:g} GPUs even at its minimum replicas "
                                 f"but the cluster has {cpus:g} CPUs and {gpus:g} GPUs; start Ray with more (--cpus, --gpus)")
    return Sizing(replace(spec, operators=tuple(ops)), tuple(notes))


# Steps of ``fit_to_nodes``: the CPUs offered to ``fit_to_cluster`` shrink by 2% of the cluster's
# CPUs per step (fractional shares are on a 1e-4 grid; finer steps only add iterations).
_NODE_STEPS = 50


def fit_to_nodes(spec: PipelineSpec, nodes) -> Sizing:
    """``fit_to_cluster`` whose starting replicas also fit node by node (``runtime.nodes.pack``): when the
    cluster's totals fit but the nodes do not (five replicas of 0.83 CPU on nodes of 1, 2 and 2 CPUs), the
    CPUs given to ``fit_to_cluster`` are lowered step by step until the result packs."""
    cpus, gpus = sum(n.cpus for n in nodes), sum(n.gpus for n in nodes)
    sizing = fit_to_cluster(spec, cpus, gpus)
    for step in range(1, _NODE_STEPS):
        replicas = [(o.name, None, o.config.cpus, o.config.gpus) for o in sizing.spec.operators for _ in range(o.replicas)]
        if len(nodes) <= 1 or not pack(nodes, replicas):
            return sizing
        sizing = fit_to_cluster(spec, cpus * (1 - step / _NODE_STEPS), gpus)
        sizing = Sizing(sizing.spec, sizing.notes + (f"fitted node by node to {len(nodes)} nodes",))
    raise RuntimeConfigError(f"pipeline {spec.name!r}: its starting replicas do not fit the {len(nodes)} nodes one by one; "
                             "start it with fewer replicas or add nodes")
