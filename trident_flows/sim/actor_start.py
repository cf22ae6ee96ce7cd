"""Starting replica actors on a node: what a replica's cold start costs beyond its constructor.

Contract:
- ``ActorStart(latency_s, cpu_s, host_cores)``: a replica's actor start costs ``cpu_s`` CPU seconds
  on its node's cores plus ``latency_s`` of scheduling; the operator's constructor runs after both.
- ``NodeStarts(events, cores, cpu_s)``: the starts under way on one node share its cores equally.
  ``begin(record, then)`` calls ``then()`` once ``record``'s start-up work is done (never for a
  record marked ``dead`` meanwhile: its node was lost).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from trident_flows.sim.clock import EventQueue

# Fitted (least squares over the medians per k) to the cold starts beyond the constructor in the
# committed live traces recorded at load average < 3 on the 2-core machine, k replicas requested
# together: k=1 0.66 s, k=2 1.05 s (2 starts), k=4 1.47 s (4), k=16 5.44 s (the initial replicas of
# 4 traces, 64 starts): latency 0.19 s + 0.66 CPU s each, shared by 2 cores (model: k=1 0.85 s,
# k=2 0.85, k=4 1.5, k=16 5.5). Traces recorded at load 6-15 took 1.1-2x that (the machine's
# load, not the runtime). `bench sim-fidelity` re-measures it (raw.actor_start).
ACTOR_START_LATENCY_S = 0.2
ACTOR_START_CPU_S = 0.65
# remaining CPU seconds under this count as done (float rounding of the shared progress)
_DONE_EPS = 1e-9


@dataclass(frozen=True)
class ActorStart:
    """What starting one replica's actor costs beyond its constructor: ``cpu_s`` CPU seconds of process start-up
    (Ray starts a worker process and imports the operator's modules) on the cores of the node it lands on, plus
    ``latency_s`` of scheduling that uses no core; the constructor runs after both. ``host_cores``: the real cores
    one node's actor processes start on (None: the node's CPUs; a logical node emulated on a smaller machine has
    that machine's cores).

    The live runtime this mirrors: ``PipelineRunner.start`` requests every initial replica at once and a
    rollout's START step requests its ``count`` replicas at once; ``runtime.pool`` measures
    ``ReplicaState.cold_start_s`` from the request to the actor's ``ready()``. Trident prices a new replica at the
    longest cold start measured for its operator, so the start-up the initial replicas show is what the policy's
    switch costs are made of."""

    latency_s: float = ACTOR_START_LATENCY_S
    cpu_s: float = ACTOR_START_CPU_S
    host_cores: float | None = None

    def __post_init__(self) -> None:
        if self.latency_s < 0 or self.cpu_s < 0:
            raise ValueError(f"ActorStart: latency_s and cpu_s must be >= 0, got {self.latency_s} and {self.cpu_s}")
        if self.host_cores is not None and self.host_cores <= 0:
            raise ValueError(f"ActorStart: host_cores must be > 0 (or None for the node's CPUs), got {self.host_cores}")

    def cores(self, node_cpus: float) -> float:
        """The cores a node with ``node_cpus`` logical CPUs starts its actors on."""
        return self.host_cores if self.host_cores is not None else max(1.0, node_cpus)

    def together_s(self, count: int, node_cpus: float) -> float:
        """Seconds beyond their constructors until ``count`` replicas requested together on one node are started."""
        return self.latency_s + self.cpu_s * max(1.0, count / self.cores(node_cpus))


class NodeStarts:
    """The actor starts under way on one node, sharing its cores equally (processor sharing: k starts on c cores
    each progress at min(1, c / k) CPU seconds per second), so k replicas requested together all finish their
    start-up after about ``cpu_s * max(1, k / c)`` seconds."""

    def __init__(self, events: EventQueue, cores: float, cpu_s: float) -> None:
        self.events = events
        self.cores = cores
        self.cpu_s = cpu_s
        self._left: dict[Any, list[Any]] = {}  # record -> [CPU seconds left, then]
        self._updated = 0.0
        self._token = 0  # only the latest scheduled completion event acts

    def begin(self, record: Any, then: Callable[[], Any]) -> None:
        self._advance()
        self._left[record] = [self.cpu_s, then]
        self._schedule()

    def _rate(self) -> float:
        return min(1.0, self.cores / len(self._left)) if self._left else 0.0

    def _advance(self) -> None:
        now = self.events.now
        done = (now - self._updated) * self._rate()
        if done > 0:
            for entry in self._left.values():
                entry[0] -= done
        self._updated = now

    def _schedule(self) -> None:
        self._token += 1
        if self._left:
            first = min(entry[0] for entry in self._left.values())
            self.events.after(max(0.0, first) / self._rate(), self._finish, self._token)

    def _finish(self, token: int) -> None:
        if token != self._token:
            return
        self._advance()
        finished = [(r, entry[1]) for r, entry in self._left.items() if entry[0] <= _DONE_EPS or getattr(r, "dead", False)]
        for record, _ in finished:
            del self._left[record]
        self._schedule()
        for record, then in finished:
            if not getattr(record, "dead", False):
                then()
