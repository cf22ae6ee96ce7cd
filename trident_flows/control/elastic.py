"""Trident's requests to Ray's autoscaler: a run's scale decisions acted on, and cleared when the run ends.

Contract:
- ``ElasticScaler(pool, goal, items_total, request=..., interval_s=15.0, clock=time.time)``:
  ``request`` is ``ray.autoscaler.sdk.request_resources`` unless a caller gives another (called
  with ``bundles=``).
- ``step(state)`` (after each control-loop tick) returns a ``planning.scale`` ``ScaleDecision`` at
  most once per ``interval_s`` and sends it when it changes the standing request.
- ``spent``: the pool nodes' cost so far (each live pool node's seconds at its class's price, plus
  the base cluster's price over the run's wall time: what a budget goal is charged).
- ``release()`` clears the request; the run calls it once it stopped, failed or not, so no node is
  left running because of trident. Idempotent.
- ``summary()``: plain data for the run summary (goal, decisions, ``nodes_requested``,
  ``node_seconds`` per class, ``cost``, ``request_cleared``).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable

from trident_flows.core.state import NodeState, RunnerState
from trident_flows.planning.advice import measured_demands
from trident_flows.planning.scale import NodePool, RunGoal, ScaleAction, ScaleDecision, decide_scale

DEFAULT_INTERVAL_S = 15.0


def _request_resources(**kwargs: Any) -> None:
    from ray.autoscaler.sdk import request_resources

    request_resources(**kwargs)


class ElasticScaler:
    """Scale decisions for one run, sent to Ray's autoscaler (see the module docstring)."""

    def __init__(self, pool: NodePool, goal: RunGoal, items_total: int, request: Callable[..., None] = _request_resources,
                 interval_s: float = DEFAULT_INTERVAL_S, clock: Callable[[], float] = time.time) -> None:
        self.pool, self.goal, self.items_total = pool, goal, items_total
        self.request, self.interval_s, self.clock = request, interval_s, clock
        self.requested: dict[str, int] = {}
        self.decisions: list[ScaleDecision] = []  # those that changed the request
        self.last: ScaleDecision | None = None
        self.rate_before: float | None = None  # input items/s done between the last two decisions
        self.nodes_requested = 0
        self.node_seconds: dict[str, float] = {}
        self.released = False
        self._last_step: float | None = None  # the last decision
        self._last_seen: float | None = None  # the last state read (node seconds are counted between reads)
        self._last_done: tuple[float, int] | None = None  # (time, items done) at the last decision
        self._last_running: dict[str, int] | None = None  # live pool nodes at the last decision
        self._last_serving: frozenset[str] = frozenset()  # the warm replicas at the last decision
        self._base_s = 0.0
        self._warm_since: dict[str, float] = {}  # replica id -> the run second it was first seen warm (its busy fraction is since then)

    def counts(self, nodes: tuple[NodeState, ...]) -> dict[str, int]:
        """Live nodes per pool class (its custom resource marks a node)."""
        out: dict[str, int] = {}
        for node in nodes:
            marks = dict(node.resources)
            name = next((c for c in self.pool.classes.names if marks.get(c, 0) >= 1), None)
            if name is not None:
                out[name] = out.get(name, 0) + 1
        return out

    def _base(self, nodes: tuple[NodeState, ...]) -> tuple[float, int, int]:
        marked = self.pool.classes.names
        base = [n for n in nodes if not any(dict(n.resources).get(c, 0) >= 1 for c in marked)]
        return sum(n.cpus for n in base), int(sum(n.gpus for n in base)), max((n.gpu_memory_bytes for n in base), default=0)

    def step(self, state: RunnerState) -> ScaleDecision | None:
        """One scale decision, sent when it changes the request (None between intervals).

        At most once per ``interval_s``: counts the live nodes of each pool class (a node carrying the class's
        custom resource; every other node, the head among them, is the base cluster), the items left
        (``items_total`` less those written or dead-lettered), the operators' measured rates
        (``planning.advice.measured_demands``: each replica's busy fraction over the seconds since the scaler first
        saw it warm; at its first read, since the run's start less the replica's cold start) and asks
        ``planning.scale.decide_scale``, with the input items/s done since the last decision as the running nodes'
        measured rate (seconds and items both read from the state, which may be older than the decision) when the same nodes and the same warm replicas served all that interval, none is starting and
        items were done in it (otherwise none: a replica in its cold start would read as a slow cluster; the
        decision rates the nodes with the planner's check). Until every operator has worked the decision is a
        ``WAIT`` and nothing is requested. A decision whose counts differ from the standing request is sent as
        ``request(bundles=pool.bundles(counts))`` (the empty list when it gives every node back). Each decision is
        kept with its measured effect: the input items/s done between it and the next decision (``rate_before``:
        that rate up to the newest decision). A ``WAIT`` does not start an interval: the next tick asks again."""
        now = self.clock()
        running = self.counts(state.nodes)
        if self._last_seen is not None:
            for c, n in running.items():
                self.node_seconds[c] = self.node_seconds.get(c, 0.0) + n * (now - self._last_seen)
        wall = state.wall_s  # the state's own clock: the state may be older than now (a tick's apply blocks the loop)
        self._note_warm(state)
        self._last_seen, self._base_s = now, wall
        if self._last_step is not None and now - self._last_step < self.interval_s and not state.finished:
            return None
        self._last_step = now
        done = state.items_written + state.items_dead_lettered
        serving = _serving(state)
        since = (done - self._last_done[1]) / (wall - self._last_done[0]) if self._last_done is not None and wall > self._last_done[0] else None
        steady = self._last_running == running and self._last_serving == serving and not _starting(state)
        decision = self._decide(state, running, done, now, since if since and steady else None)
        if decision.action == ScaleAction.WAIT:  # no rate to plan with yet: ask again at the next tick, not an interval later
            self._last_step, self.last = None, decision
            return decision
        self.rate_before = since
        if since is not None and self.last is not None:
            self._measured(since)
        self._last_done, self._last_running, self._last_serving = (wall, done), dict(running), serving
        self.last = decision
        if dict(decision.counts) != self.requested:
            self.request(bundles=self.pool.bundles(decision.counts))
            self.requested = dict(decision.counts)
            self.nodes_requested = max(self.nodes_requested, decision.nodes)
            self.decisions.append(decision)
        return decision

    def _decide(self, state: RunnerState, running: dict[str, int], done: int, now: float, measured: float | None) -> ScaleDecision:
        items_left = max(self.items_total - done, 0)
        if items_left > 0 and (not state.operators or state.operators[0].items_in <= 0):
            return ScaleDecision(ScaleAction.WAIT, dict(self.requested), "no operator has worked yet: no rate to plan with", at=now)
        try:
            demands = measured_demands(state, {rid: state.wall_s - t for rid, t in self._warm_since.items()}) if items_left > 0 else []
        except ValueError as exc:
            return ScaleDecision(ScaleAction.WAIT, dict(self.requested), f"{exc}: no rate to plan with", at=now)
        cpus, gpus, gpu_memory = self._base(state.nodes)
        return decide_scale(demands, self.pool, self.pool.base_node(cpus, gpus, gpu_memory), running, self.requested, items_left, now,
                            self.goal, self.spent, measured_items_per_s=measured)

    def _note_warm(self, state: RunnerState) -> None:
        """The run second each warm replica was first seen warm; at the first read, those warm already as if they started with
        the run (warm after their cold start). A replica no longer in the state is forgotten."""
        first = self._last_seen is None
        present = set()
        for op in state.operators:
            for r in op.replicas:
                present.add(r.replica_id)
                if r.warm and r.replica_id not in self._warm_since:
                    self._warm_since[r.replica_id] = min(r.cold_start_s, state.wall_s) if first else state.wall_s
        for gone in self._warm_since.keys() - present:
            del self._warm_since[gone]

    def _measured(self, items_per_s: float) -> None:
        """The measured effect of the last decision (and of the logged one it is, if it changed the request)."""
        previous = self.last
        measured = replace(previous, measured_items_per_s=items_per_s)
        if self.decisions and self.decisions[-1] is previous:
            self.decisions[-1] = measured

    @property
    def spent(self) -> float:
        workers = sum(self.pool.classes.node(c).price_per_hour * s for c, s in self.node_seconds.items()) / 3600
        return workers + self.pool.base_price_per_hour * self._base_s / 3600

    def release(self) -> None:
        """Clear trident's request (see the module docstring)."""
        if not self.released:
            self.request(bundles=[])
            self.requested = {}
            self.released = True

    def summary(self) -> dict[str, Any]:
        return {"goal": self.goal.to_dict(), "decisions": [d.to_dict() for d in self.decisions],
                "last_decision": self.last.to_dict() if self.last is not None else None, "nodes_requested": self.nodes_requested,
                "node_seconds": dict(self.node_seconds), "cost": self.spent, "currency": self.pool.classes.currency,
                "request_cleared": self.released}


def _serving(state: RunnerState) -> frozenset[str]:
    """The replicas serving now: warm and not draining."""
    return frozenset(r.replica_id for op in state.operators for r in op.replicas if r.warm and not r.draining)


def _starting(state: RunnerState) -> bool:
    """Whether a replica is still in its cold start."""
    return any(not r.warm for op in state.operators for r in op.replicas)
