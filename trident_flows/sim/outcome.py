"""What a simulated apply reports, in one place.

Contract: ``apply_report(steps_done, steps_total, seconds, before, during, error, reason)`` builds the
``ApplyReport`` the live runner returns for an apply that ran (all steps: landed; some: the
steps done and the error that stopped the rest); ``nothing_to_do(reason)`` and
``refused(error)`` the reports of an apply that changed nothing. The simulated runner builds
every report through these functions, so a change of the live runner's apply outcome is
mirrored here alone.
"""

from __future__ import annotations

from typing import Any, Sequence

from trident_flows.core.state import ApplyReport


def apply_report(steps_done: Sequence[dict[str, Any]], steps_total: int, seconds: float, before: float, during: float, error: str,
                 reason: str) -> ApplyReport:
    dip = max(0.0, 1.0 - during / before) if before > 0 else 0.0
    return ApplyReport(tuple(steps_done), seconds, before, during, dip, ok=not error, error=error, reason=reason,
                       steps_total=steps_total)


def nothing_to_do(reason: str) -> ApplyReport:
    return ApplyReport((), 0.0, 0.0, 0.0, 0.0, reason=reason or "nothing to do")


def refused(error: str) -> ApplyReport:
    return ApplyReport((), 0.0, 0.0, 0.0, 0.0, ok=False, error=error)
