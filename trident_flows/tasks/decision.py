"""Trident's decisions in words a user understands: the adapter between what a policy and the
runner return and what the Prefect layer shows. Pure functions: no Ray, no Prefect.

Contract:
- ``read_decision(state, decision, samples)`` turns a ``Decision`` with a plan into a frozen
  ``Explanation``: one plain sentence (what changes, why, expected gain, payback), the figures in
  fields, the full reason only in ``raw_reason``. Built from typed values only (the plan against
  the state, the ``Rationale``): the reason text is never read, and a figure the rationale does
  not give is None and left out, never guessed. A plan without a rationale reads as a rebalance.
- ``read_outcome(report, error)``: an ``ApplyReport`` (through its ``ApplyOutcome``) or an error
  as an ``Outcome`` ("applied", "partial" or "refused", with the reason); the one place that
  knows the apply's return type.
- ``explain_hold(hold, reason)``: why a tick changed nothing, in one sentence, from its ``Hold``.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Optional

from trident_flows.core.changes import OperatorChange, changes_of
from trident_flows.core.decision import Decision, Hold, HoldKind
from trident_flows.core.state import ApplyStatus
from trident_flows.core.types import Plan, PlanKind, Rationale

# Units of a pipeline's input items, for sentences ("+45% docs/s").
UNITS = {"documents": "docs/s", "emulated-docs": "docs/s", "video": "videos/s", "emulated-video": "videos/s"}


def unit_of(pipeline: str) -> str:
    return UNITS.get(pipeline, "items/s")


@dataclass(frozen=True)
class Explanation:
    """A decision whose plan the policy handed to the runner, explained. Throughputs are predicted input
    items/s (None when the policy does not predict); ``startup_s`` is how long the change takes
    to be in place; ``payback_s`` how long the expected gain takes to make up for what the
    switch costs."""

    at: float
    kind: str
    sentence: str
    changes: tuple[OperatorChange, ...]
    throughput_before: Optional[float]
    throughput_after: Optional[float]
    startup_s: Optional[float]
    payback_s: Optional[float]
    raw_reason: str

    @property
    def gain(self) -> Optional[float]:
        if self.throughput_before and self.throughput_after is not None and self.throughput_before > 0:
            return self.throughput_after / self.throughput_before - 1
        return None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["gain"] = self.gain
        return data


@dataclass(frozen=True)
class Outcome:
    """What became of a decision: ``status`` is "applied", "partial" or "refused"."""

    status: str
    reason: str
    seconds: float = 0.0
    dip: float = 0.0

    def text(self) -> str:
        if self.status == "applied":
            return f"applied in {self.seconds:.0f} s, throughput dip {self.dip:.0%}"
        return f"{self.status}: {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_outcome(report: Any = None, error: str = "") -> Outcome:
    """The ``Outcome`` of ``runner.apply``: its ``ApplyReport``, or the error it raised."""
    if error or report is None:
        return Outcome("refused", error or "the runner returned no report")
    outcome = report.outcome
    if outcome.status == ApplyStatus.LANDED and outcome.steps_done:
        return Outcome("applied", outcome.reason, report.seconds, report.dip)
    if outcome.status == ApplyStatus.LANDED:  # the runner returns no step only for a plan equal to what runs
        return Outcome("refused", "the runner found nothing to roll out: the plan equals the current configuration")
    if outcome.status == ApplyStatus.PARTIAL:
        return Outcome("partial", f"{outcome.steps_done} step(s) done, then: {outcome.reason}", report.seconds, report.dip)
    return Outcome("refused", outcome.reason)


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(seconds, 1):.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} minutes"
    return f"{seconds / 3600:.1f} hours"


def workload_phrase(samples: Iterable[Any]) -> str:
    """" for scanned PDFs" / " for born-digital PDFs" when the batches' features tell (the
    document pipelines report pages and scanned pages); "" otherwise."""
    pages = scanned = 0.0
    for s in samples:
        features = getattr(s, "features", {}) or {}
        if "scanned_pages" in features and "pages" in features:
            pages += float(features["pages"])
            scanned += float(features["scanned_pages"])
    if pages <= 0:
        return ""
    share = scanned / pages
    return " for scanned PDFs" if share >= 0.5 else (" for born-digital PDFs" if share <= 0.1 else " for mixed PDFs")


def _title(name: str) -> str:
    return name[:1].upper() + name[1:]


def _changes_text(changes: tuple[OperatorChange, ...]) -> str:
    shown = [c.text() for c in changes[:3]]
    if len(changes) > 3:
        shown.append(f"and {len(changes) - 3} more")
    return ", ".join(shown) or "no operator changes"


def _bottleneck(state: Any, rationale: Optional[Rationale], changes: tuple[OperatorChange, ...]) -> Optional[str]:
    """The operator the plan relieves: a grown operator the plan names as a bottleneck, else the
    busiest grown operator, else the plan's first bottleneck."""
    named = rationale.bottlenecks if rationale is not None else ()
    grown = [c.operator for c in changes if c.replicas_after > c.replicas_before]
    for name in named:
        if name in grown:
            return name
    if grown:
        return max(grown, key=lambda name: state.operator(name).busy_fraction)
    return named[0] if named else None


