"""What one controller tick saw, decided and spent: the frozen ``TickRecord``, and its JSON-lines log.

Contract:
- ``TickRecord`` is plain data: the tick number and time; what the tick saw (measured items/s
  per operator and end to end, the regime of each operator, typed ``TickEvent``s: regime
  changes, OOMs, canaries, refused applies); what it decided (``action``, an ``Action``: none,
  wait, roll_out, canary, rollback, error; the plan, its
  predicted throughput and the reason; without a plan, ``hold``: why nothing changed, as a
  ``HoldKind`` with its figures); the verification of an earlier plan; any error; and
  how long each step took (``timings_ms``: observe, regime, optimize, placement, transition,
  verify, total).
- ``to_dict()`` is JSON-ready; ``DecisionLog(path).write(record)`` appends one line per record
  (the file is created, with its folder, on the first write).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Mapping

from trident_flows.core.types import Plan

class Action(str, Enum):
    """What a tick decided."""

    NONE = "none"
    WAIT = "wait"
    ROLL_OUT = "roll_out"
    CANARY = "canary"
    ROLLBACK = "rollback"
    ERROR = "error"

    def __str__(self) -> str:  # log text and f-strings show the value ("roll_out"), as the JSON does
        return self.value

    @property
    def issues_nothing(self) -> bool:
        """The tick decided on no plan of its own: nothing to change, or a change judged not worth it."""
        return self in (Action.NONE, Action.WAIT)


ACTIONS = tuple(a.value for a in Action)


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


class HoldKind(str, Enum):
    """Why a tick changed nothing."""

    WAITING_FOR_SAMPLES = "waiting_for_samples"  # the evidence gate: not every operator has a model and enough samples
    VERIFYING = "verifying"                      # the last rollout is measured before planning again
    OPTIMAL = "optimal"                          # the current placement is the best one found
    NO_GAIN = "no_gain"                          # no other placement is predicted to be faster
    DOES_NOT_PAY = "does_not_pay"                # a faster placement would not pay back its switch in time
    UNDER_MIN_GAIN = "under_min_gain"            # the predicted gain is under the share a change must bring
    MAX_CHANGES = "max_changes"                  # the better placement changes more operators than a plan may
    ROLLED_BACK_BEFORE = "rolled_back_before"    # the better placement was rolled back before for this workload
    CANNOT_PRICE = "cannot_price"                # the change could not be ordered or priced
    REFUSED_BEFORE = "refused_before"            # the runner refused this plan against this placement before
    STEP_FAILED = "step_failed"                  # a step of the tick raised; the current plan is kept


@dataclass(frozen=True)
class Hold:
    """Why a tick changed nothing; ``gain`` and ``min_gain`` (shares: 0.02 = 2%) are given with
    ``UNDER_MIN_GAIN``."""

    kind: HoldKind
    gain: float | None = None
    min_gain: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", HoldKind(self.kind))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "gain": self.gain, "min_gain": self.min_gain}


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
    action: Action
    reason: str
    measured: Mapping[str, float] = field(default_factory=dict)
    pipeline_throughput: float = 0.0
    regimes: Mapping[str, int | None] = field(default_factory=dict)
    events: tuple[TickEvent | str, ...] = ()
    plan: Plan | None = None
    predicted_throughput: float = 0.0
    verification: str = ""
    error: str = ""
    timings_ms: Mapping[str, float] = field(default_factory=dict)
    hold: Hold | None = None

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"TickRecord.action must be one of {ACTIONS}, got {self.action!r}")
        object.__setattr__(self, "action", Action(self.action))

    def to_dict(self) -> dict[str, Any]:
        return {"tick": self.tick, "at": self.at, "action": self.action.value, "reason": self.reason,
                "measured": {k: round(v, 4) for k, v in self.measured.items()}, "pipeline_throughput": round(self.pipeline_throughput, 4),
                "regimes": dict(self.regimes), "events": [str(e) for e in self.events], "plan": self.plan.to_dict() if self.plan else None,
                "predicted_throughput": self.predicted_throughput, "verification": self.verification, "error": self.error,
                "timings_ms": {k: round(v, 2) for k, v in self.timings_ms.items()}, "hold": self.hold.to_dict() if self.hold else None}


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
