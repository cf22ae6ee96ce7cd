"""The account of what the policy did in a run: what ``trident-flows run``, its ``--summary-json`` and the Prefect curation run show.

Contract:
- ``build_account(...) -> RunAccount``: every decision as a ``DecisionEffect`` (what changed, its
  status, and for a change of replicas its MEASURED effect on items/s before and after), OOMs
  avoided, the ESTIMATE of the rate without trident, and why no decision was made, if none was.
- ``policy_figures(policy_name, policy, record, samples, start, state)``: what only the policy can
  tell, taken where it lives (the in-process loop, or the Prefect sidecar at the pipeline's end);
  ``account_of_run(figures, read_t, done_t, state)`` is the account from them and the runner's item
  times. ``why_no_decisions`` says why a run made no decision from the policy's last tick.
- ``RunAccount.to_dict()`` gives the summary keys (``decisions``, ``decisions_note``,
  ``ooms_avoided*``, ``estimated_rate_without_trident`` and its ``_note``, ``timeline_png``,
  ``started_from``); ``lines()`` the CLI's lines; ``markdown(png)`` the Prefect artifact.
  Estimates are labelled ESTIMATE wherever they appear.
"""

from __future__ import annotations

import base64
import math
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import numpy as np

from trident_flows.control.ooms_avoided import OomsAvoided, count_ooms_avoided
from trident_flows.control.run_record import REBALANCE, CountPoint, DecisionTaken, RunRecord
from trident_flows.control.start_estimate import Estimate, estimate_without_trident
from trident_flows.core.state import ApplyStatus, RunnerState
from trident_flows.core.types import BatchSample, OpConfig, PlanKind

WINDOW_S = 30.0     # how long before and after a change its effect is measured over
MIN_WINDOW_S = 5.0  # a shorter window measures a batch or two, not a rate
ROLLED_BACK = "rolled back"
REASON_CHARS = 160  # the reason shown in a CLI line (the JSON keeps it whole)
CELL_CHARS = 90     # the reason shown in the artifact's table, its last column (a wide table scrolls its figures away)
# A rollback undoes the last rollout under verification: a throughput change (trident's, or a baseline's rebalance)
VERIFIED_KINDS = (PlanKind.THROUGHPUT.value, REBALANCE)


@dataclass(frozen=True)
class DecisionEffect:
    """One decision as the account shows it; ``effect`` is None with ``effect_note`` saying why."""

    n: int
    at_s: float
    landed_s: float | None
    kind: str
    operators: tuple[str, ...]
    changes: tuple[dict[str, Any], ...]
    reason: str
    status: str
    status_reason: str
    effect: dict[str, Any] | None
    effect_note: str

    def change_text(self) -> str:
        return "; ".join(f"{c['operator']} {c['from']} -> {c['to']}" for c in self.changes) or "no operator changes"

    def effect_text(self) -> str:
        if self.effect is None:
            return self.effect_note
        p = self.effect["pipeline_items_per_s"]
        ops = ", ".join(f"{name} {v['before']:.3g} -> {v['after']:.3g}" for name, v in self.effect["operators"].items()
                        if v["before"] is not None and v["after"] is not None)
        before, after = self.effect["window_s"]
        return (f"pipeline {p['before']:.3g} -> {p['after']:.3g} items/s" + (f", {ops} items/s" if ops else "")
                + f" (measured, {before:.0f} s before vs {after:.0f} s after)")

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.n, "at_s": round(self.at_s, 2), "landed_s": None if self.landed_s is None else round(self.landed_s, 2),
                "kind": self.kind, "operators": list(self.operators), "change": self.change_text(), "changes": list(self.changes),
                "reason": self.reason, "status": self.status, "status_reason": self.status_reason, "effect": self.effect,
                "effect_note": self.effect_note}


