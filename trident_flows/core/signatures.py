"""Signatures of a plan and of what runs, for telling an unchanged re-issue of a refused plan
from a new one.

Contract (pure functions on the core value types):
- ``config_counts(groups)``: replicas per config of some ``ReplicaGroup``s (a config named by
  several groups counts once, summed).
- ``plan_signature(plan)``: what a plan asks for, as a hashable value: replicas per operator
  and config, and its canaries.
- ``placement_signature(state)``: what runs: non-draining replicas per (operator, config,
  canary or not).
Both the Trident policy (it never re-issues a refused plan) and the control loop (it counts a
plan re-issued unchanged after a refusal) compare these.
"""

from __future__ import annotations

from typing import Iterable

from trident_flows.core.state import RunnerState
from trident_flows.core.types import OpConfig, Plan, ReplicaGroup


def config_counts(groups: Iterable[ReplicaGroup]) -> dict[OpConfig, int]:
    """Replicas per config of ``groups``."""
    counts: dict[OpConfig, int] = {}
    for g in groups:
        counts[g.config] = counts.get(g.config, 0) + g.replicas
    return counts


def plan_signature(plan: Plan) -> frozenset:
    """What a plan asks for (replicas per operator and config, and canaries), for telling an
    unchanged re-issue of a refused plan from a new one."""
    out = set()
    for o in plan.operators:
        for c, n in config_counts(o.groups).items():
            if n:
                out.add((o.operator, c, n))
        if o.canary is not None:
            out.add((o.operator, o.canary, "canary"))
    return frozenset(out)


def placement_signature(state: RunnerState) -> frozenset:
    """What runs: non-draining replicas per (operator, config, canary or not)."""
    counts: dict[tuple, int] = {}
    for op in state.operators:
        for r in op.active:
            counts[(op.name, r.config, r.canary)] = counts.get((op.name, r.config, r.canary), 0) + 1
    return frozenset((*key, n) for key, n in counts.items())