def _canary_sentence(plan: Plan, rationale: Optional[Rationale], text: str, resized: bool) -> str:
    """Canaries the plan starts, then those it ends with their verdicts; the replica changes only
    when the plan also resizes an operator (a canary's own replica is in the words already)."""
    parts = [f"Trying {o.canary.label()} on one extra {o.operator} replica (a canary) before switching the others"
             for o in plan.operators if o.canary is not None]
    ended = rationale.canaries_ended if rationale is not None else ()
    parts += [f"the canary {e.config.label()} of {e.operator} was {e.verdict.value}" for e in ended]
    if not parts:
        return f"Ending a canary: {text}"
    return _title("; ".join(parts)) + (f": {text}" if resized else "")


def read_decision(state: Any, decision: Decision, samples: Iterable[Any] = (), now: Optional[float] = None) -> Explanation:
    """Explain ``decision``, which a policy just returned for ``state``, with its plan (see the module docstring)."""
    plan, rationale = decision.plan, decision.rationale
    if plan is None:
        raise ValueError(f"a {decision.action} decision hands no plan to the runner: explain it with explain_hold")
    changes = changes_of(state, plan)
    unit = unit_of(state.pipeline)
    before = rationale.throughput_before if rationale is not None else None
    after = rationale.throughput_after if rationale is not None else None
    if after is None and plan.predicted_throughput > 0:
        after = plan.predicted_throughput
    startup = rationale.rollout_s if rationale is not None else None
    payback = rationale.payback_s if rationale is not None else None
    gain = after / before - 1 if before and after is not None else None
    expected = f", expected {gain:+.0%} {unit}" if gain is not None else ""
    pays = (f", pays back its {startup:.0f} s start-up in {_duration(payback)}" if startup is not None and payback is not None else "")
    text = _changes_text(changes)
    kind = rationale.kind if rationale is not None else (
        PlanKind.CANARY if any(o.canary is not None for o in plan.operators) else PlanKind.THROUGHPUT)
    if kind == PlanKind.ROLLBACK:
        measured = (f": the pipeline measured {rationale.measured_after:.3g} {unit} after it, against {rationale.measured_before:.3g} before"
                    if rationale.measured_before is not None and rationale.measured_after is not None else "")
        label, sentence = "rollback", f"Rolled back the last change{measured} ({text})"
    elif kind == PlanKind.CANARY:
        resized = any(c.replicas_before != c.replicas_after for c in changes)
        label, sentence = "canary", _canary_sentence(plan, rationale, text, resized)
    elif kind == PlanKind.MEMORY_SAFETY and rationale.unsafe:
        operator, config = rationale.unsafe[0]
        label, sentence = "memory-safety", f"{_title(operator)} risks running out of memory with {config.label()}: {text}"
    else:
        label = "scale" if any(c.replicas_before != c.replicas_after for c in changes) else "reconfigure"
        bottleneck = _bottleneck(state, rationale, changes)
        phrase = workload_phrase(s for s in samples if getattr(s, "operator", None) == bottleneck) if bottleneck else ""
        head = f"{_title(bottleneck)} is the bottleneck{phrase}" if bottleneck else "Rebalancing the pipeline"
        sentence = f"{head}: {text}{expected}{pays}"
    return Explanation(at=time.time() if now is None else now, kind=label, sentence=sentence, changes=changes,
                       throughput_before=before, throughput_after=after, startup_s=startup,
                       payback_s=payback if payback is not None and math.isfinite(payback) else None,
                       raw_reason=plan.reason or decision.reason)


HOLDS = {
    HoldKind.WAITING_FOR_SAMPLES: "Waiting for enough measurements to model every operator",
    HoldKind.VERIFYING: "Checking that the last change delivers what it promised before planning again",
    HoldKind.OPTIMAL: "The current configuration is already the best one the model finds",
    HoldKind.NO_GAIN: "No other configuration is predicted to be faster",
    HoldKind.DOES_NOT_PAY: "A faster configuration exists, but it would not pay back its start-up before the workload changes",
    HoldKind.UNDER_MIN_GAIN: "The best change would gain too little to be worth a change",
    HoldKind.MAX_CHANGES: "A faster configuration exists, but it changes more operators than one tick may",
    HoldKind.ROLLED_BACK_BEFORE: "The faster plan was rolled back before for this workload: keeping the current configuration",
    HoldKind.CANNOT_PRICE: "The cost of a change could not be estimated: keeping the current configuration",
    HoldKind.REFUSED_BEFORE: "The runner refused this change before: keeping the current configuration until the pipeline changes",
    HoldKind.STEP_FAILED: "A scheduling step failed: keeping the current configuration (details in the raw data)",
}


def explain_hold(hold: Optional[Hold], reason: str = "") -> str:
    """One sentence saying why a tick changed nothing: from the typed ``hold``; for a policy that
    gives only a reason (the baselines), its first clause as it stands."""
    if hold is not None:
        if hold.kind == HoldKind.UNDER_MIN_GAIN and hold.gain is not None and hold.min_gain is not None:
            return f"The best change would gain {hold.gain:+.1%}, under the {hold.min_gain:.0%} a change must bring"
        return HOLDS[hold.kind]
    text = reason.strip()
    if not text or text == "no change":
        return "No change needed"
    return _title(text.split(";")[0].split(" (")[0])[:160]
