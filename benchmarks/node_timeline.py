"""Worker nodes over time as Ray's autoscaler reports them: sampled, and integrated into node-seconds.

Contract:
- A ``NodeSample`` is one read of the autoscaler's state (``OwnAutoscalingCluster.status()``) at wall time
  ``t``: worker nodes alive (active or idle) and pending (launched, not yet joined) per node type, and
  the number of ``request_resources`` bundles standing. ``NodeSample.of(t, status)`` reads it.
- ``NodeSampler(read, every_s)`` calls ``read()`` (a status) every ``every_s`` seconds on a daemon thread
  between ``start()`` and ``stop()`` (a sampler never started stops at once); ``samples`` is what it read so far (a read that raises is skipped
  and counted in ``failed``).
- ``node_seconds(samples, start, end, pending=False)`` (pure): the integral of the workers alive (and,
  with ``pending``, pending) over ``[start, end]``, each sample's count held until the next sample and
  nothing after the last one; ``prices`` (per node type, per hour) turns it into a cost with
  ``node_cost``. ``most_requested(samples, start, end)``: the most bundles standing in a sample of
  ``[start, end]``. ``first_at(samples, since, predicate)``: the time of the first sample from ``since``
  on where ``predicate`` holds (None if none).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence


@dataclass(frozen=True)
class NodeSample:
    t: float
    alive: Mapping[str, int]
    pending: Mapping[str, int] = field(default_factory=dict)
    requested: int = 0

    @classmethod
    def of(cls, t: float, status: Mapping[str, Any]) -> "NodeSample":
        return cls(t, dict(status["workers"]), dict(status.get("pending_nodes", {})), len(status["requested_bundles"]))

    def nodes(self, pending: bool = False) -> dict[str, int]:
        """Nodes per type: alive, plus pending ones with ``pending``."""
        out = dict(self.alive)
        if pending:
            for kind, n in self.pending.items():
                out[kind] = out.get(kind, 0) + n
        return out


class NodeSampler:
    """Reads the autoscaler's state every ``every_s`` seconds (see the module docstring)."""

    def __init__(self, read: Callable[[], Mapping[str, Any]], every_s: float = 1.0, clock: Callable[[], float] = time.time) -> None:
        self._read, self._every_s, self._clock = read, every_s, clock
        self.samples: list[NodeSample] = []
        self.failed = 0
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="node-sampler", daemon=True)

    def start(self) -> "NodeSampler":
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stopped.is_set():
            try:
                self.samples.append(NodeSample.of(self._clock(), self._read()))
            except Exception:  # noqa: BLE001 - a GCS read that fails once (a busy machine) is skipped, and counted
                self.failed += 1
            self._stopped.wait(self._every_s)

    def stop(self) -> list[NodeSample]:
        self._stopped.set()
        if self._thread.ident is not None:  # started
            self._thread.join()
        return list(self.samples)


def node_seconds(samples: Sequence[NodeSample], start: float, end: float, pending: bool = False) -> dict[str, float]:
    """Node-seconds per node type over ``[start, end]`` (see the module docstring)."""
    out: dict[str, float] = {}
    ordered = sorted(samples, key=lambda s: s.t)
    for here, after in zip(ordered, ordered[1:]):
        overlap = min(after.t, end) - max(here.t, start)
        if overlap <= 0:
            continue
        for kind, n in here.nodes(pending).items():
            if n:
                out[kind] = out.get(kind, 0.0) + n * overlap
    return out


def node_cost(seconds: Mapping[str, float], prices: Mapping[str, float]) -> float:
    """The cost of ``seconds`` per node type at ``prices`` per hour."""
    return sum(prices[kind] * s for kind, s in seconds.items()) / 3600


def most_requested(samples: Sequence[NodeSample], start: float, end: float) -> int:
    return max((s.requested for s in samples if start <= s.t <= end), default=0)


def first_at(samples: Sequence[NodeSample], since: float, predicate: Callable[[NodeSample], bool]) -> float | None:
    return next((s.t for s in sorted(samples, key=lambda s: s.t) if s.t >= since and predicate(s)), None)
