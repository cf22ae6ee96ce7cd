"""The apply step every control loop shares: hand a plan to a runner and tell the policy how it went.

Contract: ``apply_plan(apply, plan, policy)`` calls ``apply(plan)`` (a runner's ``apply``, local or
through Ray) and returns an ``Applied``: the ``ApplyReport`` and its ``ApplyOutcome``, or, when
``apply`` raised, no report, a refused outcome and the exception as ``error``
("TypeName: message"); a refused plan never stops the loop. The outcome then goes to the policy's
``observe_apply(plan, outcome)`` when it has one (``tell_policy``; a loop that applies in another
place than where its policy lives, such as the Prefect sidecar's ``roll-out`` task, calls
``apply_plan`` without a policy there and ``tell_policy`` where the policy is). What a loop writes
about it (log lines, counters) stays the loop's own.
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
