"""Allocations: the (config, replicas) groups each operator of a pipeline runs, as the benchmarks' searches
find them and their references (the best static in hindsight, the oracle) run them.

Contract: an ``Allocation`` is a tuple, in pipeline order, of ``(operator, ((OpConfig, replicas), ...))``
(more than one group: mixed devices or batch sizes). ``allocation_of`` turns a ``StaticConfig`` into one;
``label`` writes it for people; ``to_data`` / ``from_data`` round-trip it through JSON; ``start_config``
is the one-group-per-operator configuration a run starts from (each operator's largest group), which one
plan then completes (``completion_plan``, None when there is nothing to complete).
"""

from __future__ import annotations

from typing import Any, Sequence, Union

from trident_flows.core.types import OpConfig, OperatorPlan, Plan, ReplicaGroup
from trident_flows.sim.static_search import StaticConfig

Allocation = tuple[tuple[str, tuple[tuple[OpConfig, int], ...]], ...]


def allocation_of(config: Union[StaticConfig, Allocation]) -> Allocation:
    """``config`` as an ``Allocation`` (a ``StaticConfig`` is one group per operator)."""
    if isinstance(config, StaticConfig):
        return tuple((name, ((c, r),)) for name, c, r in config.assignment)
    return config


def label(allocation: Allocation) -> str:
    return ", ".join(f"{name} {n}x{c.label()}" for name, groups in allocation for c, n in groups)


def to_data(allocation: Allocation) -> list[Any]:
    return [[name, [[c.to_dict(), n] for c, n in groups]] for name, groups in allocation]


def from_data(data: Sequence[Any]) -> Allocation:
    return tuple((name, tuple((OpConfig.from_dict(c), int(n)) for c, n in groups)) for name, groups in data)


def start_config(allocation: Allocation) -> StaticConfig:
    """Each operator's largest group: what a run of ``allocation`` starts with."""
    return StaticConfig(tuple((name, *max(groups, key=lambda g: g[1])) for name, groups in allocation), 0.0)


def completion_plan(allocation: Allocation) -> Plan | None:
    """The plan that brings a run started with ``start_config`` to the whole ``allocation`` (None: nothing to add)."""
    if all(len(groups) == 1 for _, groups in allocation):
        return None
    return Plan(tuple(OperatorPlan(name, tuple(ReplicaGroup(c, n) for c, n in groups), "allocation") for name, groups in allocation),
                0.0, "the allocation measured")
