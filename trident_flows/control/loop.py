"""The in-process control loop: ticks a policy against a runner handle in a background thread.

Contract: every ``tick_s`` seconds it calls ``state()`` and ``samples(since)`` on the runner
handle, asks the policy (``policies.decide_once``), and, for a plan, calls ``apply(plan)``
(``control.step.decide_and_apply``, shared with the controller and the simulator) —
exactly the calls another process (the Prefect sidecar) makes on a runner found by name.
Every apply's ``core.state.ApplyOutcome`` (landed / partly landed / refused, with the reason; an
exception from ``apply`` is a refusal; ``control.apply_step``, shared with the controller and the
simulator) goes back to the policy when it has ``observe_apply(plan, outcome)``, and is kept in
``outcomes``. ``applies_refused`` counts the applies that did not land fully; ``refused_repeated``
the plans issued again unchanged against an unchanged placement after being refused (a policy
bug: it must stay 0). Each plan, with its reason, the apply report and the outcome, is appended
as one JSON line to ``decision_log`` when given. A failing tick is logged and the loop goes on.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import ray

from trident_flows.control.step import decide_and_apply
from trident_flows.core.signatures import placement_signature, plan_signature
from trident_flows.core.state import ApplyOutcome, ApplyStatus
from trident_flows.scheduler.policies import Policy


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


class ControlLoop:
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
        state = ray.get(self.handle.state.remote())
        if state.finished:
            return False
        page = ray.get(self.handle.samples.remote(self._cursor))
        self._cursor = page.next
        step = decide_and_apply(self.policy, state, page.samples, self._apply)
        decision, applied = step.decision, step.applied
        if applied is None:
            return True
        self.decisions += 1
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
        return True

    def _apply(self, plan: Any) -> Any:
        try:
            return ray.get(self.handle.apply.remote(plan))
        except ray.exceptions.TaskCancelledError:  # the runner cancels a rollout still running when the run ends
            raise RunEnded("the run ended before the apply finished (cancelled)") from None

    def _run(self) -> None:
        yield_to_ray_workers()
        while not self._stop.wait(self.tick_s):
            try:
                if not self.tick():
                    return
            except Exception as exc:  # noqa: BLE001 - keep controlling; record what went wrong
                self._log({"policy": self.policy.name, "tick_error": f"{type(exc).__name__}: {exc}"})
