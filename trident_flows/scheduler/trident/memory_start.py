"""Where a run starts when Trident remembers an allocation: the pipeline's spec moved to it with the least change (pure).

Contract: ``start_in(spec, allocation, cluster) -> (spec, moved)``: each operator whose remembered allocation is one
config within its replica bounds starts in that config; an operator the memory gives more replicas starts with them,
and the CPUs and GPUs they need come from the operators it gives fewer, the largest surplus first, each down to the
memory's count and no further than the growth needs. ``moved`` names each operator changed (``"embed 4xcpu/b8"``);
``spec`` comes back unchanged, with no move, when nothing would change or the growth does not fit ``cluster``
(None: no limit).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from trident_flows.core.types import ClusterSpec, OpConfig
from trident_flows.scheduler.trident.memory import Allocation


def start_in(spec: Any, allocation: Mapping[str, Allocation], cluster: ClusterSpec | None) -> tuple[Any, list[str]]:
    """``spec`` moved to the remembered ``allocation`` with the least change (see the module docstring)."""
    remembered: dict[str, tuple[OpConfig, int]] = {}
    for op in spec.operators:
        groups = allocation.get(op.name, ())
        if len(groups) == 1 and op.min_replicas <= groups[0][1] <= op.max_replicas:
            remembered[op.name] = groups[0]
    target = {op.name: (remembered[op.name][0], max(op.replicas, remembered[op.name][1])) if op.name in remembered
              else (op.config, op.replicas) for op in spec.operators}

    def over() -> bool:
        return cluster is not None and (sum(c.cpus * n for c, n in target.values()) > cluster.total_cpus + 1e-9
                                        or sum(c.gpus * n for c, n in target.values()) > cluster.total_gpus + 1e-9)

    while over():
        surplus = {name: target[name][1] - n for name, (_, n) in remembered.items() if target[name][1] > n}
        if not surplus:
            return spec, []
        name = max(surplus, key=lambda k: (surplus[k], k))
        target[name] = (target[name][0], target[name][1] - 1)
    operators, moved = [], []
    for op in spec.operators:
        config, n = target[op.name]
        if (config, n) != (op.config, op.replicas):
            operators.append(replace(op, config=config, replicas=n))
            moved.append(f"{op.name} {n}x{config.label()}")
        else:
            operators.append(op)
    return (replace(spec, operators=tuple(operators)), moved) if moved else (spec, [])
