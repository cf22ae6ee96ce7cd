"""Scheduling policies by name: the interface every policy implements, and the registry.

Contract:
- A policy is an object with ``name`` and ``decide(state, samples) -> Plan | None``: a pure
  function of the runner's ``RunnerState`` and the ``BatchSample``s that arrived since its
  last call (it may keep its own history). ``None`` means "no change"; a ``Plan`` carries
  its reason (``Plan.reason`` and per-operator ``OperatorPlan.reason``). Applying the plan
  is the caller's separate step (``PipelineRunner.apply``).
- ``decide_once(policy, state, samples)`` wraps one call into a frozen ``PolicyDecision``
  (time, policy, plan or None, reason), the record the control loop logs; a policy that keeps
  a ``last_record`` (e.g. Trident's ``TickRecord``) has it added as ``detail``.
- ``make_policy(name, **options)`` builds a registered policy; ``POLICIES`` maps a name to
  ``"module:factory"``, imported lazily. Factories are called with keyword options (the
  control loop passes ``spec=`` the PipelineSpec and ``cluster=`` a ClusterSpec); a factory
  ignores options it does not need. An unknown name is refused listing the available ones.
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass
from typing import Any, Protocol, Sequence, runtime_checkable

from trident_flows.core.state import RunnerState
from trident_flows.core.types import BatchSample, Plan

POLICIES: dict[str, str] = {
    "static": "trident_flows.scheduler.policies:StaticPolicy",
    "ds2": "trident_flows.scheduler.ds2:DS2Policy",
    "threshold": "trident_flows.scheduler.threshold:ThresholdPolicy",
    "trident": "trident_flows.scheduler.trident_policy:TridentPolicy",
}
PLANNED: tuple[str, ...] = ()


@runtime_checkable
class Policy(Protocol):
    name: str

    def decide(self, state: RunnerState, samples: Sequence[BatchSample]) -> Plan | None: ...


@dataclass(frozen=True)
class PolicyDecision:
    """One tick of a policy: the plan it chose (or None) and why."""

    at: float
    policy: str
    plan: Plan | None
    reason: str
    detail: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        data = {"at": self.at, "policy": self.policy, "reason": self.reason, "plan": self.plan.to_dict() if self.plan else None}
        if self.detail is not None:
            data["detail"] = self.detail
        return data


class StaticPolicy:
    """Keep the pipeline's initial configuration: never changes anything."""

    name = "static"

    def __init__(self, **_options: Any) -> None:
        pass

    def decide(self, state: RunnerState, samples: Sequence[BatchSample]) -> Plan | None:
        return None


def decide_once(policy: Policy, state: RunnerState, samples: Sequence[BatchSample]) -> PolicyDecision:
    plan = policy.decide(state, samples)
    reason = (plan.reason or "plan without a reason") if plan is not None else "no change"
    record = getattr(policy, "last_record", None)
    return PolicyDecision(time.time(), policy.name, plan, reason, record.to_dict() if hasattr(record, "to_dict") else None)


def available_policies() -> list[str]:
    return sorted(POLICIES)


def make_policy(name: str, **options: Any) -> Policy:
    """Build the policy registered as ``name`` (see the module docstring)."""
    if name not in POLICIES:
        planned = f" ({name!r} is planned but not built yet)" if name in PLANNED else ""
        raise ValueError(f"unknown policy {name!r}{planned}; available policies: {', '.join(available_policies())}")
    module, _, attr = POLICIES[name].partition(":")
    factory = getattr(importlib.import_module(module), attr)
    return factory(**options)
