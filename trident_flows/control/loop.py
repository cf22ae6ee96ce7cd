"""The control loop of ``trident-flows run`` and the benchmarks: a ``loop.TickLoop`` against a runner's
Ray handle, on the wall clock, in a background thread.

Contract:
- ``RayRunner(handle, timeout_s=None)``: ``state()``, ``samples(since)`` and ``apply(plan)`` through a
  runner actor handle (from any process: ``control.launch.find_runner``); an apply the runner cancels
  because the run ended raises ``RunEnded`` (the loop counts it a refusal).
- ``ControlLoop(handle, policy, tick_s=2.0, decision_log=None, scaler=None)`` is that ``TickLoop`` with a
  ``WallClock(tick_s)``, keeping ``record`` (a ``control.run_record.RunRecord``: every tick's counts and
  every plan, for the run's account) through ``RecordKeeper``. ``start()`` runs it in a thread at the
  Ray workers' niceness until the run finishes or ``stop()``. With a ``scaler`` (``control.elastic.
  ElasticScaler``) every tick that read a state also takes a scale step; each scale decision goes to
  the decision log as ``tick, t, at, scale`` (a failed step as ``tick, t, at, scale_error``: it never
  fails the run), and ``stop()`` clears the scaler's request. ``decisions``, ``applies_refused``,
  ``refused_repeated`` and ``outcomes`` are the loop's own counts (``loop_state``).
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from trident_flows.control.run_record import RunRecord
from trident_flows.core.decision import Decision
from trident_flows.core.state import ApplyOutcome, ApplyReport, RunnerState, SamplePage
from trident_flows.core.types import Plan
from trident_flows.loop.apply import Applied
from trident_flows.loop.clock import WallClock
from trident_flows.loop.tick_loop import Recorder, Tick, TickLoop
from trident_flows.scheduler.policies import Policy

if TYPE_CHECKING:  # the scaler reads the planner, which reads the simulator: only a run with a goal loads them
    from trident_flows.control.elastic import ElasticScaler


def yield_to_ray_workers() -> None:
    """Run the calling thread at the niceness of Ray's workers (``RAY_worker_niceness``, 15 unless set).

    The control loop runs in the driver (nice 0) on the node that also hosts the runner actor, the
    pipeline's one dispatcher, which Ray starts at nice 15: at nice 0 every millisecond of a tick
    (model fits, regime tests, the MILP) preempted the dispatcher, and the pipeline lost what the
    controller spent (emulated video on 2 cores: trident 0.77x static-avg with no change made).
    At the workers' niceness the controller competes as their equal. Linux sets niceness per
    thread; elsewhere, or where it cannot be changed, this does nothing."""
    try:
        target = int(os.environ.get("RAY_worker_niceness", "15"))
        tid = threading.get_native_id()
        if target > os.getpriority(os.PRIO_PROCESS, tid):
            os.setpriority(os.PRIO_PROCESS, tid, target)
    except (AttributeError, OSError, ValueError):  # not Linux, not permitted, or a bad setting: keep the priority
        pass


class RunEnded(RuntimeError):
    """An apply cut short because the run finished (its outcome: refused, with this reason)."""


class RayRunner:
    """The runner calls through a Ray actor handle (see the module docstring)."""

    def __init__(self, handle: Any, timeout_s: float | None = None) -> None:
        self.handle = handle
        self.timeout_s = timeout_s

    def state(self) -> RunnerState:
        return ray.get(self.handle.state.remote(), timeout=self.timeout_s)

    def samples(self, since: int) -> SamplePage:
        return ray.get(self.handle.samples.remote(since), timeout=self.timeout_s)

    def apply(self, plan: Plan) -> ApplyReport:
        try:
            return ray.get(self.handle.apply.remote(plan), timeout=None if self.timeout_s is None else 5 * self.timeout_s)
        except ray.exceptions.TaskCancelledError:  # the runner cancels a rollout still running when the run ends
            raise RunEnded("the run ended before the apply finished (cancelled)") from None


class RecordKeeper(Recorder):
    """Feeds a ``RunRecord``: every state read, every plan handed to the runner."""

    def __init__(self, record: RunRecord) -> None:
        self.record = record

    def observed(self, state: RunnerState) -> None:
        self.record.observe(state)

    def decided(self, state: RunnerState, decision: Decision, applied: Applied, line: dict[str, Any]) -> None:
        self.record.decided(state, decision, applied, line["at"])


class ControlLoop(TickLoop):
    """A ``TickLoop`` against a runner handle on the wall clock, in a background thread (see the module docstring)."""

    def __init__(self, handle: Any, policy: Policy, tick_s: float = 2.0, decision_log: Path | None = None,
                 scaler: ElasticScaler | None = None) -> None:
        self.handle = handle
        self.tick_s = tick_s
        self.scaler = scaler
        self.record = RunRecord()
        super().__init__(RayRunner(handle), policy, WallClock(tick_s), recorders=(RecordKeeper(self.record),), decision_log=decision_log)
        self._thread = threading.Thread(target=self._run, name="trident-control", daemon=True)

    @property
    def decisions(self) -> int:
        return self.loop_state.decisions

    @property
    def applies_refused(self) -> int:
        return self.loop_state.applies_refused

    @property
    def refused_repeated(self) -> int:
        return self.loop_state.refused_repeated

    @property
    def outcomes(self) -> list[ApplyOutcome]:
        return self.loop_state.outcomes

    def tick(self) -> Tick:
        """The ``TickLoop`` tick, then a scale step on the state it read (see the module docstring)."""
        done = super().tick()
        if self.scaler is not None and done.state is not None:
            line: dict[str, Any] = {"tick": self.loop_state.ticks, "t": round(self.clock.now(), 3), "at": time.time()}
            try:
                decision = self.scaler.step(done.state)
            except Exception as exc:  # noqa: BLE001 - a failed scale step keeps the standing request; the run goes on
                self._log({**line, "scale_error": f"{type(exc).__name__}: {exc}"})
            else:
                if decision is not None:
                    self._log({**line, "scale": decision.to_dict()})
        return done

    def start(self) -> "ControlLoop":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.clock.stop()
        if self._thread.is_alive():
            self._thread.join(timeout=max(10.0, 3 * self.tick_s))
        if self.scaler is not None:
            self.scaler.release()

    def _run(self) -> None:
        yield_to_ray_workers()
        self.run()
