"""The control loop against a runner handle: one tick (``tick_runner``), and the in-process loop
that takes it every ``tick_s`` seconds in a background thread (``ControlLoop``).

Contract:
- ``tick_runner(handle, policy, cursor, decide=..., timeout_s=..., decide_finished=...)`` is the
  one tick every loop against a runner handle takes (``ControlLoop`` here, the Trident
  ``control.controller.Controller``): it reads ``state()`` and, unless the run has finished (or
  ``decide_finished``), ``samples(cursor)`` through the handle, then decides and, for a plan the run
  can still take, applies it through the handle (``control.step.decide_and_apply``: an exception
  from ``apply`` is a refusal, the outcome goes to the policy's ``observe_apply``; an apply the
  runner cancels because the run ended is refused as ``RunEnded``). It returns a frozen ``Tick``:
  the state, the step (None when the run had finished and nothing was decided) and the cursor to
  pass next time. A failing runner call or policy raises, and the cursor the caller holds stays
  where it was (the samples are offered again at the next tick); a failed runner call is raised as
  ``RunnerCallFailed``. These are exactly the calls
  another process (the Prefect sidecar) makes on a runner found by name.
- ``ControlLoop(handle, policy, tick_s, decision_log)`` ticks every ``tick_s`` seconds until the
  run finishes or ``stop()``. Every apply's ``core.state.ApplyOutcome`` (landed / partly landed /
  refused, with the reason) is kept in ``outcomes``. ``applies_refused`` counts the applies that did
  not land fully; ``refused_repeated`` the plans issued again unchanged against an unchanged
  placement after being refused (a policy bug: it must stay 0). Each plan, with its reason, the
  apply report and the outcome, is appended as one JSON line to ``decision_log`` when given. A
  failing tick is logged and the loop goes on. ``record`` (a ``control.run_record.RunRecord``)
  keeps every tick's counts and every applied plan for the run's account (``control.account``).
- Where a loop must stay its own: the simulator's driver (``sim/driver.py``) runs no Ray handle and
  no thread: it advances the simulated clock to each tick and charges the decision's CPU time to it
  before the plan lands, then takes the same ``decide_and_apply`` step. The Prefect sidecar
  (``flows/trident_sidecar.py``) decides in the flow and applies in a separate ``roll-out`` task
  run per decision, with the policy pickled into a Ray actor between flow runs (one tick per flow
  run when deployed on a schedule), so it uses the two halves of the apply step directly.
"""
from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import ray

from trident_flows.control.apply_step import Applied
from trident_flows.control.run_record import RunRecord
from trident_flows.control.step import Step, decide_and_apply
from trident_flows.core.signatures import placement_signature, plan_signature
from trident_flows.core.state import ApplyOutcome, ApplyReport, ApplyStatus, RunnerState
from trident_flows.core.types import BatchSample, Plan
from trident_flows.scheduler.policies import Policy, decide_once


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


class RunnerCallFailed(RuntimeError):
    """A ``state()`` or ``samples()`` call on the runner handle failed: the runner is busy, gone or unreachable."""


@dataclass(frozen=True)
class Tick:
    """One tick against a runner: the state read, what was decided and applied (None when the run had
    finished and nothing was decided), and the sample cursor to pass next time."""

    state: RunnerState
    step: Step | None
    cursor: int


def tick_runner(handle: Any, policy: Any, cursor: int, *, decide: Callable[[Any, RunnerState, Sequence[BatchSample]], Any] = decide_once,
                timeout_s: float | None = None, decide_finished: bool = False) -> Tick:
    """Read the runner's state and new samples, decide, and apply a plan the run can still take (see the module docstring)."""
    state = _call(handle.state, timeout_s)
    if state.finished and not decide_finished:
        return Tick(state, None, cursor)
    page = _call(handle.samples, timeout_s, cursor)

    def apply(plan: Plan) -> ApplyReport:
        try:
            return ray.get(handle.apply.remote(plan), timeout=None if timeout_s is None else 5 * timeout_s)
        except ray.exceptions.TaskCancelledError:  # the runner cancels a rollout still running when the run ends
            raise RunEnded("the run ended before the apply finished (cancelled)") from None

    step = decide_and_apply(policy, state, list(page.samples), apply, decide=decide, may_apply=lambda: not state.finished)
    return Tick(state, step, page.next)


def _call(method: Any, timeout_s: float | None, *args: Any) -> Any:
    try:
        return ray.get(method.remote(*args), timeout=timeout_s)
    except Exception as exc:  # noqa: BLE001 - said as a failed runner call, with the cause
        raise RunnerCallFailed(f"{type(exc).__name__}: {exc}") from exc


class ControlLoop:
    """Ticks ``policy`` against a runner handle every ``tick_s`` seconds in a background thread (see the module docstring)."""

    def __init__(self, handle: Any, policy: Policy, tick_s: float = 2.0, decision_log: Path | None = None) -> None:
        self.handle = handle
        self.policy = policy
        self.tick_s = tick_s
        self.decision_log = Path(decision_log) if decision_log else None
        self.decisions = 0
        self.applied = 0
        self.applies_refused = 0
        self.refused_repeated = 0
        self.outcomes: list[ApplyOutcome] = []
        self.record = RunRecord()
        self._refused: set = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trident-control", daemon=True)
        self._cursor = 0

    def start(self) -> "ControlLoop":
        if self.decision_log:
            self.decision_log.parent.mkdir(parents=True, exist_ok=True)
            self.decision_log.write_text("")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=max(10.0, 3 * self.tick_s))

    def _log(self, record: dict[str, Any]) -> None:
        if self.decision_log:
            with self.decision_log.open("a") as f:
                f.write(json.dumps(record, default=str) + "\n")

    def tick(self) -> bool:
        """One tick; returns False once the run has finished."""
        tick = tick_runner(self.handle, self.policy, self._cursor)
        self.record.observe(tick.state)
        if tick.step is None:
            return False
        self._cursor = tick.cursor
        if tick.step.applied is not None:
            self._record(tick.state, tick.step.decision, tick.step.applied)
        return True

    def _record(self, state: RunnerState, decision: Any, applied: Applied) -> None:
        """Count and log one applied plan."""
        self.decisions += 1
        self.record.decided(state, decision.plan, applied, decision.at, decision.reason)
        record = decision.to_dict()
        key = (plan_signature(decision.plan), placement_signature(state))
        if key in self._refused:
            self.refused_repeated += 1
            record["refused_repeated"] = True
        if applied.report is not None:
            record["apply"] = applied.report.to_dict()
        outcome = applied.outcome
        record["outcome"] = outcome.to_dict()
        self.outcomes.append(outcome)
        self.applied += int(outcome.status == ApplyStatus.LANDED and outcome.changed)
        if outcome.status != ApplyStatus.LANDED:
            self.applies_refused += 1
            self._refused.add(key)
        self._log(record)

    def _run(self) -> None:
        yield_to_ray_workers()
        while not self._stop.wait(self.tick_s):
            try:
                if not self.tick():
                    return
            except Exception as exc:  # noqa: BLE001 - keep controlling; record what went wrong
                self._log({"policy": self.policy.name, "tick_error": f"{type(exc).__name__}: {exc}"})
