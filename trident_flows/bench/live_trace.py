"""Live traces: what a controller saw during a real run, kept so the models can be judged offline.

Contract:
- A trace is a gzip'd JSON-lines file. Line 1 is the header (``kind="header"``: pipeline,
  policy, cluster, regime schedule ``blocks`` as ``[regime, first item, end item]`` or ``[]``
  when the input order is not known, time scale, notes). Then one line per control-loop tick
  (``kind="tick"``: wall time ``at``, the runner's ``state`` (``RunnerState.to_dict``), the
  ``samples`` (``BatchSample.to_dict``) that arrived since the previous tick, the ``plan`` the
  policy returned (``Plan.to_dict`` or ``None``) and, for policies that keep one, its tick
  ``record``). The last line (``kind="end"``) holds the run's summary.
- ``TraceWriter(path, header)`` appends ticks and closes with ``end(summary)``;
  ``RecordingPolicy(inner, writer)`` is a ``Policy`` that writes every tick it is asked about
  and returns ``inner``'s plan unchanged (the recording never changes a decision).
- ``load(path) -> Trace`` reads a trace back into the runtime's own value types
  (``RunnerState``, ``BatchSample``, ``Plan``); ``state_from_dict`` is the inverse of
  ``RunnerState.to_dict``.
"""

from __future__ import annotations

import gzip
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from trident_flows.runtime.state import OperatorState, ReplicaState, RunnerState
from trident_flows.scheduler.types import BatchSample, OpConfig, Plan

TRACE_DIR = Path(__file__).with_name("traces")


def state_from_dict(data: Mapping[str, Any]) -> RunnerState:
    """The ``RunnerState`` whose ``to_dict()`` is ``data``."""
    ops = []
    for o in data["operators"]:
        replicas = tuple(ReplicaState(**{**r, "config": OpConfig.from_dict(r["config"])}) for r in o["replicas"])
        ops.append(OperatorState(**{**{k: v for k, v in o.items() if k != "replicas"}, "replicas": replicas}))
    return RunnerState(**{**{k: v for k, v in data.items() if k != "operators"}, "operators": tuple(ops)})


@dataclass(frozen=True)
class Tick:
    """One control-loop tick of a trace."""

    at: float
    state: RunnerState
    samples: tuple[BatchSample, ...]
    plan: Plan | None
    record: Mapping[str, Any] | None


@dataclass(frozen=True)
class Trace:
    """A loaded trace: its header, ticks in time order and end summary."""

    name: str
    header: Mapping[str, Any]
    ticks: tuple[Tick, ...]
    summary: Mapping[str, Any]

    @property
    def blocks(self) -> list[tuple[str, int, int]]:
        return [(str(r), int(a), int(b)) for r, a, b in self.header.get("blocks", [])]

    @property
    def duration_s(self) -> float:
        return self.ticks[-1].at - self.ticks[0].at if len(self.ticks) > 1 else 0.0

    def samples(self, operator: str | None = None) -> list[BatchSample]:
        """Every sample of the trace (of one operator when given), in completion order."""
        out = [s for t in self.ticks for s in t.samples if operator is None or s.operator == operator]
        return sorted(out, key=lambda s: s.end)

    @property
    def operators(self) -> list[str]:
        return [o.name for o in self.ticks[0].state.operators] if self.ticks else []


class TraceWriter:
    """Writes one trace file (see the module docstring)."""

    def __init__(self, path: Path | str, header: Mapping[str, Any]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = gzip.open(self.path, "wt", compresslevel=9)
        self._write({"kind": "header", **header})

    def _write(self, data: Mapping[str, Any]) -> None:
        self._file.write(json.dumps(data, default=str, separators=(",", ":")) + "\n")

    def tick(self, state: RunnerState, samples: Sequence[BatchSample], plan: Plan | None, record: Any = None) -> None:
        self._write({"kind": "tick", "at": time.time(), "state": state.to_dict(), "samples": [s.to_dict() for s in samples],
                     "plan": plan.to_dict() if plan is not None else None,
                     "record": record.to_dict() if hasattr(record, "to_dict") else None})

    def end(self, summary: Mapping[str, Any]) -> None:
        self._write({"kind": "end", "summary": dict(summary)})
        self._file.close()


class RecordingPolicy:
    """Asks ``inner`` and writes what it saw and decided to ``writer`` (the plan is returned unchanged)."""

    def __init__(self, inner: Any, writer: TraceWriter) -> None:
        self.inner = inner
        self.writer = writer
        self.name = inner.name

    def decide(self, state: RunnerState, samples: Sequence[BatchSample]) -> Plan | None:
        plan = self.inner.decide(state, samples)
        self.writer.tick(state, samples, plan, getattr(self.inner, "last_record", None))
        return plan

    def __getattr__(self, name: str) -> Any:  # records, last_record, ... of the inner policy
        return getattr(self.inner, name)


def load(path: Path | str) -> Trace:
    """Read a trace file (see the module docstring)."""
    path = Path(path)
    header: dict[str, Any] = {}
    ticks: list[Tick] = []
    summary: dict[str, Any] = {}
    with gzip.open(path, "rt") as f:
        for line in f:
            data = json.loads(line)
            if data["kind"] == "header":
                header = data
            elif data["kind"] == "tick":
                ticks.append(Tick(float(data["at"]), state_from_dict(data["state"]),
                                  tuple(BatchSample.from_dict(s) for s in data["samples"]),
                                  Plan.from_dict(data["plan"]) if data["plan"] else None, data.get("record")))
            elif data["kind"] == "end":
                summary = data["summary"]
    if not header or not ticks:
        raise ValueError(f"{path}: not a complete trace (header and at least one tick needed); record it again")
    name = path.name.removesuffix(".jsonl.gz")
    return Trace(name, header, tuple(ticks), summary)


def available(directory: Path = TRACE_DIR) -> list[Path]:
    """The trace files of ``directory``, sorted by name."""
    return sorted(directory.glob("*.jsonl.gz"))
