"""The utilisation-threshold baseline: Ray Data's default actor-pool autoscaling rule.

Contract:
- ``pool_utilisation(op)``: Ray Data's pool utilisation for replicas that run one batch at a time.
- ``threshold_decision(state, spec=..., up=1.75, down=0.5) -> ThresholdDecision`` (pure): per
  operator one step (+-1 replica) when utilisation crosses ``up`` or ``down``, within min/max
  replicas and the free CPUs/GPUs, each with its reason; bad thresholds raise ``ValueError``.
- ``ThresholdPolicy`` returns a ``Decision``: a roll-out of the evaluation's ``Plan`` (only the
  operators that change), else no change; its options are a ``ThresholdSettings``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from trident_flows.core.decision import Decision
from trident_flows.core.state import OperatorState, RunnerState
from trident_flows.core.types import BatchSample, Plan
from trident_flows.scheduler.replicas import free_resources, main_config, replica_limits, scaled_plan
from trident_flows.scheduler.settings import check_types, refuse, setting

UPSCALING_THRESHOLD = 1.75    # ray.data.context.DEFAULT_ACTOR_POOL_UTIL_UPSCALING_THRESHOLD (Ray 2.60)
DOWNSCALING_THRESHOLD = 0.5   # ray.data.context.DEFAULT_ACTOR_POOL_UTIL_DOWNSCALING_THRESHOLD (Ray 2.60)


@dataclass(frozen=True)
class ThresholdDecision:
    """Per operator: its utilisation and what was decided (and why); the resulting plan or None."""

    utilisation: Mapping[str, float]
    reasons: Mapping[str, str]
    plan: Plan | None
    reason: str


def pool_utilisation(op: OperatorState) -> float:
    """Batches in flight / serving replicas (warm or starting, not draining, not canaries): Ray Data 2.60's
    ``AutoscalingActorPool.get_pool_util`` (tasks in flight / (max actor concurrency x pool size)) with our
    concurrency of 1. A pool of size 0 has utilisation ``inf`` (scale up at once)."""
    serving = [r for r in op.active if not r.canary]
    if not serving:
        return math.inf
    return sum(r.inflight for r in serving) / len(serving)


def threshold_decision(state: RunnerState, *, spec: Any | None = None, up: float = UPSCALING_THRESHOLD,
                       down: float = DOWNSCALING_THRESHOLD) -> ThresholdDecision:
    """One utilisation-threshold decision for every operator, like Ray Data's ``DefaultActorAutoscaler``: no change
    before the operator received any input; utilisation >= ``up``: one more replica, unless at ``max_replicas`` or
    the free CPUs/GPUs (after the other scale-ups of this decision) do not fit one more of its config; utilisation
    <= ``down``: one fewer, unless at ``min_replicas`` or a replica is still starting (Ray: "no downscaling while
    actors are pending"). One step (+-1 replica) per operator per decision, each with its reason; Ray Data itself
    scales up by ``max(1, ceil(size * (util / up - 1)))``."""
    if not 0 <= down < up:
        raise ValueError(f"threshold: need 0 <= down < up, got down={down} up={up}")
    free_cpus, free_gpus = free_resources(state)
    utils, reasons, ops = {}, {}, []
    for op in state.operators:
        util = pool_utilisation(op)
        utils[op.name] = util
        size = sum(op.configs(include_canary=False).values())
        lo, hi = replica_limits(op.name, spec)
        config = main_config(op, spec)
        if op.items_in == 0 and size > 0 and not any(r.inflight for r in op.active):
            reasons[op.name] = "no inputs received yet"
            continue
        if util >= up:
            if size >= hi:
                reasons[op.name] = f"utilisation {util:.2f} >= {up} but at max_replicas={hi}"
            elif config is None or config.cpus > free_cpus + 1e-9 or config.gpus > free_gpus + 1e-9:
                need = "" if config is None else f" (one replica needs {config.cpus:g} CPUs, {config.gpus:g} GPUs)"
                reasons[op.name] = f"utilisation {util:.2f} >= {up} but the free resources ({free_cpus:g} CPUs, {free_gpus:g} GPUs) do not fit one more replica{need}"
            else:
                free_cpus -= config.cpus
                free_gpus -= config.gpus
                reasons[op.name] = f"utilisation {util:.2f} >= {up}: scale up {size} -> {size + 1}"
                ops.append(scaled_plan(op, size + 1, reasons[op.name], spec))
        elif util <= down:
            if size <= lo:
                reasons[op.name] = f"utilisation {util:.2f} <= {down} but at min_replicas={lo}"
            elif any(not r.warm for r in op.active):
                reasons[op.name] = f"utilisation {util:.2f} <= {down} but a replica is still starting"
            else:
                reasons[op.name] = f"utilisation {util:.2f} <= {down}: scale down {size} -> {size - 1}"
                ops.append(scaled_plan(op, size - 1, reasons[op.name], spec))
        else:
            reasons[op.name] = f"utilisation {util:.2f} within [{down}, {up}]"
    changed = [o.operator for o in ops]
    reason = ("utilisation thresholds: " + "; ".join(f"{n}: {reasons[n]}" for n in changed)) if ops else "no pool crossed a threshold"
    return ThresholdDecision(utils, reasons, Plan(tuple(ops), 0.0, reason) if ops else None, reason)


@dataclass(frozen=True)
class ThresholdSettings:
    """The threshold policy's options, validated at construction (see ``scheduler/settings.py``)."""

    up: float = setting(UPSCALING_THRESHOLD, "pool utilisation (batches in flight per serving replica) at or above which a replica is added")
    down: float = setting(DOWNSCALING_THRESHOLD, "pool utilisation at or below which a replica is removed, in [0, up)")

    def __post_init__(self) -> None:
        check_types("threshold", self)
        if not 0 <= self.down < self.up:
            raise refuse("threshold", "down", self.down, f"need 0 <= down < up (up={self.up!r}): lower down or raise up")


class ThresholdPolicy:
    """Ray Data's utilisation-threshold autoscaling behind the ``Policy`` interface."""

    name = "threshold"
    settings_type = ThresholdSettings

    def __init__(self, spec: Any | None = None, cluster: Any | None = None, settings: ThresholdSettings | None = None) -> None:
        settings = settings if settings is not None else ThresholdSettings()
        self.settings = settings
        self.spec = spec
        self.up = settings.up
        self.down = settings.down
        self.last: ThresholdDecision | None = None

    def decide(self, state: RunnerState, samples: Sequence[BatchSample]) -> Decision:
        self.last = threshold_decision(state, spec=self.spec, up=self.up, down=self.down)
        return Decision.roll_out(self.last.plan, self.last.reason) if self.last.plan is not None else Decision.no_change(self.last.reason)