@dataclass(frozen=True)
class RunAccount:
    """What the policy did in one run (see the module docstring)."""

    policy: str
    decisions: tuple[DecisionEffect, ...]
    no_decisions_reason: str
    ooms: OomsAvoided
    estimate: Estimate
    measured_items_per_s: float
    origin: float = 0.0  # wall-clock time of the account's second 0
    end: float = 0.0     # wall-clock time of the run's end (its last item done or last count point)
    timeline_png: str | None = None
    started_from: str = ""  # the configuration the policy started the run in, where not the pipeline's own (e.g. the memory's)

    def with_png(self, path: str | None) -> "RunAccount":
        return replace(self, timeline_png=path)

    @property
    def decisions_note(self) -> str:
        return "" if self.decisions else f"no decisions: {self.no_decisions_reason}"

    def to_dict(self) -> dict[str, Any]:
        est = self.estimate.items_per_s
        return {"decisions": [d.to_dict() for d in self.decisions], "decisions_note": self.decisions_note,
                "ooms_avoided": self.ooms.count, "ooms_avoided_counts": self.ooms.note,
                "ooms_avoided_configs": [{"operator": o.operator, "config": o.config, "why": o.why} for o in self.ooms.configs],
                "estimated_rate_without_trident": None if est is None else round(est, 4),
                "estimated_rate_without_trident_note": self.estimate.note, "timeline_png": self.timeline_png,
                "started_from": self.started_from or None}

    def _estimate_text(self) -> str:
        est = self.estimate.items_per_s
        if est is None:
            return f"ESTIMATE without trident: none ({self.estimate.note.removeprefix('no estimate: ')})"
        same = "; nothing was changed, so the gap is the models' error" if all(d.landed_s is None for d in self.decisions) else ""
        return (f"ESTIMATE without trident: {est:.3g} items/s for the starting configuration (from the fitted models; "
                f"measured with {self.policy}: {self.measured_items_per_s:.3g} items/s{same})")

    def _ooms_text(self) -> str:
        if self.ooms.count is None:
            return f"OOMs avoided: {self.ooms.note}"
        listed = "; ".join(f"{o.operator} {o.config} ({o.why})" for o in self.ooms.configs)
        return f"OOMs avoided: {self.ooms.count}" + (f": {listed}" if listed else "") + f" (counts {self.ooms.note})"

    def lines(self) -> list[str]:
        """The CLI's account: one line per decision, then OOMs avoided, the estimate and the timeline's path."""
        out = [f"What {self.policy} did:"] + ([f"  {_short(self.started_from)}"] if self.started_from else [])
        if not self.decisions:
            out.append(f"  {self.decisions_note}")
        for d in self.decisions:
            out.append(f"  #{d.n} at {d.at_s:.0f} s: {d.change_text()} [{d.kind}] - {_short(d.reason)}; {d.status}"
                       + (f" ({_short(d.status_reason)})" if d.status_reason and d.status != ApplyStatus.LANDED.value else "")
                       + f"; effect: {d.effect_text()}")
        out += [f"  {self._ooms_text()}", f"  {self._estimate_text()}"]
        if self.estimate.items_per_s is not None:
            out.append(f"    ({self.estimate.note})")
        if self.timeline_png:
            out.append(f"  timeline: {self.timeline_png}")
        return out

    def markdown(self, png: bytes | None = None) -> str:
        """The Prefect artifact: figures, decisions (or why none), the timeline PNG inlined."""
        est = self.estimate.items_per_s
        rows = [("policy", self.policy), ("decisions", str(len(self.decisions))),
                ("measured throughput (items/s)", f"{self.measured_items_per_s:.3g}"),
                ("ESTIMATE without trident (items/s)", "none" if est is None else f"{est:.3g} (estimate)"),
                ("OOMs avoided", "not counted" if self.ooms.count is None else str(self.ooms.count))]
        parts = [f"# What {self.policy} did in this run", "", "| figure | value |", "|---|---|"]
        parts += [f"| {k} | {v} |" for k, v in rows]
        ooms = f"**OOMs avoided** counts {self.ooms.note}" if self.ooms.count is not None else f"**OOMs avoided**: {self.ooms.note}"
        parts += ["", f"**Estimate without trident**: {_cell(self.estimate.note)}", "", _cell(ooms), ""]
        if self.started_from:
            parts += [f"**Start**: {_cell(self.started_from)}", ""]
        if not self.decisions:
            parts += [f"**{_cell(self.decisions_note)}**", ""]
        else:
            parts += ["| # | at (s) | change | status | measured effect | kind | reason |", "|---|---|---|---|---|---|---|"]
            parts += [f"| {d.n} | {d.at_s:.0f} | {_cell(d.change_text())} | "
                      f"{d.status}{' (' + _cell(_short(d.status_reason)) + ')' if d.status_reason and d.status != 'landed' else ''} | "
                      f"{_cell(d.effect_text())} | {d.kind} | {_cell(_short(d.reason, CELL_CHARS))} |" for d in self.decisions]
            parts.append("")
        if png:
            parts += [f"![throughput over the run, decisions marked](data:image/png;base64,{base64.b64encode(png).decode('ascii')})", ""]
        if self.timeline_png:
            parts.append(f"Timeline written to `{self.timeline_png}`.")
        return "\n".join(parts)


