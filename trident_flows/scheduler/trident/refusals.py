"""Refused plans: the Trident policy never issues a plan again, unchanged, that the runner refused against the same placement.

Contract: ``refused_before(state, plan)`` returns why the runner refused ``plan`` against the
placement running in ``state`` (both as ``core.signatures`` signatures), or None, in which case the
plan is remembered as the last one issued. ``observe_apply(plan, outcome)`` (an outcome that did not
land fully) records that last issued plan, if it is ``plan``, as refused with the outcome's status
and reason.
"""

from __future__ import annotations

from trident_flows.core.signatures import placement_signature, plan_signature
from trident_flows.core.state import ApplyOutcome, RunnerState
from trident_flows.core.types import Plan


class RefusedPlans:
    """The last plan issued and the refused ones (see the module docstring)."""

    def __init__(self) -> None:
        self._issued: tuple | None = None        # (placement, plan) signatures of the last plan issued
        self._refused: dict[tuple, str] = {}     # refused (placement, plan) signatures -> why

    def refused_before(self, state: RunnerState, plan: Plan) -> str | None:
        issued = (placement_signature(state), plan_signature(plan))
        if issued in self._refused:
            return self._refused[issued]
        self._issued = issued
        return None

    def observe_apply(self, plan: Plan, outcome: ApplyOutcome) -> None:
        if self._issued is not None and self._issued[1] == plan_signature(plan):
            self._refused[self._issued] = f"{outcome.status.value}: {outcome.reason[:200]}"
