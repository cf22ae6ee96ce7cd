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
  control loop passes ``spec=`` the PipelineSpec and ``cluster=`` a ClusterSpec). An unknown
  name is refused listing the available ones; an option the factory does not take (a keyword
  parameter of its signature; a factory taking ``**options`` takes any) is refused naming the
  closest known option and all of them (``check_options``), so a misspelt option is never
  silently ignored.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

from trident_flows.core.state import RunnerState
from trident_flows.core.types import BatchSample, Plan

POLICIES: dict[str, str] = {
    "static": "trident_flows.scheduler.policies:StaticPolicy",
    "ds2": "trident_flows.scheduler.ds2:DS2Policy",
    "threshold": "trident_flows.scheduler.threshold:ThresholdPolicy",
    "trident": "trident_flows.scheduler.trident_policy:TridentPolicy",
}


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

    def __init__(self, spec: Any | None = None, cluster: Any | None = None) -> None:
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


def policy_factory(name: str) -> Callable[..., Policy]:
    """The factory registered as ``name``; an unknown name is refused listing the available ones."""
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; available policies: {', '.join(available_policies())}")
    module, _, attr = POLICIES[name].partition(":")
    return getattr(importlib.import_module(module), attr)


def make_policy(name: str, **options: Any) -> Policy:
    """Build the policy registered as ``name`` (see the module docstring)."""
    factory = policy_factory(name)
    check_options(name, factory, options)
    return factory(**options)


# What the caller supplies to every factory rather than the user: not listed as the policy's options.
_SUPPLIED = ("spec", "cluster")


def check_options(policy: str, factory: Callable[..., Any], options: Mapping[str, Any]) -> None:
    """Refuse options that ``factory`` does not take, naming the closest known one and all of them."""
    params = inspect.signature(factory).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    keywords = {n for n, p in params.items() if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
    unknown = [n for n in options if n not in keywords]
    if not unknown:
        return
    known = sorted(keywords - set(_SUPPLIED))
    named = []
    for n in unknown:
        close = difflib.get_close_matches(n, known, n=1)
        named.append(f"{n!r} (did you mean {close[0]!r}?)" if close else repr(n))
    raise ValueError(f"{policy}: unknown option{'s' if len(unknown) > 1 else ''} {', '.join(named)}; "
                     f"known options: {', '.join(known) or 'none'}")
