"""What one controller tick saw, decided and spent: the frozen ``TickRecord``, and its JSON-lines log.

Contract:
- ``TickRecord`` is plain data: the tick number and time; what the tick saw (measured items/s
  per operator and end to end, the regime of each operator, typed ``TickEvent``s: regime
  changes, OOMs, canaries, refused applies); what it decided (``decision``, the ``core.decision.Decision``
  the policy returns: action, reason, plan, predicted throughput, typed hold); the verification of an
  earlier plan; any step's error; and how long each step took (``timings_ms``: observe, regime,
  optimize, placement, transition, verify, total).
- ``to_dict()`` is JSON-ready, the decision's keys flat beside the tick's; ``DecisionLog(path).write(record)``
  appends one line per record (the file is created, with its folder, on the first write).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Mapping

from trident_flows.core.decision import Decision


class EventKind(str, Enum):
    """What a tick saw happen; control flow reads the kind, the log the text."""

    REGIME_CHANGE = "regime_change"        # the workload's features changed
    RESIDUAL_CHANGE = "residual_change"    # same workload, the operator behaves differently
    REMEMBERED_REGIME = "remembered_regime"
    SOURCE_REGIME = "source_regime"        # the source operator's item features entered another regime
    OOM = "oom"
    CANARY = "canary"
    APPLY_REFUSED = "apply_refused"
    NOTE = "note"


@dataclass(frozen=True)
class TickEvent:
    """One event of a tick: its kind, the operator ("" for the pipeline) and a readable text."""

    kind: EventKind
    operator: str
    text: str

    def __str__(self) -> str:
        return f"{self.operator}: {self.text}" if self.operator else self.text


@dataclass(frozen=True)
class TickRecord:
    """One tick of the controller (see the module docstring)."""

    tick: int
    at: float
    decision: Decision
    measured: Mapping[str, float] = field(default_factory=dict)
    pipeline_throughput: float = 0.0
    regimes: Mapping[str, int | None] = field(default_factory=dict)
    events: tuple[TickEvent | str, ...] = ()
    verification: str = ""
    error: str = ""
    timings_ms: Mapping[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"tick": self.tick, "at": self.at, **self.decision.to_dict(), "measured": {k: round(v, 4) for k, v in self.measured.items()},
                "pipeline_throughput": round(self.pipeline_throughput, 4), "regimes": dict(self.regimes),
                "events": [str(e) for e in self.events], "verification": self.verification, "error": self.error,
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
