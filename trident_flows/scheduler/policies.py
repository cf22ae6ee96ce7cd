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
  ``"module:factory"``, imported lazily. The caller supplies ``spec=`` (the PipelineSpec) and
  ``cluster=`` (a ClusterSpec); every other option is a field of the policy's settings:
  each registered policy declares ``settings_type``, a frozen, validated dataclass
  (``TridentSettings``, ``DS2Settings``, ``ThresholdSettings``, ``StaticSettings``), built by
  ``policy_settings(name, options)`` and passed as the factory's ``settings``. An unknown name is
  refused listing the available ones; an unknown option is refused naming the closest known one
  and all of them, a bad value naming the field, the value and what to change, so a misspelt
  option is never silently ignored. A factory without ``settings_type`` (a test's policy) is
  called with the options as keywords, checked against its signature (``check_options``; one
  taking ``**options`` takes any).
- ``DEFAULT_POLICY`` (``trident``) is the policy ``trident-flows run`` and the Prefect flows use
  unless told otherwise (``--policy static`` / ``policy="static"`` runs the pipeline as configured).
"""

from __future__ import annotations

import importlib
import inspect
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

from trident_flows.core.state import RunnerState
from trident_flows.core.types import BatchSample, Plan
from trident_flows.scheduler.settings import settings_from_options, unknown_options

DEFAULT_POLICY = "trident"
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


@dataclass(frozen=True)
class StaticSettings:
    """The static policy has no options."""


class StaticPolicy:
    """Keep the pipeline's initial configuration: never changes anything."""

    name = "static"
    settings_type = StaticSettings

    def __init__(self, spec: Any | None = None, cluster: Any | None = None, settings: StaticSettings | None = None) -> None:
        self.settings = settings if settings is not None else StaticSettings()

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
    if getattr(factory, "settings_type", None) is None:
        check_options(name, factory, options)
        return factory(**options)
    supplied = {key: options.pop(key) for key in _SUPPLIED if key in options}
    return factory(**supplied, settings=policy_settings(name, options))


# What the caller supplies to every factory rather than the user: not among the policy's options.
_SUPPLIED = ("spec", "cluster")


def policy_settings(name: str, options: Mapping[str, Any]) -> Any:
    """The validated settings (its ``settings_type``) of the policy registered as ``name``, from ``options``."""
    factory = policy_factory(name)
    settings_type = getattr(factory, "settings_type", None)
    if settings_type is None:
        raise ValueError(f"{name}: the policy declares no settings_type; its options are its factory's keyword parameters")
    return settings_from_options(name, settings_type, options)


def check_options(policy: str, factory: Callable[..., Any], options: Mapping[str, Any]) -> None:
    """Refuse options that ``factory`` does not take as keywords, naming the closest known one and all of them."""
    params = inspect.signature(factory).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    keywords = {n for n, p in params.items() if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
    unknown = [n for n in options if n not in keywords]
    if unknown:
        raise unknown_options(policy, unknown, keywords - set(_SUPPLIED))
