"""Trident's decisions in words a user understands: the adapter between what a policy and the
runner return and what the Prefect layer shows.

Contract:
- ``read_decision(policy, state, plan, samples)`` turns a plan a policy returned into a frozen
  ``Decision``: one plain sentence first (what changes, why, what it is expected to gain and
  when it pays back its start-up), the figures in their own fields, and the policy's full
  reason (solver details and all) only in ``raw_reason``.
- ``read_outcome(report, error)`` turns what ``runner.apply`` returned (an ``ApplyReport``, or
  the error it raised) into an ``Outcome``: "applied", "partial" or "refused", with the reason.
  It is the one place that knows the apply's return type.
- ``explain_hold(reason)`` says in one sentence why a tick changed nothing.
The figures are read from the policy's record and, where the policy states them only in its
reason text (predicted throughput, items lost to the switch), from that text: a figure that is
not found is None and its clause is left out of the sentence, never guessed.
Pure functions: no Ray, no Prefect.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Optional

from trident_flows.scheduler.types import Plan

_NUM = r"([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_PREDICTED = re.compile(rf"predicted {_NUM} -> {_NUM} input items/s")
_COST = re.compile(rf"gain {_NUM} items, cost {_NUM} items")
_ROLLOUT = re.compile(rf"rollout {_NUM} s")
_BOTTLENECK = re.compile(r"bottleneck ([A-Za-z0-9_.\-]+)")
_ROLLBACK = re.compile(rf"measured {_NUM} items/s, short of the predicted {_NUM}")
_UNSAFE = re.compile(r"([A-Za-z0-9_.\-]+) runs ([^\s:]+): ([^;]+)")
_CANARY_VERDICT = re.compile(r"canary (\S+) of (\S+) (accepted|rejected|abandoned|accept|reject)")

# Units of a pipeline's input items, for sentences ("+45% docs/s").
UNITS = {"documents": "docs/s", "emulated-docs": "docs/s", "video": "videos/s", "emulated-video": "videos/s"}


def unit_of(pipeline: str) -> str:
    return UNITS.get(pipeline, "items/s")


@dataclass(frozen=True)
class OperatorChange:
    """One operator's serving replicas and configurations before and after a decision."""

    operator: str
    replicas_before: int
    replicas_after: int
    config_before: str
    config_after: str

    def text(self) -> str:
        """``ocr 1 -> 3 replicas``, or ``embed cpu/b8 -> gpu/b16`` when the configuration changes."""
        if self.config_before != self.config_after:
            count = "" if self.replicas_before == self.replicas_after else f" ({self.replicas_before} -> {self.replicas_after} replicas)"
            return f"{self.operator} {self.config_before} -> {self.config_after}{count}"
        return f"{self.operator} {self.replicas_before} -> {self.replicas_after} replica{'s' if self.replicas_after != 1 else ''}"


