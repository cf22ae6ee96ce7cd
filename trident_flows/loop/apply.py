"""The apply step: hand a plan to a runner and tell the policy how it went.

Contract: ``apply_plan(apply, plan, policy=None)`` calls ``apply(plan)`` (a runner's ``apply``,
local or through Ray) and returns an ``Applied``: the ``ApplyReport`` and its ``ApplyOutcome``,
or, when ``apply`` raised, no report, a refused outcome and the exception as ``error``
("TypeName: message"): a refused plan never stops a loop. The outcome goes to the policy's
``observe_apply(plan, outcome)`` when it has one (``tell_policy``). ``TickLoop`` tells the policy
itself, so its appliers call ``apply_plan`` without one (the sidecar's ``roll-out`` task applies
in another process than the policy's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from trident_flows.core.state import ApplyOutcome, ApplyReport
from trident_flows.core.types import Plan


@dataclass(frozen=True)
class Applied:
    """What became of one plan: the runner's report (None when ``apply`` raised), the outcome, and
    the exception text ("" unless ``apply`` raised)."""

    report: ApplyReport | None
    outcome: ApplyOutcome
    error: str = ""


def apply_plan(apply: Callable[[Plan], ApplyReport], plan: Plan, policy: Any | None = None) -> Applied:
    """Apply ``plan`` and report its outcome to ``policy`` (see the module docstring)."""
    try:
        report = apply(plan)
        applied = Applied(report, report.outcome)
    except Exception as exc:  # noqa: BLE001 - a refused plan goes back to the policy; the pipeline keeps its configuration
        error = f"{type(exc).__name__}: {exc}"
        applied = Applied(None, ApplyOutcome.refused(error), error)
    tell_policy(policy, plan, applied.outcome)
    return applied


def tell_policy(policy: Any | None, plan: Plan, outcome: ApplyOutcome) -> None:
    """Give ``policy`` the outcome of its ``plan`` through ``observe_apply`` when it has one."""
    observe = getattr(policy, "observe_apply", None)
    if observe is not None:
        observe(plan, outcome)
