"""Live traces: what a controller saw during a real run, kept so the models can be judged offline.

Contract:
- A trace is a gzip'd JSON-lines file: a header line, then in time order ``tick`` lines (one per poll of
  the runner: its state and the samples that arrived since) and ``decision`` lines (one per control-loop
  tick of the policy), and an ``end`` line with the run's summary (format: ``TraceWriter``).
- ``TraceWriter(path, header)`` appends lines and closes with ``end(summary)``;
  ``RecordingPolicy(inner, writer)`` writes every decision it is asked for and returns ``inner``'s
  ``Decision`` unchanged (the recording never changes a decision); ``RunnerPoller(handle, writer,
  every_s)`` is a ``run_pipeline`` progress callback that writes a tick at most every ``every_s`` seconds
  (and always the finished state).
- ``load(path) -> Trace`` reads a trace back into the runtime's own value types (``RunnerState``,
  ``BatchSample``, ``Plan``); ``state_from_dict`` is the inverse of ``RunnerState.to_dict``.
- ``profile_digest(name)``: the digest of today's cost profile ``name`` that an emulated trace's header records
  (``profile_sha256``): its operators slept by that profile's costs.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from trident_flows.core.decision import Decision
from trident_flows.core.state import NodeState, OperatorState, ReplicaState, RunnerState
from trident_flows.core.types import BatchSample, OpConfig, Plan
from trident_flows.runtime.costmodel import PROFILE_DIR

TRACE_DIR = Path(__file__).with_name("traces")


def profile_digest(name: str) -> str:
    """The first 16 hex digits of the SHA-256 of the committed cost profile ``name`` (``profiles/<name>.json``)."""
    return hashlib.sha256((PROFILE_DIR / f"{name}.json").read_bytes()).hexdigest()[:16]


def state_from_dict(data: Mapping[str, Any]) -> RunnerState:
    """The ``RunnerState`` whose ``to_dict()`` is ``data``."""
    ops = []
    for o in data["operators"]:
        replicas = tuple(ReplicaState(**{**r, "config": OpConfig.from_dict(r["config"])}) for r in o["replicas"])
        ops.append(OperatorState(**{**{k: v for k, v in o.items() if k != "replicas"}, "replicas": replicas}))
    nodes = tuple(NodeState.from_dict(n) for n in data.get("nodes", ()))
    return RunnerState(**{**{k: v for k, v in data.items() if k not in ("operators", "nodes")}, "operators": tuple(ops), "nodes": nodes})


@dataclass(frozen=True)
class Tick:
    """One poll of the runner: its state and the samples that arrived since the previous poll."""

    at: float
    state: RunnerState
    samples: tuple[BatchSample, ...]


@dataclass(frozen=True)
class TracedDecision:
    """One control-loop tick of the policy as traced: the plan its decision handed over (None: none) and its record, if it keeps one."""

    at: float
    wall_s: float
    plan: Plan | None
    record: Mapping[str, Any] | None


@dataclass(frozen=True)
class Trace:
    """A loaded trace: its header, ticks in time order and end summary."""

    name: str
    header: Mapping[str, Any]
    ticks: tuple[Tick, ...]
    decisions: tuple[TracedDecision, ...]
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
    """Writes one trace file, gzip'd JSON lines. Line 1 is the header (``kind="header"``: pipeline, policy, cluster,
    regime schedule ``blocks`` as ``[regime, first item, end item]`` or ``[]`` when the input order is not known, time
    scale, notes). Then, in time order, ``kind="tick"`` lines, one per poll of the runner (wall time ``at``, the
    runner's ``state`` (``RunnerState.to_dict``) and the ``samples`` (``BatchSample.to_dict``) that arrived since the
    previous poll), and ``kind="decision"`` lines, one per control-loop tick of the policy (``at``, the runner's
    ``wall_s`` it saw, the ``plan`` it returned or ``None`` and, for policies that keep one, its tick ``record``). The
    last line (``kind="end"``) holds the run's summary."""

    def __init__(self, path: Path | str, header: Mapping[str, Any]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = gzip.open(self.path, "wt", compresslevel=9)
        self._write({"kind": "header", **header})

    def _write(self, data: Mapping[str, Any]) -> None:
        self._file.write(json.dumps(data, default=str, separators=(",", ":")) + "\n")

    def tick(self, state: RunnerState, samples: Sequence[BatchSample]) -> None:
        self._write({"kind": "tick", "at": time.time(), "state": state.to_dict(), "samples": [s.to_dict() for s in samples]})

    def decision(self, state: RunnerState, plan: Plan | None, record: Any = None) -> None:
        self._write({"kind": "decision", "at": time.time(), "wall_s": state.wall_s, "plan": plan.to_dict() if plan is not None else None,
                     "record": record.to_dict() if hasattr(record, "to_dict") else None})

    def end(self, summary: Mapping[str, Any]) -> None:
        self._write({"kind": "end", "summary": dict(summary)})
        self._file.close()


class RecordingPolicy:
    """Asks ``inner`` and writes what it saw and decided to ``writer`` (the decision is returned unchanged)."""

    def __init__(self, inner: Any, writer: TraceWriter) -> None:
        self.inner = inner
        self.writer = writer
        self.name = inner.name

    def decide(self, state: RunnerState, samples: Sequence[BatchSample]) -> Decision:
        decision = self.inner.decide(state, samples)
        self.writer.decision(state, decision.plan, getattr(self.inner, "last_record", None))
        return decision

    def __getattr__(self, name: str) -> Any:  # records, last_record, ... of the inner policy
        return getattr(self.inner, name)


class RunnerPoller:
    """A ``run_pipeline`` progress callback writing the runner's state and new samples at most every ``every_s`` seconds
    (and always the finished state). The runner is polled apart from the control loop, so a policy busy applying a
    plan (seconds to minutes on a loaded machine) leaves no gap in the trace."""

    def __init__(self, handle: Any, writer: TraceWriter, every_s: float = 1.0) -> None:
        self.handle = handle
        self.writer = writer
        self.every_s = every_s
        self._cursor = 0
        self._last = -float("inf")

    def __call__(self, state: RunnerState) -> None:
        import ray

        now = time.monotonic()
        if now - self._last < self.every_s and not state.finished:
            return
        self._last = now
        page = ray.get(self.handle.samples.remote(self._cursor))
        self._cursor = page.next
        self.writer.tick(state, page.samples)


def load(path: Path | str) -> Trace:
    """Read a trace file (the format of ``TraceWriter``) into the runtime's own value types."""
    path = Path(path)
    header: dict[str, Any] = {}
    ticks: list[Tick] = []
    decisions: list[TracedDecision] = []
    summary: dict[str, Any] = {}
    with gzip.open(path, "rt") as f:
        for line in f:
            data = json.loads(line)
            if data["kind"] == "header":
                header = data
            elif data["kind"] == "tick":
                state = state_from_dict(data["state"])
                ticks.append(Tick(float(data["at"]), state, tuple(BatchSample.from_dict(s) for s in data["samples"])))
                if "plan" in data:   # the first traces wrote the decision into the tick (the policy polled the runner)
                    decisions.append(TracedDecision(float(data["at"]), state.wall_s, Plan.from_dict(data["plan"]) if data["plan"] else None,
                                                    data.get("record")))
            elif data["kind"] == "decision":
                decisions.append(TracedDecision(float(data["at"]), float(data["wall_s"]), Plan.from_dict(data["plan"]) if data["plan"] else None,
                                                data.get("record")))
            elif data["kind"] == "end":
                summary = data["summary"]
    if not header or not ticks:
        raise ValueError(f"{path}: not a complete trace (header and at least one tick needed); record it again")
    name = path.name.removesuffix(".jsonl.gz")
    return Trace(name, header, tuple(ticks), tuple(decisions), summary)


def available(directory: Path = TRACE_DIR) -> list[Path]:
    """The trace files of ``directory``, sorted by name."""
    return sorted(directory.glob("*.jsonl.gz"))
