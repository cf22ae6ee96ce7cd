"""Scheduling policies by name: the interface every policy implements, and the registry.

Contract:
- A policy has ``name`` and ``decide(state, samples) -> Decision``: a function of the runner's
  ``RunnerState``, the ``BatchSample``s since its last call and its own history, returning a
  ``core.decision.Decision``. Applying the plan is the caller's step.
- ``make_policy(name, **options)`` builds a registered policy (``POLICIES``: name ->
  ``"module:factory"``, imported lazily). ``spec=`` and ``cluster=`` come from the caller; every
  other option is a field of the policy's ``settings_type`` or of one of its sections (built by ``policy_settings``). An
  unknown name, an unknown option (naming the closest) or a bad value is refused, so a misspelt
  option is never silently ignored; a factory without ``settings_type`` gets the options as
  keywords, checked against its signature (``check_options``).
- ``DEFAULT_POLICY`` (``trident``) is what ``trident-flows run`` and the Prefect flows use unless
  told otherwise (``static`` runs the pipeline as configured).
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

from trident_flows.core.decision import Decision
from trident_flows.core.state import RunnerState
from trident_flows.core.types import BatchSample
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

    def decide(self, state: RunnerState, samples: Sequence[BatchSample]) -> Decision: ...


@dataclass(frozen=True)
class StaticSettings:
    """The static policy has no options."""


class StaticPolicy:
    """Keep the pipeline's initial configuration: never changes anything."""

    name = "static"
    settings_type = StaticSettings

    def __init__(self, spec: Any | None = None, cluster: Any | None = None, settings: StaticSettings | None = None) -> None:
        self.settings = settings if settings is not None else StaticSettings()

    def decide(self, state: RunnerState, samples: Sequence[BatchSample]) -> Decision:
        return Decision.no_change()


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
