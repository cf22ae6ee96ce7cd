"""What one controller tick saw, decided and spent: the frozen ``TickRecord``, and its JSON-lines log.

Contract:
- ``TickRecord`` is plain data: the tick number and time; what the tick saw (measured items/s
  per operator and of the pipeline, the regime of each operator, regime changes); what it
  decided (``action``: "none", "wait", "roll_out", "canary", "rollback", "error"; the plan, its
  predicted throughput and the reason); the verification of an earlier plan; any error; and
  how long each step took (``timings_ms``: observe, regime, optimize, placement, transition,
  verify, total).
- ``to_dict()`` is JSON-ready; ``DecisionLog(path).write(record)`` appends one line per record
  (the file is created, with its folder, on the first write).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from trident_flows.scheduler.types import Plan

ACTIONS = ("none", "wait", "roll_out", "canary", "rollback", "error")


@dataclass(frozen=True)
class TickRecord:
    """One tick of the controller (see the module docstring)."""

    tick: int
    at: float
    action: str
    reason: str
    measured: Mapping[str, float] = field(default_factory=dict)
    pipeline_throughput: float = 0.0
    regimes: Mapping[str, int | None] = field(default_factory=dict)
    events: tuple[str, ...] = ()
    plan: Plan | None = None
    predicted_throughput: float = 0.0
    verification: str = ""
    error: str = ""
    timings_ms: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"TickRecord.action must be one of {ACTIONS}, got {self.action!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"tick": self.tick, "at": self.at, "action": self.action, "reason": self.reason,
                "measured": {k: round(v, 4) for k, v in self.measured.items()}, "pipeline_throughput": round(self.pipeline_throughput, 4),
                "regimes": dict(self.regimes), "events": list(self.events), "plan": self.plan.to_dict() if self.plan else None,
                "predicted_throughput": self.predicted_throughput, "verification": self.verification, "error": self.error,
                "timings_ms": {k: round(v, 2) for k, v in self.timings_ms.items()}}


class DecisionLog:
    """Appends ``TickRecord``s (or any JSON-ready dicts) as JSON lines to ``path``."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def write(self, record: TickRecord | Mapping[str, Any]) -> None:
        data = record.to_dict() if isinstance(record, TickRecord) else dict(record)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(data, default=str) + "\n")

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
