"""Applying a change to a running pipeline: a Plan or a Transition, rolled out step by step.

Contract:
- ``Rollout.apply(change)`` takes a ``Plan`` (steps by ``transition.rolling_steps``) or a checked
  ``Transition``; a refused change raises ``RuntimeConfigError`` before any step, anything else is
  a ``TypeError``. Applies are serialised; after the run finished an apply does nothing and says so.
- Steps run in order (a START no node has room for waits for the plan's next RETIRE or moves a CPU replica off a node
  where it then fits, ``transition.room_first``):
  START/CANARY wait until warm (``warm_timeout_s``); RETIRE/END_CANARY drain
  then kill (``transition.retire_victims``); a last replica retires only for a swap in place; RESIZE
  gives replicas their new batch size at once (``transition.resize_victims``; batches in flight finish
  at the old size). A
  failing step stops the apply, and an operator a swap left empty gets a retired config back.
- Every apply returns and keeps (``reports``) an ``ApplyReport`` (start, steps, seconds, throughput
  before and during, dip, outcome); ``landed`` counts whole landings; ``summary()`` the reports,
  the largest rolling-update dip and the applies that did not land.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

import ray

from trident_flows.core.state import ApplyReport, ApplyStatus, RunnerSettings, RunnerState, RuntimeConfigError
from trident_flows.core.types import Plan, StepKind, Transition, TransitionStep, TransitionVerdict
from trident_flows.runtime.pool import OperatorPool, ReplicaRecord
from trident_flows.runtime.transition import RoomFor, check_plan, emptied_by_swap, refuse_without_room, resize_victims, retire_victims, rolling_steps, step_room

# The throughput during an apply shorter than this is read over this last stretch instead, so a
# quick apply is not read from one or two 0.1 s completion buckets.
_MIN_DURING_S = 0.5


def _node_of(record: ReplicaRecord) -> str | None:
    """The node a live replica was pinned to or reported (None when not known yet)."""
    return record.node_id or None


class Rollout:
    """Applies plans and transitions to the runner's pools (see the module docstring).

    ``state()`` is the runner's snapshot now; ``rate(start, end)`` its rows done per second;
    ``started_at()`` when it started streaming; ``finished()`` whether it has finished;
    ``watch_start(i, record, replace)`` watches a new replica of operator ``i`` until warm;
    ``wake()`` tells the pump that replicas changed."""

    def __init__(self, ops: list[str], pools: list[OperatorPool], settings: RunnerSettings, state: Callable[[], RunnerState],
                 rate: Callable[[float, float], float], started_at: Callable[[], float], finished: Callable[[], bool],
                 watch_start: Callable[[int, ReplicaRecord, bool], None], wake: Callable[[], None]) -> None:
        self.ops = ops
        self.pools = pools
        self.settings = settings
        self._state = state
        self._rate = rate
        self._started_at = started_at
        self._finished = finished
        self._watch_start = watch_start
        self._wake = wake
        self._lock = asyncio.Lock()
        self.reports: list[ApplyReport] = []
        self.landed = 0

    async def apply(self, change: Plan | Transition) -> ApplyReport:
        """Apply a Plan or a Transition (see the module docstring)."""
        async with self._lock:
            if self._finished():
                return ApplyReport((), 0.0, 0.0, 0.0, 0.0, ok=False, error="the run has finished")
            if not isinstance(change, (Plan, Transition)):
                raise TypeError(f"apply takes a Plan or a Transition, got {type(change).__name__}")
            try:
                transition = rolling_steps(self._state(), change) if isinstance(change, Plan) else self._checked(change)
            except RuntimeConfigError as exc:  # refused before any step: recorded with its reason, then raised to the caller
                self.reports.append(ApplyReport((), 0.0, 0.0, 0.0, 0.0, ok=False, error=str(exc), reason=change.reason or ""))
                raise
            if transition.verdict == TransitionVerdict.WAIT or not transition.steps:
                return ApplyReport((), 0.0, 0.0, 0.0, 0.0, reason=transition.reason or "nothing to do")
            t0 = time.time()
            window = min(self.settings.dip_window_s, max(t0 - self._started_at(), 1e-6))
            before = self._rate(t0 - window, t0)
            done, error, steps_total = await self._run_steps(transition.steps)
            t1 = time.time()
            during = self._rate(t0, t1) if t1 - t0 >= _MIN_DURING_S else self._rate(t1 - _MIN_DURING_S, t1)
            dip = max(0.0, 1.0 - during / before) if before > 0 else 0.0
            report = ApplyReport(tuple(done), t1 - t0, before, during, dip, ok=not error, error=error, reason=transition.reason,
                                 steps_total=steps_total, started_at=t0)
            if report.outcome.status == ApplyStatus.LANDED:
                self.landed += 1  # only changes that landed count; the others are in reports
            self.reports.append(report)
            self._wake()
            return report

    def summary(self) -> dict[str, Any]:
        rolling = [r.dip for r in self.reports if any(s["kind"] == StepKind.RETIRE.value for s in r.steps_done)
                   and any(s["kind"] == StepKind.START.value for s in r.steps_done)]
        return {"apply_reports": [r.to_dict() for r in self.reports],
                "rolling_update_dip": max(rolling) if rolling else 0.0,
                "applies_refused": [{"error": r.error, **r.outcome.to_dict()} for r in self.reports if r.outcome.status != ApplyStatus.LANDED]}

    async def _run_steps(self, steps: tuple[TransitionStep, ...]) -> tuple[list[dict[str, Any]], str, int]:
        """Run ``steps`` in order until one fails; returns the steps done, the error ("" if none) and how many steps
        there were (with those ``room_first`` added)."""
        done: list[dict[str, Any]] = []
        k = -1
        while (k := k + 1) < len(steps):
            steps, room = step_room(steps, k, self.pools[0].free_by_node, list(zip(self.ops, self.pools)), _node_of)
            step, s0 = steps[k], time.time()
            # a RETIRE followed by a START of the same operator is a swap in place: its last replica may go
            replaced = any(s.kind == StepKind.START and s.operator == step.operator for s in steps[k + 1:])
            try:
                ids = await self._do_step(step, replaced=replaced, room=room)
            except Exception as exc:  # noqa: BLE001 - reported, and later steps are skipped
                error = f"step {step.kind.value} {step.operator} {step.config.label()} failed: {type(exc).__name__}: {exc}"
                return done, error + self._restore_emptied(done), len(steps)
            done.append({**step.to_dict(), "replicas": ids, "seconds": time.time() - s0})
        return done, "", len(steps)

    def _restore_emptied(self, done: list[dict[str, Any]]) -> str:
        """After a failed step: an operator left without replicas by a swap in place gets one of the
        configs it retired back (``transition.emptied_by_swap``). Returns a note."""
        notes = []
        for name, config in emptied_by_swap(done, lambda op: bool(self.pools[self.ops.index(op)].active(canary=False))):
            i = self.ops.index(name)
            for r in self.pools[i].start(config, 1, canary=False):
                self._watch_start(i, r, True)
            notes.append(f"{name}: restarted {config.label()}")
        return ("; restored after the failed swap: " + ", ".join(notes)) if notes else ""

    def _checked(self, transition: Transition) -> Transition:
        """``transition`` if the runner can carry out its steps, else ``RuntimeConfigError`` naming what to change."""
        state = self._state()
        for step in transition.steps:
            if step.operator not in self.ops:
                raise RuntimeConfigError(f"transition step names unknown operator {step.operator!r}; operators are {self.ops}")
            if step.count < 1:
                raise RuntimeConfigError(f"transition step for {step.operator!r} has count {step.count}; use count >= 1")
            if step.config.gpus > state.cluster_gpus:
                raise RuntimeConfigError(f"operator {step.operator!r}: gpus={step.config.gpus} exceeds the cluster's {state.cluster_gpus:g} GPUs")
        if transition.plan is not None:
            check_plan(transition.plan, state)
        return transition

    async def _do_step(self, step: TransitionStep, replaced: bool = False, room: RoomFor | None = None) -> list[str]:
        i = self.ops.index(step.operator)
        if step.kind in (StepKind.START, StepKind.CANARY):
            return await self._start(i, step)
        if step.kind == StepKind.RESIZE:
            return self._resize(i, step)
        return await self._retire(i, step, replaced, room)

    def _resize(self, i: int, step: TransitionStep) -> list[str]:
        records = resize_victims(self.pools[i], step)
        self.pools[i].resize(records, step.config)
        self._wake()
        return [r.replica_id for r in records]

    async def _start(self, i: int, step: TransitionStep) -> list[str]:
        pool = self.pools[i]
        refuse_without_room(step, self.pools, pool.free_by_node)
        records = pool.start(step.config, step.count, canary=step.kind == StepKind.CANARY, node_class=step.node_class)
        for r in records:
            self._watch_start(i, r, False)
        try:
            await asyncio.wait_for(asyncio.gather(*[r.ready for r in records]), self.settings.warm_timeout_s)
        except (asyncio.TimeoutError, ray.exceptions.RayError) as exc:
            for r in records:
                if not r.warm:
                    pool.forget(r)
            raise RuntimeError(f"new replicas did not become warm within {self.settings.warm_timeout_s:g}s "
                               f"(not enough free resources?): {exc}") from exc
        self._wake()
        return [r.replica_id for r in records]

    async def _retire(self, i: int, step: TransitionStep, replaced: bool, room: RoomFor | None) -> list[str]:
        pool = self.pools[i]
        victims = retire_victims(pool, step, replaced, room=room, node_class=step.node_class)
        pool.begin_drain(victims)
        await asyncio.gather(*[pool.retire(v) for v in victims])
        return [v.replica_id for v in victims]
