"""Words for a placement: what each operator's plan changes, and why a problem has no solution.

Contract:
- ``operator_reason(d, cluster, new, cur, throughput)``: an operator's line of a plan: bottleneck or
  its headroom, its replica groups (or the change against the current ones ``cur``), and any GPU
  share raised so a replica's device memory fits one GPU.
- ``diagnose_infeasible(demands, cluster, eligible)``: the resource the operators' minimum replicas
  over-subscribe, with what to change (the message of the ``PlacementError`` raised for it).
"""

from __future__ import annotations

import math
from typing import Sequence

from trident_flows.core.types import ClusterSpec
from trident_flows.scheduler.placement.model import Key, class_capacity, effective_gpus, operator_capacity, usage_vector
from trident_flows.scheduler.placement.types import GiB, OperatorDemand


def diagnose_infeasible(demands: Sequence[OperatorDemand], cluster: ClusterSpec, eligible: dict[Key, int]) -> str:
    """Name the resource the operators' minimum replicas over-subscribe."""
    totals = [sum(class_capacity(nc)[i] for nc in cluster.node_classes) for i in range(3)]
    need = [0.0, 0.0, 0.0]
    for d in demands:
        vecs = [usage_vector(d.options[k], cluster.node_class(c)) for (op, k, c) in eligible if op == d.name]
        for i in range(3):
            need[i] += d.min_replicas * min(v[i] for v in vecs)
    units = [("CPUs", lambda v: f"{v:g}"), ("GPUs", lambda v: f"{v:g}"), ("host memory", lambda v: f"{v / GiB:.3g} GiB")]
    for i, (name, fmt) in enumerate(units):
        if need[i] > totals[i] + 1e-9:
            return (f"the cluster cannot host min_replicas of every operator: they need at least {fmt(need[i])} {name}, "
                    f"the cluster has {fmt(totals[i])}; lower min_replicas, choose smaller configs or add nodes")
    return ("the operators' minimum replicas do not fit together on the nodes (CPU, GPU and memory per node combined); "
            "lower min_replicas, allow more node classes or add nodes")


def _describe(groups: dict[tuple[str, str], int]) -> str:
    return ", ".join(f"{n} x {label} on {c}" for (label, c), n in sorted(groups.items()) if n) or "none"


def operator_reason(d: OperatorDemand, cluster: ClusterSpec, new: dict[Key, int], cur: dict[Key, int] | None,
                     throughput: float) -> str:
    cap = operator_capacity(d, new) / d.work_per_item
    headroom = cap / throughput - 1 if throughput > 0 else math.inf
    head = "bottleneck" if headroom <= 1e-6 else f"headroom {headroom:.0%}"
    label = lambda k: d.options[k].config.label()  # noqa: E731
    new_g = {(label(k), c): n for (op, k, c), n in new.items() if op == d.name and n}
    raised = [f"gpus {d.options[k].config.gpus:g}->{effective_gpus(d.options[k], cluster.node_class(c)):.3g} on {c} so "
              f"{d.options[k].device_mem_bytes / GiB:.3g} GiB per replica fits one GPU"
              for (op, k, c), n in new.items() if op == d.name and n and effective_gpus(d.options[k], cluster.node_class(c)) > d.options[k].config.gpus]
    note = f" ({'; '.join(raised)})" if raised else ""
    if cur is None:
        return f"{head}: {_describe(new_g)}{note}"
    cur_g = {(label(k), c): n for (op, k, c), n in cur.items() if op == d.name and n}
    if cur_g == new_g:
        return f"unchanged ({head})"
    changes = []
    for key in sorted(set(new_g) | set(cur_g)):
        delta = new_g.get(key, 0) - cur_g.get(key, 0)
        if delta:
            changes.append(f"{delta:+d} replica{'s' if abs(delta) != 1 else ''} {key[0]} on {key[1]}")
    return f"{head}: {', '.join(changes)}{note}"
