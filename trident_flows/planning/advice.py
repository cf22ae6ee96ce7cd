"""Live advice for a running pipeline: the binding resource and what one more node of each class would buy.

Contract:
- ``advise(state, catalogue)`` reads a ``RunnerState``: per operator its measured per-replica rate
  (items over its warm replicas' busy seconds, each over the seconds it has been warm: ``warm_s``, else
  the run's less its cold start), the rows reaching it per input item (the upstream operators' rows
  forwarded per row taken: a backlog does not shrink it), its running configs as placement options (no
  cost model needed), the cluster as one class ``current``. ``measured_demands(state, warm_s=None)`` is that reading as
  ``OperatorDemand``s (``ValueError`` naming an operator that has not worked yet).
- The binding resource comes from the LP relaxation's prices (``sizing.resource_prices``); the gain
  of one more node per catalogue class is estimated from them and checked by re-solving the MILP;
  ``summary`` names the class with the most checked gain per unit of hourly price.
- ``advice_dict(state)``: the advice as plain data for the run summary and the live artifact;
  ``{}`` before any operator worked, ``{"error": ...}`` if it fails (advice never fails a run).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from trident_flows.core.state import ReplicaState, RunnerState
from trident_flows.core.types import ClusterSpec
from trident_flows.planning.catalogue import Catalogue, NodeType, load_catalogue
from trident_flows.planning.sizing import resource_prices
from trident_flows.scheduler.placement.milp import solve_placement
from trident_flows.scheduler.placement.types import OperatorDemand, PlacementOption

CURRENT = "current"
_LABEL = {"cpus": "CPU", "gpus": "GPU"}
_GPU_MEMORY = 2**50  # the current cluster's GPU memory is not known here; options measured on it carry no memory bound


@dataclass(frozen=True)
class Advice:
    binding: str                      # "cpus" or "gpus"
    items_per_s: float                # the placement's throughput on the current cluster, from the measured rates
    estimated_gain: Mapping[str, float]  # class -> relative gain of one more node, from the LP prices
    checked_gain: Mapping[str, float]    # class -> relative gain of one more node, re-solved

    price_per_hour: Mapping[str, float]  # class -> hourly price (the catalogue's)
    currency: str = "USD"

    @property
    def summary(self) -> str:
        best = max(self.checked_gain, key=lambda c: self.checked_gain[c] / self.price_per_hour[c])
        others = ", ".join(f"{c} {g:+.0%}" for c, g in self.checked_gain.items() if c != best)
        return (f"{_LABEL[self.binding]}-bound: +1 node of class {best} -> {self.checked_gain[best]:+.0%} items/s "
                f"(most gain per {self.currency}/h; {others})")

    def to_dict(self) -> dict[str, Any]:
        return {"summary": self.summary, "binding_resource": self.binding, "model_items_per_s": self.items_per_s,
                "one_more_node": {c: {"estimated_gain": self.estimated_gain[c], "checked_gain": self.checked_gain[c]}
                                  for c in self.checked_gain}}


def measured_demands(state: RunnerState, warm_s: Mapping[str, float] | None = None) -> list[OperatorDemand]:
    demands = []
    share = 1.0  # rows reaching this operator per input item: the upstream operators' rows forwarded per row taken
    for op in state.operators:
        warm = [r for r in op.replicas if r.warm and not r.draining]
        busy_s = sum(r.busy_fraction * _warm_seconds(state, r, warm_s) for r in warm)
        if not warm or op.items_in <= 0 or busy_s <= 0:
            raise ValueError(f"operator {op.name!r} has not worked yet")
        rate = op.items_in / busy_s
        configs = dict.fromkeys(r.config for r in warm)
        demands.append(OperatorDemand(op.name, share, tuple(PlacementOption.from_rate(c, rate) for c in configs)))
        share *= op.items_forwarded / op.items_in
    return demands


def _warm_seconds(state: RunnerState, replica: ReplicaState, warm_s: Mapping[str, float] | None) -> float:
    """Seconds ``replica`` has been warm: ``warm_s``'s, else as if it started with the run (the run's seconds less its cold start)."""
    if warm_s is not None and replica.replica_id in warm_s:
        return warm_s[replica.replica_id]
    return max(state.wall_s - replica.cold_start_s, 0.0)


def advise(state: RunnerState, catalogue: Catalogue) -> Advice:
    """The binding resource and the gain of one more node of each class (see the module docstring)."""
    demands = measured_demands(state)
    current = NodeType(CURRENT, state.cluster_cpus, 1.0, int(state.cluster_gpus), _GPU_MEMORY if state.cluster_gpus else 0, 1)
    nodes = Catalogue((current,) + tuple(n for n in catalogue.nodes if n.name != CURRENT), catalogue.currency, catalogue.source)
    prices = resource_prices(demands, nodes, {CURRENT: 1})
    capacity = {"cpus": current.cpus, "gpus": float(current.gpus)}
    binding = max(capacity, key=lambda r: prices.prices.get((CURRENT, r), 0.0) * capacity[r])
    base_cluster = ClusterSpec((current.node_class(1),))
    base = solve_placement(demands, base_cluster).throughput
    estimated, checked = {}, {}
    for node in catalogue.nodes:
        if node.name == CURRENT:
            continue
        estimated[node.name] = prices.gain_of_node(node) / prices.throughput if prices.throughput > 0 else 0.0
        bigger = ClusterSpec((current.node_class(1), node.node_class(1)))
        checked[node.name] = solve_placement(demands, bigger).throughput / base - 1 if base > 0 else 0.0
    return Advice(binding, base, estimated, checked, {n.name: n.price_per_hour for n in catalogue.nodes}, catalogue.currency)


def advice_dict(state: RunnerState, catalogue: Catalogue | None = None) -> dict[str, Any]:
    """``advise(...).to_dict()`` for a summary or an artifact (see the module docstring)."""
    if not state.operators or state.operators[0].items_in <= 0 or state.wall_s <= 0:
        return {}
    try:
        return advise(state, catalogue or load_catalogue()).to_dict()
    except Exception as exc:  # advice is a by-product: it must never fail the run it describes
        return {"error": f"{type(exc).__name__}: {exc}"}
