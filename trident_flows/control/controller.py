"""The Trident controller at the I/O edge: one ``tick()`` against a pipeline runner handle.

Contract:
- ``Controller(runner, policy=None, *, spec=None, cluster=None, decision_log=None)`` works on a
  runner actor handle from any process of the cluster (``control.launch.find_runner(name)``): each
  ``tick()`` calls ``runner.state()`` and ``runner.samples(cursor)``, asks the policy (a
  ``TridentPolicy`` unless another object with ``tick(state, samples) -> TickRecord`` is given;
  the policy is built from the runner's own PipelineSpec when no spec is passed, with the
  keyword options given to the controller, a ``TridentSettings``: an unknown option or a bad value
  is refused at construction) and,
  when the record carries a plan, calls ``runner.apply(plan)``: the tick of the control loop
  (``control.loop.tick_runner``), which also decides on the finished run's last state (no apply).
  The decision logic stays pure
  in the policy; this class only moves data between it and the runner.
- Every tick returns its frozen ``TickRecord`` and appends it to ``decision_log`` (JSON lines),
  with the apply report under ``"apply"`` and its ``ApplyOutcome`` under ``"outcome"``; the
  outcome (an exception from ``apply`` is a refusal) goes back to the policy's ``observe_apply``.
- It survives failures: a runner call that fails or a policy that raises gives a record with
  action "error" and the message; the current plan stays, the sample cursor only moves when the
  samples were handed to the policy, and the next tick tries again.
- ``run(tick_s, max_ticks)`` ticks until the run finishes (or ``max_ticks``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

import ray

from trident_flows.control.loop import RunnerCallFailed, tick_runner
from trident_flows.core.state import ApplyStatus, RunnerState
from trident_flows.scheduler.decision_log import Action, DecisionLog, Hold, HoldKind, TickRecord
from trident_flows.scheduler.policies import make_policy, policy_settings
from trident_flows.core.types import BatchSample, ClusterSpec


class Controller:
    """Ticks a Trident policy against a runner handle (see the module docstring)."""

    def __init__(self, runner: Any, policy: Any | None = None, *, spec: Any | None = None, cluster: ClusterSpec | None = None,
                 decision_log: Path | str | None = None, call_timeout_s: float = 120.0, **policy_options: Any) -> None:
        self.runner = runner
        self._policy = policy
        self._spec = spec
        self._cluster = cluster
        if policy is None:  # a misspelt option or bad value is refused here, not at the first tick (where a failing policy is only logged)
            policy_settings("trident", policy_options)
        elif policy_options:
            raise ValueError(f"Controller: policy options {sorted(policy_options)} apply only to the policy the controller builds; "
                             "pass them to the policy given instead")
        self._options = policy_options
        self.log = DecisionLog(decision_log) if decision_log else None
        self.call_timeout_s = call_timeout_s
        self.cursor = 0
        self.ticks = 0
        self.applied = 0
        self.finished = False
        self.records: list[TickRecord] = []

    @property
    def policy(self) -> Any:
        """The policy, built on first use from the runner's pipeline spec and cluster when not given."""
        if self._policy is None:
            spec = self._spec
            if spec is None:
                spec = ray.get(self.runner.pipeline_spec.remote(), timeout=self.call_timeout_s)
            cluster = self._cluster
            if cluster is None:
                state = ray.get(self.runner.state.remote(), timeout=self.call_timeout_s)
                cluster = ClusterSpec.single_node(state.cluster_cpus, int(state.cluster_gpus))
            self._policy = make_policy("trident", spec=spec, cluster=cluster, **self._options)
        return self._policy

    def _error(self, message: str) -> TickRecord:
        return TickRecord(self.ticks, time.time(), Action.ERROR, f"kept the current plan: {message}", error=message, hold=Hold(HoldKind.STEP_FAILED))

    def tick(self) -> TickRecord:
        """One tick: state + new samples -> policy -> apply (see the module docstring)."""
        self.ticks += 1
        extra: dict[str, Any] = {}
        try:
            policy = self.policy
        except Exception as exc:  # noqa: BLE001 - the runner may be busy or gone; try again next tick
            return self._finish(self._error(f"runner call failed: {type(exc).__name__}: {exc}"), extra)
        try:
            tick = tick_runner(self.runner, policy, self.cursor, decide=self._decide, timeout_s=self.call_timeout_s, decide_finished=True)
        except RunnerCallFailed as exc:  # the runner may be busy or gone; try again next tick
            return self._finish(self._error(f"runner call failed: {exc}"), extra)
        except Exception as exc:  # noqa: BLE001 - a failing policy must not stop the controller (an apply's own error is a refusal)
            return self._finish(self._error(f"policy failed: {type(exc).__name__}: {exc}"), extra)
        self.cursor = tick.cursor
        record, applied = tick.step.decision, tick.step.applied
        if applied is not None:
            if applied.report is not None:
                extra["apply"] = applied.report.to_dict()
            outcome = applied.outcome
            extra["outcome"] = outcome.to_dict()
            self.applied += int(outcome.status == ApplyStatus.LANDED and outcome.changed)
        return self._finish(record, extra)

    def _decide(self, policy: Any, state: RunnerState, samples: Sequence[BatchSample]) -> TickRecord:
        if state.finished:  # known before the policy runs: a policy that fails on the final state still ends ``run``
            self.finished = True
        return policy.tick(state, samples)

    def _finish(self, record: TickRecord, extra: dict[str, Any]) -> TickRecord:
        self.records.append(record)
        if self.log is not None:
            self.log.write({**record.to_dict(), **extra})
        return record

    def run(self, tick_s: float = 2.0, max_ticks: int | None = None) -> list[TickRecord]:
        """Tick every ``tick_s`` seconds until the run finishes (or ``max_ticks`` ticks)."""
        while not self.finished and (max_ticks is None or self.ticks < max_ticks):
            self.tick()
            if not self.finished:
                time.sleep(tick_s)
        return self.records