def _short(text: str, chars: int = REASON_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= chars else text[:chars - 3] + "..."


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def why_no_decisions(policy_name: str, policy: Any, record: RunRecord | None) -> str:
    """Why a run made no decision, from what its policy said at its last tick."""
    if policy_name == "static":
        return "the static policy never changes the configuration"
    ticks = len(record.points) if record is not None else 0
    if policy is None or ticks == 0:
        return f"the {policy_name} policy was never asked (the run ended before it had the samples it needs)"
    last_tick = getattr(policy, "last_record", None)  # Trident's TickRecord; a baseline's last evaluation otherwise
    reason = last_tick.decision.reason if last_tick is not None else getattr(getattr(policy, "last", None), "reason", "")
    said = " ".join(str(reason or "").split())
    return f"{policy_name} kept the starting configuration through {ticks} ticks; its last tick: {said or 'no change'}"


@dataclass(frozen=True)
class PolicyFigures:
    """What only the policy can tell about a run (see the module docstring)."""

    policy: str
    record: RunRecord | None
    ooms: OomsAvoided
    estimate: Estimate
    no_decisions_reason: str
    started_from: str = ""
    run_figures: dict[str, Any] = field(default_factory=dict)  # the policy's summary keys (``run_figures()``), e.g. memory_loaded


def policy_figures(policy_name: str, policy: Any, record: RunRecord | None, samples: Sequence[BatchSample],
                   start: Sequence[tuple[str, OpConfig, int]], state: RunnerState) -> PolicyFigures:
    """The record, OOMs avoided, the estimate without trident and why no decision was made (see the module docstring)."""
    decisions = list(record.decisions) if record is not None else []
    run_figures = getattr(policy, "run_figures", None)
    return PolicyFigures(policy_name, record, count_ooms_avoided(policy_name, policy, decisions),
                         estimate_without_trident(policy_name, policy, start, samples, state),
                         why_no_decisions(policy_name, policy, record), getattr(policy, "started_from", None) or "",
                         run_figures() if run_figures is not None else {})


def account_of_run(figures: PolicyFigures, read_t: np.ndarray, done_t: np.ndarray, state: RunnerState) -> RunAccount:
    """The account of a finished run (see the module docstring)."""
    account = build_account(figures.policy, figures.record, read_t, done_t, figures.ooms, figures.estimate,
                            state.items_in / state.wall_s if state.wall_s > 0 else 0.0, figures.no_decisions_reason)
    return replace(account, started_from=figures.started_from)


def build_account(policy_name: str, record: RunRecord | None, read_t: np.ndarray, done_t: np.ndarray, ooms: OomsAvoided, estimate: Estimate,
                  measured_items_per_s: float, no_decisions_reason: str, window_s: float = WINDOW_S) -> RunAccount:
    """The run's account. ``record``: the control loop's ``RunRecord`` (None: no loop ran); ``read_t`` / ``done_t``:
    the wall-clock times the input items were read and done (``Latencies``; NaN ignored). Times in the account are
    seconds since the first item was read (the first count point or item done when that is earlier).

    Each decision becomes one ``DecisionEffect``: its time, operators, what changed (``from -> to`` per operator),
    reason, status (``landed``, ``partial``, ``refused``, or ``rolled back`` for a landed throughput change a later
    rollback undid) and, for one that changed replicas, its MEASURED effect: input items done per second
    (``done_t``) and each changed operator's items taken per second (the record's count points, interpolated) in
    the ``window_s`` before it was decided against the ``window_s`` after its last step finished; a window is cut at
    the previous change's landing, the next decision and the run's ends, and under ``MIN_WINDOW_S`` the effect is
    None with the reason."""
    done = np.sort(np.asarray(done_t, dtype=float)[~np.isnan(np.asarray(done_t, dtype=float))])
    points = list(record.points) if record is not None else []
    taken = list(record.decisions) if record is not None else []
    read = np.asarray(read_t, dtype=float)
    read = read[~np.isnan(read)]
    origin = min([p.at for p in points[:1]] + [float(t) for t in done[:1]] + ([float(read.min())] if len(read) else []), default=0.0)
    end = max([p.at for p in points[-1:]] + [float(t) for t in done[-1:]], default=origin)
    rolled_back = _rolled_back(taken)
    effects = []
    for k, d in enumerate(taken):
        status = ROLLED_BACK if k in rolled_back else d.status
        effect, note = _effect(k, taken, points, done, origin, end, window_s)
        effects.append(DecisionEffect(k + 1, d.at - origin, None if d.landed_at is None else d.landed_at - origin, d.kind, d.operators,
                                      tuple({"operator": c.operator, "from": f"{c.replicas_before}x {c.config_before}",
                                             "to": f"{c.replicas_after}x {c.config_after}"} for c in d.changes),
                                      d.reason, status, d.status_reason, effect, note))
    return RunAccount(policy_name, tuple(effects), no_decisions_reason, ooms, estimate, measured_items_per_s, origin, end)


def _rolled_back(taken: Sequence[DecisionTaken]) -> set[int]:
    """Indexes of the landed throughput changes a later landed rollback undid (each rollback undoes the last one before it)."""
    out: set[int] = set()
    for k, d in enumerate(taken):
        if d.kind != PlanKind.ROLLBACK.value or d.landed_at is None:
            continue
        undone = [j for j in range(k) if taken[j].kind in VERIFIED_KINDS and taken[j].landed_at is not None and j not in out]
        if undone:
            out.add(undone[-1])
    return out


def _effect(k: int, taken: Sequence[DecisionTaken], points: Sequence[CountPoint], done: np.ndarray, origin: float, end: float,
            window_s: float) -> tuple[dict[str, Any] | None, str]:
    """The measured rates before decision ``k`` and after it landed, or None and why."""
    d = taken[k]
    if d.landed_at is None:
        return None, f"not measured: the apply was {d.status}, nothing changed"
    earlier = [t.landed_at for t in taken[:k] if t.landed_at is not None and t.landed_at <= d.at]
    later = [t.at for t in taken[k + 1:]]
    before = (max([d.at - window_s, origin] + earlier), d.at)
    after = (d.landed_at, min([d.landed_at + window_s, end] + later))
    for label, (a, b) in (("before it", before), ("after it landed", after)):
        if b - a < MIN_WINDOW_S:
            return None, f"not measured: only {max(b - a, 0.0):.1f} s {label} (under {MIN_WINDOW_S:g} s)"
    operators = {name: {"before": _op_rate(points, name, *before), "after": _op_rate(points, name, *after)} for name in d.operators}
    effect = {"window_s": [round(before[1] - before[0], 1), round(after[1] - after[0], 1)],
              "pipeline_items_per_s": {"before": round(_done_rate(done, *before), 4), "after": round(_done_rate(done, *after), 4)},
              "operators": {n: {k2: None if v is None else round(v, 4) for k2, v in r.items()} for n, r in operators.items()}}
    return effect, ""


def _done_rate(done: np.ndarray, a: float, b: float) -> float:
    """Input items done per second in [a, b)."""
    return float(np.searchsorted(done, b, side="left") - np.searchsorted(done, a, side="left")) / (b - a)


def _op_rate(points: Sequence[CountPoint], operator: str, a: float, b: float) -> float | None:
    """Items ``operator`` took per second in [a, b], its cumulative count interpolated between count points (None where
    the points do not cover the window)."""
    ts = [p.at for p in points if operator in dict(p.items_in)]
    if len(ts) < 2 or a < ts[0] - 1e-9 or b > ts[-1] + 1e-9:
        return None
    counts = [dict(p.items_in)[operator] for p in points if operator in dict(p.items_in)]
    at_a, at_b = np.interp([a, b], ts, counts)
    rate = float(at_b - at_a) / (b - a)
    return rate if math.isfinite(rate) else None
