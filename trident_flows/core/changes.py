"""What a plan changes against the placement running now, operator by operator.

Contract: ``changes_of(state, plan)`` compares each operator the ``Plan`` names with its serving
replicas in the ``RunnerState`` (canaries excluded) and returns one frozen ``OperatorChange`` per
operator whose replica count or configuration changes (the others are left out): replicas and
configurations before and after, the configurations as ``OpConfig.label()`` joined by ``+``
(``-`` for none), a canary the plan starts named after the configuration. ``OperatorChange.text()``
says it in a few words. Pure: what the Prefect layer's decision sentences and the end-of-run
account both read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trident_flows.core.types import Plan


@dataclass(frozen=True)
class OperatorChange:
    """One operator's serving replicas and configurations before and after a decision."""

    operator: str
    replicas_before: int
    replicas_after: int
    config_before: str
    config_after: str

    def text(self) -> str:
        """``ocr 1 -> 3 replicas``, or ``embed cpu/b8 -> gpu/b16`` when the configuration changes."""
        if self.config_before != self.config_after:
            count = "" if self.replicas_before == self.replicas_after else f" ({self.replicas_before} -> {self.replicas_after} replicas)"
            return f"{self.operator} {self.config_before} -> {self.config_after}{count}"
        return f"{self.operator} {self.replicas_before} -> {self.replicas_after} replica{'s' if self.replicas_after != 1 else ''}"


def _serving(state: Any, operator: str) -> tuple[int, str]:
    try:
        counts = state.operator(operator).configs()
    except KeyError:
        return 0, "-"
    return sum(counts.values()), "+".join(sorted(c.label() for c in counts)) or "-"


def changes_of(state: Any, plan: Plan) -> tuple[OperatorChange, ...]:
    """What the plan changes, operator by operator (operators it leaves as they are are left out)."""
    out = []
    for op in plan.operators:
        before, config_before = _serving(state, op.operator)
        after = op.replicas
        config_after = "+".join(sorted({g.config.label() for g in op.groups if g.replicas})) or "-"
        if op.canary is not None:
            config_after = f"{config_after} (canary {op.canary.label()})"
        if before != after or config_before != config_after:
            out.append(OperatorChange(op.operator, before, after, config_before, config_after))
    return tuple(out)