@dataclass(frozen=True)
class Decision:
    """A plan the policy handed to the runner, explained. Throughputs are predicted input
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
    steps = len(report.steps_done)
    if report.ok and steps:
        return Outcome("applied", report.reason, report.seconds, report.dip)
    if report.ok:
        return Outcome("refused", f"the runner found nothing to roll out ({explain_hold(report.reason or 'no change')})")
    if steps:
        return Outcome("partial", f"{steps} step(s) done, then: {report.error}", report.seconds, report.dip)
    return Outcome("refused", report.error)


def _float(match: Optional[re.Match], group: int) -> Optional[float]:
    return float(match.group(group)) if match else None


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(seconds, 1):.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} minutes"
    return f"{seconds / 3600:.1f} hours"


def _serving(state: Any, operator: str) -> tuple[int, str]:
    try:
        counts = state.operator(operator).configs()
    except KeyError:
        return 0, "-"
    return sum(counts.values()), "+".join(sorted(c.label() for c in counts)) or "-"


def changes_of(state: Any, plan: Plan) -> tuple[OperatorChange, ...]:
    """What the plan changes, operator by operator (operators it leaves as they are are left out)."""
    out = []
    for op in plan.operators:
        before, config_before = _serving(state, op.operator)
        after = op.replicas
        config_after = "+".join(sorted({g.config.label() for g in op.groups if g.replicas})) or "-"
        if op.canary is not None:
            config_after = f"{config_after} (canary {op.canary.label()})"
        if before != after or config_before != config_after:
            out.append(OperatorChange(op.operator, before, after, config_before, config_after))
    return tuple(out)


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


def _bottleneck(state: Any, plan: Plan, changes: tuple[OperatorChange, ...]) -> Optional[str]:
    named = _BOTTLENECK.search(plan.reason)
    if named:
        return named.group(1).rstrip(";,.")
    for op in plan.operators:
        if op.reason.startswith("bottleneck"):
            return op.operator
    grown = [c.operator for c in changes if c.replicas_after > c.replicas_before]
    if grown:
        return max(grown, key=lambda name: state.operator(name).busy_fraction)
    return None


def _record_of(policy: Any, plan: Plan) -> Any:
    record = getattr(policy, "last_record", None)
    return record if record is not None and getattr(record, "plan", None) is plan else None


def policy_reason(policy: Any) -> str:
    """Why the policy's last decision was what it was, when the policy records it (the Trident
    controller's ``last_record``, the baselines' ``last``); "" otherwise."""
    for attr in ("last_record", "last"):
        reason = getattr(getattr(policy, attr, None), "reason", "")
        if reason:
            return str(reason)
    return ""


def read_decision(policy: Any, state: Any, plan: Plan, samples: Iterable[Any] = (), now: Optional[float] = None) -> Decision:
    """Explain ``plan``, which ``policy`` just returned for ``state`` (see the module docstring)."""
    record = _record_of(policy, plan)
    action = getattr(record, "action", "")
    raw = plan.reason or policy_reason(policy)
    changes = changes_of(state, plan)
    unit = unit_of(state.pipeline)
    predicted = _PREDICTED.search(raw)
    before, after = _float(predicted, 1), _float(predicted, 2)
    if after is None and plan.predicted_throughput > 0:
        after = plan.predicted_throughput
    cost = _COST.search(raw)
    startup = _float(_ROLLOUT.search(raw), 1)
    payback = None
    if cost and before is not None and after is not None and after > before:
        payback = float(cost.group(2)) / (after - before)
    gain = after / before - 1 if before and after is not None else None
    expected = f", expected {gain:+.0%} {unit}" if gain is not None else ""
    pays = (f", pays back its {startup:.0f} s start-up in {_duration(payback)}" if startup is not None and payback is not None else "")
    text = _changes_text(changes)
    canaries = [o for o in plan.operators if o.canary is not None]
    verdict = _CANARY_VERDICT.search(raw)
    rollback = _ROLLBACK.search(raw)
    unsafe = _UNSAFE.search(raw) if raw.startswith("memory safety") else None
    if action == "rollback" or rollback:
        kind = "rollback"
        sentence = "Rolled back the last change" + (
            f": the pipeline measured {float(rollback.group(1)):.3g} {unit}, short of the predicted {float(rollback.group(2)):.3g}"
            if rollback else "") + f" ({text})"
    elif canaries:
        kind = "canary"
        op = canaries[0]
        sentence = (f"Trying {op.canary.label()} on one extra {op.operator} replica (a canary) before switching the others"
                    + (f"; {len(canaries) - 1} more canar{'ies' if len(canaries) > 2 else 'y'}" if len(canaries) > 1 else ""))
    elif verdict and action == "canary":
        kind = "canary"
        word = {"accept": "accepted", "reject": "rejected"}.get(verdict.group(3), verdict.group(3))
        sentence = f"The canary {verdict.group(1)} of {verdict.group(2)} was {word}: {text}"
    elif unsafe:
        kind = "memory-safety"
        sentence = f"{_title(unsafe.group(1))} risks running out of memory with {unsafe.group(2)}: {text}"
    else:
        kind = "scale" if any(c.replicas_before != c.replicas_after for c in changes) else "reconfigure"
        bottleneck = _bottleneck(state, plan, changes)
        samples = list(samples)
        phrase = workload_phrase(s for s in samples if getattr(s, "operator", None) == bottleneck) if bottleneck else ""
        head = f"{_title(bottleneck)} is the bottleneck{phrase}" if bottleneck else "Rebalancing the pipeline"
        sentence = f"{head}: {text}{expected}{pays}"
    return Decision(at=time.time() if now is None else now, kind=kind, sentence=sentence, changes=changes,
                    throughput_before=before, throughput_after=after, startup_s=startup,
                    payback_s=payback if payback is not None and math.isfinite(payback) else None, raw_reason=raw)


_HOLDS = (
    ("waiting for samples", "Waiting for enough measurements to model every operator"),
    ("verifying the last rollout", "Checking that the last change delivers what it promised before planning again"),
    ("the current placement is the MILP's optimum", "The current configuration is already the best one the model finds"),
    ("wait (no throughput gain)", "No other configuration is predicted to be faster"),
    ("wait (the gain does not pay for the switch)", "A faster configuration exists, but it would not pay back its start-up before the workload changes"),
    ("the MILP's plan changes operators but max_changes", "A faster configuration exists, but it changes more operators than one tick may"),
    ("the MILP's plan was rolled back before", "The faster plan was rolled back before for this workload: keeping the current configuration"),
    ("cannot price the change", "The cost of a change could not be estimated: keeping the current configuration"),
    ("kept the current plan after a failed step", "A scheduling step failed: keeping the current configuration (details in the raw data)"),
    ("the plan equals the current placement", "The plan equals the current configuration"),
)
_MIN_GAIN = re.compile(r"predicted gain ([-+]?[0-9.]+%)[^;]*under min_gain ([0-9.]+%)")


def explain_hold(reason: str) -> str:
    """One sentence saying why a tick (or a rollout) changed nothing, from the policy's reason."""
    text = reason.strip()
    for start, sentence in _HOLDS:
        if text.startswith(start):
            return sentence
    gain = _MIN_GAIN.search(text)
    if gain:
        return f"The best change would gain {gain.group(1)}, under the {gain.group(2)} a change must bring"
    if not text or text == "no change":
        return "No change needed"
    return _title(text.split(";")[0].split(" (")[0])[:160]
