"""The step every in-process control loop takes once it holds a runner's state and new samples:
decide, then apply the plan and tell the policy how it went.

Contract: ``decide_and_apply(policy, state, samples, apply, decide=..., may_apply=...)`` calls
``decide(policy, state, samples)`` (``policies.decide_once`` unless given; the Trident
controller passes its policy's ``tick``) and, when the result's ``plan`` is not None and
``may_apply()`` still holds, applies it through the shared apply step
(``control.apply_step.apply_plan``: an exception from ``apply`` is a refusal, the outcome goes to
the policy's ``observe_apply``). It returns a ``Step``: the decision and the ``Applied`` (None
when nothing was applied). An exception from ``decide`` propagates: what a failing policy does to
the loop (log and go on, an error record, the sample cursor kept or moved) is each loop's own, as
is how it reads state and samples and what it writes (decision logs, counters, summaries).

Used by ``control/loop.py`` (``tick_runner``, the tick of the ``ControlLoop`` and the Trident
``Controller``) and ``sim/driver.py``. The Prefect sidecar
(``flows/trident_sidecar.py``) does not use it: there the decision is taken in the flow and the
plan applied in a separate ``roll-out`` task run (one per decision, named after it), with the
policy pickled into a Ray actor between ticks, so it uses the two halves of the apply step
(``apply_plan`` in the task, ``tell_policy`` in the flow) directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from trident_flows.control.apply_step import Applied, apply_plan
from trident_flows.core.state import ApplyReport, RunnerState
from trident_flows.core.types import BatchSample, Plan
from trident_flows.scheduler.policies import decide_once


@dataclass(frozen=True)
class Step:
    """What one step did: the policy's decision (anything with a ``plan``) and what became of
    its plan (None when there was no plan or ``may_apply`` said no)."""

    decision: Any
    applied: Applied | None


def decide_and_apply(policy: Any, state: RunnerState, samples: Sequence[BatchSample], apply: Callable[[Plan], ApplyReport], *,
                     decide: Callable[[Any, RunnerState, Sequence[BatchSample]], Any] = decide_once,
                     may_apply: Callable[[], bool] = lambda: True) -> Step:
    """Decide, and apply the plan when there is one (see the module docstring)."""
    decision = decide(policy, state, samples)
    if decision.plan is None or not may_apply():
        return Step(decision, None)
    return Step(decision, apply_plan(apply, decision.plan, policy))
