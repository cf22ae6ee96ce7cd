"""OOMs avoided: the running configurations trident moved off before they ran out of memory.

Contract: ``count_ooms_avoided(policy_name, policy, decisions) -> OomsAvoided`` counts the distinct (operator,
config) pairs that a memory-safety move (a ``DecisionTaken`` of kind ``memory_safety`` that landed,
fully or in part) moved serving replicas off, leaving out every config that had itself run out of
memory in the run (``policy.ops[name].unsafe`` holds the configs that ran out of memory, a canary's
included: those OOMs happened and are in the run's ``ooms``). What is left are configs trident's
memory model judged unsafe before they failed: their peak-memory upper bound over the limit, or
a smaller batch with the same knobs had run out of memory. Each is listed with the operator,
config, when it was moved and why (``policy.safety.unsafe`` now).

It does not count, because the policy records no count of them: configurations the optimiser's
memory constraint kept from ever being proposed, or a proposal dropped for its memory bound before
it became a canary. Nor runner refusals of a plan (``trident.refusals``: no room, not memory).
``count`` is None, with the reason in ``note``, for a policy with no memory model (any but trident).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from trident_flows.control.run_record import DecisionTaken
from trident_flows.core.state import ApplyStatus
from trident_flows.core.types import PlanKind

COUNTS = ("running configurations trident moved replicas off in a memory-safety move before they ran out of memory "
          "(its memory model put their peak over the limit, or a smaller batch had run out); OOMs that happened are `ooms`")


@dataclass(frozen=True)
class AvoidedOom:
    """One config moved off before it ran out of memory; ``at`` is the wall-clock time of the move."""

    operator: str
    config: str
    at: float
    why: str


@dataclass(frozen=True)
class OomsAvoided:
    """The count (None: not counted, ``note`` says why), the configs counted and what the count counts."""

    count: int | None
    configs: tuple[AvoidedOom, ...]
    note: str


def count_ooms_avoided(policy_name: str, policy: Any, decisions: Sequence[DecisionTaken]) -> OomsAvoided:
    """The memory-safety moves off configs that had not run out of memory (see the module docstring)."""
    ops, safety = getattr(policy, "ops", None), getattr(policy, "safety", None)
    if policy_name != "trident":
        return OomsAvoided(None, (), f"not counted: the {policy_name} policy has no memory model (only trident keeps one)")
    if ops is None or safety is None:
        return OomsAvoided(None, (), "not counted: the trident policy was never asked, so it made no memory-safety move")
    moved = (ApplyStatus.LANDED.value, ApplyStatus.PARTIAL.value)
    found: dict[tuple[str, str], AvoidedOom] = {}
    for d in decisions:
        if d.kind != PlanKind.MEMORY_SAFETY.value or d.status not in moved:
            continue
        for operator, config in d.unsafe:
            key = (operator, config.label())
            op = ops.get(operator)
            if key in found or op is None or config in op.unsafe:
                continue
            why = safety.unsafe(operator, config) or "judged unsafe when it was moved"
            found[key] = AvoidedOom(operator, config.label(), d.at, why)
    return OomsAvoided(len(found), tuple(found.values()), COUNTS)
