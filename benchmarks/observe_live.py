"""Benchmark "observe-live": the observation layer judged on live traces, where decisions are made.

Contract: ``run(quick) -> BenchResult`` replays the committed traces (``benchmarks/traces``,
written by ``benchmarks.record_traces``; quick: ``QUICK``) tick by tick through the loop the trident
controller runs (``_replay``: per operator a ``WINDOW``-sample window, refits after
``REFIT_MIN_SAMPLES``, a ``RegimeDetector`` and an ``OccupancyTracker`` calibrating the model).

Summary (plain numbers):
- ``capacity_mape``: the models' error on held-out windows (``bench observe``'s ``mape``, measured);
- ``saturated_capacity_mape`` (and ``_busy_time``): calibrated capacity against what saturated
  spans measurably took (``_score_span``);
- ``plan_error_median`` / ``plan_error_p90`` (and ``_busy_time``, ``_trident_recorded``, ``_all``):
  each applied plan's predicted against measured completed throughput (``_plans``);
- ``detection_delay_samples``, ``switches_within_6`` and ``false_alarms_per_hour``
  (``_score_detection``; emulated traces only, which have a cost model to say which switches matter).
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from benchmarks.live_trace import Trace, available, load
from benchmarks.report import BenchResult, Target
from trident_flows.core.decision import Action
from trident_flows.core.types import BatchSample
from trident_flows.runtime.costmodel import PipelineProfile
from trident_flows.scheduler.anomaly import MAD_TO_SIGMA
from trident_flows.scheduler.model_values import NoModelError
from trident_flows.scheduler.occupancy import Occupancy, OccupancyTracker, SaturatedSpan, classify, serving_configs
from trident_flows.scheduler.operator_model import OperatorModel
from trident_flows.scheduler.placement.inputs import concave_curve, work_per_item
from trident_flows.scheduler.regime import RegimeDetector
from trident_flows.scheduler.regime_change import ChangeKind
from trident_flows.scheduler.throughput_measure import completed_input_items, placement_settled, stream_positions, sustainable_throughput

WINDOW = 1200              # samples per operator window, as the trident policy keeps
REFIT_MIN_SAMPLES = 8      # as the trident policy
SATURATION_S = 8.0         # as the trident policy's saturation_s
SETTLE_S = 10.0            # seconds of completed throughput measured once a plan is in place
MIN_SETTLE_S = 3.0         # shorter measurement windows (cut by the run's end or a boundary) are not scored
OBSERVABLE = 1.25          # a switch changes the operator's modelled seconds per item by more than this factor
VOTE_WINDOW = 8            # the regime detector's vote window (a features change needs 6 of its last 8 samples)
MIX_SHARE = 0.1            # a measurement whose bottleneck spent more than this share of its busy time on batches of a block it had left is a mix
CONTENT_Z = 4.0           # a sample's features this many scales from its block's regime (and twice as near another) are another block's
CONTENT_MIN_SCALE = 0.05  # floor of a feature's scale (log units), so a constant feature does not make every sample "elsewhere"
MATCH_SAMPLES = 80         # a report within this many samples after a switch (and before the next) matches it
QUICK = ("docs-trident", "video-trident")
WORKLOAD_CHANGED = "not scored: workload changed"


# ---------------------------------------------------------------------------- replay
class _Op:
    def __init__(self, name: str) -> None:
        self.name = name
        self.model = OperatorModel(name)
        self.detector = RegimeDetector(name)
        self.window: deque[tuple[int, BatchSample]] = deque(maxlen=WINDOW)
        self.fed = 0
        self.unfitted = 0
        self.fitted_epoch: int | None = None
        self.spans: list[SaturatedSpan] = []
        self.scored_until = -math.inf


def _replay(trace: Trace, settled_at: dict[int, int] | None = None) -> dict[str, Any]:
    """The controller's observation loop over one trace; returns what it measured. ``settled_at`` maps a plan
    (its index among the trace's decisions) to the tick it settled at: its placement is predicted again there,
    with the models as refitted by then (``predictions_settled``)."""
    ops = {name: _Op(name) for name in trace.operators}
    tracker = OccupancyTracker(SATURATION_S)
    held, spans, changes, fits_ms = [], [], [], []
    predictions: dict[int, dict[str, Any]] = {}
    history: deque[Any] = deque(maxlen=30)
    t0 = trace.ticks[0].at
    plans = [(n, d) for n, d in enumerate(trace.decisions) if d.plan is not None]
    at_tick: dict[int, list[int]] = {}
    for n, k in (settled_at or {}).items():
        at_tick.setdefault(k, []).append(n)
    settled_predictions: dict[int, dict[str, Any]] = {}
    for k, tick in enumerate(trace.ticks):
        state = tick.state
        by_op: dict[str, list[BatchSample]] = {}
        for s in sorted(tick.samples, key=lambda s: s.end):
            if s.operator in ops and s.items_in >= 1:
                by_op.setdefault(s.operator, []).append(s)
        for name, batch in by_op.items():
            op = ops[name]
            replicas = max(1, sum(n for _, n in serving_configs(state.operator(name))))
            for s in batch:
                op.window.append((op.fed, s))
                change = op.detector.observe(s, op.model, replicas)
                if change is not None:
                    changes.append({"operator": name, "index": op.fed, "t": round(s.end - t0, 2), "old": change.old, "new": change.new,
                                    "kind": change.kind.value, "reason": change.reason})
                    op.model.forget_calibration()
                    if change.kind == ChangeKind.RESIDUAL:
                        op.window = deque([(q, x) for q, x in op.window if q >= change.change_point], maxlen=WINDOW)
                        op.fitted_epoch = None
                op.fed += 1
            op.unfitted += len(batch)
            epoch = state.operator(name).config_epoch
            if op.model.ready and op.fitted_epoch == epoch and op.unfitted < REFIT_MIN_SAMPLES:
                continue
            c0 = time.process_time()
            report = op.model.fit([s for _, s in op.window], current_epoch=epoch)
            fits_ms.append((time.process_time() - c0) * 1e3)
            op.unfitted, op.fitted_epoch = 0, epoch
            held += [{"operator": name, "t": round(h.window.end - t0, 2), "predicted": h.predicted, "measured": h.window.throughput,
                      "ape": h.ape} for h in report.held_out]
        for name, span in tracker.update(state, tick.at).items():
            op = ops[name]
            if not span.bound and span.start >= op.scored_until and op.model.ready:
                scored = _score_span(op, span, t0)
                if scored is not None:
                    scored["steady"] = _steady(trace, name, span)
                    spans.append(scored)
                    op.scored_until = span.end
            op.spans.append(span)
            op.model.calibrate(span)
        next_at = trace.ticks[k + 1].at if k + 1 < len(trace.ticks) else math.inf
        while plans and plans[0][1].at < next_at:   # decided between this poll and the next: the models as of this poll
            n, decision = plans.pop(0)
            predictions[n] = _predict_plan(ops, state, list(history), decision.plan)
        for n in at_tick.get(k, ()):   # the plan settled at this poll: the models as refitted by now, before it is measured
            settled_predictions[n] = _predict_plan(ops, state, list(history), trace.decisions[n].plan)
        history.append(state)
    return {"held": held, "spans": spans, "changes": changes, "fits_ms": fits_ms, "predictions": predictions,
            "predictions_settled": settled_predictions,
            "occupancy": {name: _occupancy_shares(trace, name) for name in ops}}


def _predict_plan(ops: dict[str, _Op], state: Any, history: list[Any], plan: Any) -> dict[str, Any]:
    """Pipeline input items/s the replayed models predict for the placement after ``plan``: per operator the
    (concave, as the placement MILP takes it) capacity of its configs over the items it gets per input item,
    the smallest of those; queue-aware (calibrated) and busy-time only."""
    work = work_per_item(state, history)
    changed = {o.operator: {g.config: g.replicas for g in o.groups if g.replicas} for o in plan.operators}
    out: dict[str, Any] = {}
    for label, calibrated in (("queue_aware", True), ("busy_time", False)):
        rates = {}
        for op_state in state.operators:
            name = op_state.name
            groups = changed.get(name, dict(serving_configs(op_state)))
            model = ops[name].model if calibrated else _uncalibrated(ops[name].model)
            try:
                total = 0.0
                for config, n in groups.items():
                    mean, _ = model.predict_many([config] * n, list(range(1, n + 1)))
                    total += concave_curve([float(x) for x in mean])[-1][1]
            except (NoModelError, ValueError) as exc:
                return {"error": f"{name}: {exc}"}
            rates[name] = total / work[name]
        bottleneck = min(rates, key=rates.get)
        out[label] = rates[bottleneck]
        out[f"{label}_bottleneck"] = bottleneck
    return out


def _uncalibrated(model: OperatorModel) -> OperatorModel:
    copy = model.snapshot()
    copy.forget_calibration()
    return copy


def _steady(trace: Trace, name: str, span: SaturatedSpan) -> bool:
    """True when no block boundary of the schedule reached the operator during the span (one workload throughout)."""
    if len(trace.blocks) < 2:
        return True
    at = np.array([t.at for t in trace.ticks])
    pos = np.array([stream_positions(t.state)[name] for t in trace.ticks])
    lo, hi = np.interp([span.start, span.end], at, pos)
    return not any(lo < start <= hi for _, start, _ in trace.blocks[1:])


def _score_span(op: _Op, span: SaturatedSpan, t0: float) -> dict[str, Any] | None:
    """Predicted capacity for a saturated span, for the work it finished (``OperatorModel.span_features``): busy-time
    only, and calibrated by spans that ended before it began (held out). Scored against what the operator measurably
    took (``occupancy.SaturatedSpan``, not bounds) over non-overlapping spans no block boundary reached: a span across
    a boundary measures a mix no model of one workload predicts."""
    try:
        work = op.model.span_features(span)
        raw = sum(float(op.model._predict_raw([c], n, work)[0][0]) for c, n in span.configs)
        earlier = [s for s in op.spans if s.end <= span.start]
        model = op.model.snapshot()
        model.forget_calibration()
        if earlier:
            model.calibrate(earlier[-1])
        calibrated = sum(float(model.predict_many([c], n, work)[0][0]) for c, n in span.configs)
    except (ValueError, RuntimeError):
        return None
    return {"operator": op.name, "start": round(span.start - t0, 2), "seconds": round(span.seconds, 2), "measured": span.measured,
            "busy_time_model": raw, "calibrated": calibrated, "calibration": model.calibration.factor if model.calibration else 1.0,
            "ape_busy_time": abs(raw - span.measured) / span.measured, "ape": abs(calibrated - span.measured) / span.measured}


def _occupancy_shares(trace: Trace, name: str) -> dict[str, float]:
    counts = {o.value: 0 for o in Occupancy}
    for tick in trace.ticks:
        counts[classify(tick.state.operator(name)).value] += 1
    return {k: round(v / len(trace.ticks), 3) for k, v in counts.items()}


# ---------------------------------------------------------------------------- plans
def _in_place(plan_groups: dict[str, dict], state: Any) -> bool:
    for name, want in plan_groups.items():
        op = state.operator(name)
        have = {c: n for c, n in serving_configs(op)}
        if have != want or any(not r.warm for r in op.replicas if not r.draining and not r.canary):
            return False
    return True


def _settling(trace: Trace) -> dict[int, tuple[int, int | None]]:
    """Per placement plan (its index among the trace's decisions): the first poll after it was decided and the
    first poll with its placement in place and settled (``placement_settled`` for the operators it changed;
    None when never)."""
    ticks = trace.ticks
    at = np.array([t.at for t in ticks])
    out = {}
    for n, decision in enumerate(trace.decisions):
        plan = decision.plan
        if plan is None or not plan.operators or (decision.record or {}).get("action") == Action.CANARY.value:
            continue   # a canary tries a config on one extra replica: no placement to judge
        k = int(np.searchsorted(at, decision.at))    # the first poll after the decision
        want = _groups(plan)
        before = ticks[max(k - 1, 0)].state
        changed = [name for name, groups in want.items() if dict(serving_configs(before.operator(name))) != groups]
        out[n] = (k, next((j for j in range(k, len(ticks)) if _in_place(want, ticks[j].state) and placement_settled(ticks[j].state, changed)),
                          None))
    return out


def _groups(plan: Any) -> dict[str, dict]:
    return {o.operator: {g.config: g.replicas for g in o.groups if g.replicas} for o in plan.operators}


def _plans(trace: Trace, predictions: dict[int, dict[str, Any]], settled_predictions: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """Every applied plan with its predicted throughputs (the replayed models', queue-aware and busy-time only,
    and the recording policy's own), against the completed throughput once it settled. A plan whose prediction
    at the decision had not seen the workload is predicted again by the models as refitted when it settled
    (``settled_predictions``, before its measurement began) and scored on that when they had seen it.

    Predicted: what the replayed models say the placement after the plan sustains (per operator the concave
    capacity of its configs over the items it gets per input item, ``placement.inputs.work_per_item``; the
    smallest). Measured: ``throughput_measure.sustainable_throughput`` from the first snapshot with the plan in place
    and settled (``placement_settled`` for the operators it changed) over the next ``SETTLE_S`` seconds, cut at the
    next applied plan, the end of the input and a block boundary entering or leaving the pipeline. A plan is
    "workload changed" and not scored when its predicted bottleneck reached another block during the measurement,
    ran fewer than ``REFIT_MIN_SAMPLES`` batches before the plan, or spent more than ``MIX_SHARE`` of its busy time on
    a block it had left (a model cannot know a workload it has not run; trident's verification does not judge such
    a plan either). Other operators' blocks are not checked: one that became the bottleneck counts as model error."""
    out = []
    ticks = trace.ticks
    boundaries = [a for _, a, _ in trace.blocks][1:]
    applied_at = []
    for n, (k, settled) in _settling(trace).items():
        decision = trace.decisions[n]
        plan = decision.plan
        want = _groups(plan)
        record = decision.record or {}
        policy_predicted = float(record.get("predicted_throughput") or plan.predicted_throughput or 0.0)
        entry = {"t": round(decision.at - ticks[0].at, 2), **predictions.get(n, {"error": "not replayed"}), "policy_predicted": policy_predicted,
                 "policy_measured": float(record.get("pipeline_throughput", 0.0)), "reason": plan.reason[:300]}
        if settled is None:
            in_place = any(_in_place(want, t.state) for t in ticks[k:])
            out.append({**entry, "status": "never settled (a replica never finished a batch)" if in_place else "never in place"})
            continue
        applied_at.append((k, settled, entry, decision.at, n))
    switches = {name: _Switches.of(trace, name) for name in trace.operators}
    for m, (_k, settled, entry, decided_at, n) in enumerate(applied_at):
        start = ticks[settled].state
        next_plan = applied_at[m + 1][0] if m + 1 < len(applied_at) else len(ticks)
        end = settled
        head0, done0 = start.operators[0].items_in, completed_input_items(start)
        for j in range(settled + 1, min(next_plan + 1, len(ticks))):
            st = ticks[j].state
            if st.wall_s - start.wall_s > SETTLE_S + 1e-9:
                break
            if st.input_closed and st.operators[0].queue_items == 0 and classify(st.operators[0]) is Occupancy.STARVED:
                break   # the input ran out: the tail drains, it no longer shows what the placement sustains
            head, done = st.operators[0].items_in, completed_input_items(st)
            if any(head0 < b <= head or done0 < b <= done for b in boundaries):
                break   # another block entered the pipeline or reached its end: no longer the workload the plan was made for
            end = j
        seconds = ticks[end].state.wall_s - start.wall_s
        settled_after = round(ticks[settled].at - decided_at, 2)
        again = settled_predictions.get(n, {})
        if seconds < MIN_SETTLE_S or ("queue_aware" not in entry and "queue_aware" not in again):
            why = entry.get("error") if seconds >= MIN_SETTLE_S else f"measured only {seconds:.1f} s after it settled"
            out.append({**entry, "status": f"not scored: {why}", "settled_after_s": settled_after})
            continue
        measured = sustainable_throughput(start, ticks[end].state)
        judged = _judged_prediction(entry, again, switches, decided_at, ticks[settled].at, ticks[end].at)
        keys = ("queue_aware", "busy_time") + (("policy_predicted",) if judged["predicted_at"] == "decision" else ())
        errors = {f"error_{key}": abs(judged[key] - measured) / measured if measured > 0 else math.inf for key in keys if judged.get(key, 0) > 0}
        out.append({**judged, "settled_after_s": settled_after, "measured": measured, "measured_over_s": round(seconds, 2), **errors})
    return out


def _judged_prediction(at_decision: dict[str, Any], at_settle: dict[str, Any], switches: dict[str, Any], decided_at: float,
                       settled_at: float, until: float) -> dict[str, Any]:
    """The prediction a plan measured up to ``until`` is judged on, with its ``status``: the one made at the
    decision when its bottleneck's model had seen the workload (``_unseen_workload``); else (or when a model
    had no prediction then) the one the models as refitted when the plan settled made, when theirs had; else
    the decision's, marked "workload changed" (or "not scored" without a prediction)."""
    def unseen(prediction: dict[str, Any], since: float) -> str:
        if "queue_aware" not in prediction:
            return f"no prediction ({prediction.get('error', 'not replayed')})"
        name = prediction["queue_aware_bottleneck"]
        sw = switches[name]
        reached = max((t for _, t in sw.blocks if t <= since), default=-math.inf)   # its latest block boundary before the prediction
        return (_unseen_workload({name: sw}, since, until)
                or _mixed_workload(name, sw, max(since - SETTLE_S, reached), since, "before the prediction")
                or _mixed_workload(name, sw, settled_at, until, "during the measurement"))

    why = unseen(at_decision, decided_at)
    if not why:
        return {**at_decision, "status": "scored", "predicted_at": "decision"}
    if "queue_aware" in at_settle and not unseen(at_settle, settled_at):
        return {**at_decision, **at_settle, "status": "scored", "predicted_at": "settled", "decision_prediction": at_decision.get("queue_aware"),
                "decision_unseen": why}
    if "queue_aware" not in at_decision:
        return {**at_decision, "status": f"not scored: {why}", "predicted_at": "decision"}
    return {**at_decision, "status": f"{WORKLOAD_CHANGED}: {why}", "predicted_at": "decision"}


@dataclass(frozen=True)
class _Switches:
    """One operator's samples against the schedule: their end and start times (``ends`` sorted), the block each
    began in (``began``: index into ``names``, the schedule's blocks, by the operator's stream position when the
    batch started) and per block boundary the new block and the end time of the operator's first sample past it
    (``blocks``; inf when none, as ``_truth`` places switches)."""

    ends: np.ndarray
    blocks: list[tuple[str, float]]
    starts: np.ndarray
    began: np.ndarray
    names: tuple[str, ...]

    @classmethod
    def of(cls, trace: Trace, name: str) -> "_Switches":
        samples = [s for s in trace.samples(name) if s.items_in >= 1]
        ends = np.array([s.end for s in samples])
        starts = np.array([s.start for s in samples])
        names = tuple(b[0] for b in trace.blocks)
        if len(trace.blocks) < 2 or not samples:
            return cls(ends, [], starts, np.zeros(len(samples), dtype=int), names)
        pos = _sample_positions(trace, name, samples)
        bounds = [a for _, a, _ in trace.blocks]
        blocks = []
        for new, start, _ in trace.blocks[1:]:
            idx = int(np.searchsorted(pos, start, side="right"))
            blocks.append((new, float(ends[idx]) if idx < len(samples) else math.inf))
        at = np.array([t.at for t in trace.ticks])
        at_start = np.interp(starts, at, np.array([stream_positions(t.state)[name] for t in trace.ticks]))
        return cls(ends, blocks, starts, np.searchsorted(bounds, at_start, side="right") - 1, names)


def _mixed_workload(name: str, sw: _Switches, since: float, until: float, when: str) -> str:
    """Why ``name``'s work from ``since`` to ``until`` (``when``: the measurement, or the ``SETTLE_S`` before a
    prediction, what the model's current workload was drawn from) is of no one workload: more than ``MIX_SHARE`` of
    its busy time then went to batches that began in another block than most of it (a block it had left, still in
    flight: after short documents reached embed in the live cpu-only trace, its long-document batches, an item in 15
    of those it finished, held its replicas for a minute); "" otherwise."""
    busy = np.clip(np.minimum(sw.ends, until) - np.maximum(sw.starts, since), 0.0, None)
    if busy.sum() <= 0:
        return ""
    per_block = np.bincount(sw.began, weights=busy, minlength=len(sw.names))
    main = int(np.argmax(per_block))
    other = 1.0 - per_block[main] / per_block.sum()
    if other <= MIX_SHARE:
        return ""
    return (f"{name} spent {other:.0%} of its busy time {when} on batches of another block than "
            f"{sw.names[main]!r}, a mix no model of one workload predicts")


def _unseen_workload(switches: dict[str, _Switches], decided_at: float, until: float) -> str:
    """Why a plan's measurement (up to ``until``) ran on a workload its prediction (at ``decided_at``) had not seen:
    one of the operators of ``switches`` reached another block of the schedule during the measurement or fewer
    than ``REFIT_MIN_SAMPLES`` of its samples before the plan (its model had not been refitted on it); "" when
    none did."""
    for name, sw in switches.items():
        ends = sw.ends
        for new, t_switch in sw.blocks:
            if t_switch > until:
                continue
            if t_switch > decided_at:
                return f"{name} reached the {new!r} block {t_switch - decided_at:.1f} s after the plan, while it was measured"
            seen = int(np.searchsorted(ends, decided_at, side="right") - np.searchsorted(ends, t_switch, side="left"))
            if seen < REFIT_MIN_SAMPLES:
                return f"{name} had finished {seen} batch(es) of the {new!r} block when the plan was made (a refit needs {REFIT_MIN_SAMPLES})"
    return ""


# ---------------------------------------------------------------------------- regimes
def _sample_positions(trace: Trace, name: str, samples: Sequence[BatchSample]) -> np.ndarray:
    at = np.array([t.at for t in trace.ticks])
    pos = np.array([stream_positions(t.state)[name] for t in trace.ticks])
    return np.interp([s.end for s in samples], at, pos)


def _truth(trace: Trace, profile: PipelineProfile, name: str) -> list[dict[str, Any]]:
    """The operator's true switches: sample index where each block boundary reaches it, and whether its cost changes."""
    blocks = trace.blocks
    if len(blocks) < 2:
        return []
    samples = [s for s in trace.samples(name) if s.items_in >= 1]
    pos = _sample_positions(trace, name, samples)
    device = trace.ticks[0].state.operator(name).replicas[0].config.device if trace.ticks[0].state.operator(name).replicas else "cpu"
    out = []
    for (old, _, _), (new, start, _) in zip(blocks, blocks[1:]):
        idx = int(np.searchsorted(pos, start, side="right"))
        if idx >= len(samples):
            continue
        try:
            cost = profile.operator(name).device(device)
            a, b = cost.seconds(1, profile.workloads[old]), cost.seconds(1, profile.workloads[new])
            ratio = max(a, b) / min(a, b) if min(a, b) > 0 else math.inf
        except (KeyError, ValueError):
            ratio = None
        out.append({"index": idx, "old": old, "new": new, "cost_ratio": ratio, "observable": ratio is None or ratio > OBSERVABLE})
    return out


def _reordered(trace: Trace, name: str, workloads: Mapping[str, Mapping[str, float]]) -> np.ndarray:
    """Per sample (completion order): whether it completed among another block's samples than its own
    (``_truth`` assumes completion in input order; a batch held for tens of seconds, re-queued by a
    retiring replica, or routed through a slower branch, such as scanned pages through OCR, completes
    among a later block's). Either its batch started while the operator's stream position was in
    another block than the one the truth places its completion in, or its content says so
    (``_content_elsewhere``, by the profile's regimes: ``workloads``)."""
    samples = [s for s in trace.samples(name) if s.items_in >= 1]
    if len(trace.blocks) < 2 or not samples:
        return np.zeros(len(samples), dtype=bool)
    at = np.array([t.at for t in trace.ticks])
    pos = np.array([stream_positions(t.state)[name] for t in trace.ticks])
    starts = [a for _, a, _ in trace.blocks]
    begun = np.searchsorted(starts, np.interp([s.start for s in samples], at, pos), side="right")
    done = np.searchsorted(starts, np.interp([s.end for s in samples], at, pos), side="right")
    return (begun != done) | _content_elsewhere(samples, [trace.blocks[max(0, b - 1)][0] for b in done], workloads)


def _content_elsewhere(samples: Sequence[BatchSample], regime: Sequence[str], workloads: Mapping[str, Mapping[str, float]]) -> np.ndarray:
    """Per sample: whether its per-item features put it clearly in another regime than ``regime[i]``.
    A regime's place is the profile's per-item mean features (``workloads``, log1p, the detector's
    space); distances are in scales of the samples' spread around their nearest regime (per feature,
    pooled median absolute deviation). Clearly elsewhere: ``CONTENT_Z`` scales from its own regime
    and under half that distance from another. (Not from the samples of the truth's blocks: a block
    that completed half out of order, as a long-document block with late scans on embed, has no
    central sample of its own.)"""
    regimes = sorted(workloads)
    names = sorted({f for s in samples for f in s.features} & {f for r in regimes for f in workloads[r]})
    out = np.zeros(len(samples), dtype=bool)
    if not names or len(regimes) < 2:
        return out
    vec = np.array([[math.log1p(max(0.0, float(s.features.get(f, 0.0))) / s.items_in) for f in names] for s in samples])
    places = np.array([[math.log1p(max(0.0, float(workloads[r].get(f, 0.0)))) for f in names] for r in regimes])
    diff = vec[:, None, :] - places[None, :, :]
    nearest = np.argmin(np.linalg.norm(diff, axis=2), axis=1)
    scale = np.maximum(MAD_TO_SIGMA * np.median(np.abs(vec - places[nearest]), axis=0), CONTENT_MIN_SCALE)
    dist = np.linalg.norm(diff / scale, axis=2)
    for i, own in enumerate(regime):
        if own not in workloads:
            continue
        k = regimes.index(own)
        other = min(dist[i, j] for j in range(len(regimes)) if j != k)
        out[i] = dist[i, k] > CONTENT_Z and other < dist[i, k] / 2
    return out


def _score_detection(truth: list[dict], changes: list[dict], n_samples: int, reordered: np.ndarray | None = None) -> dict[str, Any]:
    """Detection delays (samples of the new regime consumed until a change is reported, for the observable switches:
    those changing the operator's modelled cost per item by more than ``OBSERVABLE``), missed switches, and false
    alarms (reports matching no switch within ``MATCH_SAMPLES``). A report most of whose last ``VOTE_WINDOW`` samples
    completed out of input order (``reordered``), and the detector's return from it, is listed apart and not counted:
    the truth assumes completion in input order, and the detector reading late batches of an earlier block is right
    about its input."""
    matched, delays, missed = set(), [], []
    for n, sw in enumerate(truth):
        limit = min(sw["index"] + MATCH_SAMPLES, truth[n + 1]["index"] if n + 1 < len(truth) else n_samples)
        hits = [k for k, c in enumerate(changes) if k not in matched and sw["index"] - 2 <= c["index"] < limit]
        if hits:
            matched.add(hits[0])
            if sw["observable"]:
                delays.append(max(1, changes[hits[0]]["index"] - sw["index"] + 1))
        elif sw["observable"]:
            missed.append(sw)
    unmatched = [c for k, c in enumerate(changes) if k not in matched]
    # a report most of whose vote window (the detector's 8 samples) began in another block is the detector reading
    # out-of-order completions right, not a false alarm; listed apart
    out_of_order = [c for c in unmatched if reordered is not None and reordered[max(0, c["index"] - VOTE_WINDOW + 1):c["index"] + 1].sum() * 2
                    > min(VOTE_WINDOW, c["index"] + 1)]
    # ... and so is its return: the next report, back to the regime the detector left for the late batches
    for c in unmatched:
        before = [d for d in changes if d["index"] < c["index"]]
        if c not in out_of_order and before and before[-1] in out_of_order and (before[-1]["new"], before[-1]["old"]) == (c["old"], c["new"]):
            out_of_order.append(c)
    false = [c for c in unmatched if c not in out_of_order]
    return {"delays": delays, "missed": missed, "false_alarms": false, "out_of_order": out_of_order}


# ---------------------------------------------------------------------------- figure
def _figure(results: dict[str, dict]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(17, 5.2))
    names = list(results)
    x = np.arange(len(names))
    ax = axes[0]
    held = [np.mean([h["ape"] for h in results[n]["held"]]) * 100 if results[n]["held"] else np.nan for n in names]
    steady = {n: [s for s in results[n]["spans"] if s["steady"]] for n in names}
    sat_raw = [np.mean([s["ape_busy_time"] for s in steady[n]]) * 100 if steady[n] else np.nan for n in names]
    sat_cal = [np.mean([s["ape"] for s in steady[n]]) * 100 if steady[n] else np.nan for n in names]
    ax.bar(x - 0.27, held, 0.27, label="held-out windows (busy time)")
    ax.bar(x, sat_raw, 0.27, label="saturated spans in one regime, busy-time model")
    ax.bar(x + 0.27, sat_cal, 0.27, label="saturated spans in one regime, queue-aware")
    ax.axhline(4, color="red", ls="--", lw=1, label="target 4%")
    ax.set_xticks(x, names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("capacity error, mean APE (%)")
    ax.set_yscale("log")
    ax.set_title("capacity error per trace")
    ax.legend(fontsize=7)
    ax = axes[1]
    for n in names:
        pts = [p for p in results[n]["plans"] if p["status"] == "scored"]
        if pts:
            line, = ax.loglog([p["measured"] for p in pts], [p["queue_aware"] for p in pts], "o", label=f"{n} (queue-aware)")
            ax.loglog([p["measured"] for p in pts], [p["busy_time"] for p in pts], "o", mfc="none", color=line.get_color(), label="busy time only")
    moved = [p for n in names for p in results[n]["plans"] if p["status"].startswith(WORKLOAD_CHANGED) and p.get("measured", 0) > 0]
    if moved:
        ax.loglog([p["measured"] for p in moved], [p["queue_aware"] for p in moved], "x", color="grey",
                  label="workload changed at the bottleneck (not scored)")
    lim = ax.get_xlim() if ax.has_data() else (1, 100)
    lo, hi = min(lim[0], ax.get_ylim()[0]) if ax.has_data() else 1, max(lim[1], ax.get_ylim()[1]) if ax.has_data() else 100
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8, label="predicted = measured")
    ax.fill_between([lo, hi], [lo * 0.9, hi * 0.9], [lo * 1.1, hi * 1.1], color="grey", alpha=0.2, label="±10%")
    ax.set_xlabel("measured completed input items/s after the plan settled")
    ax.set_ylabel("predicted input items/s")
    ax.set_title("applied plans: predicted vs measured")
    ax.legend(fontsize=7)
    ax = axes[2]
    focus = next((n for n in names if n.startswith("video-trident")), names[0])
    res = results[focus]
    ops = list(res["occupancy"])
    for k, op in enumerate(ops):
        sw = [t for t in res["truth"].get(op, [])]
        ax.plot([t["index"] for t in sw if t["observable"]], [k] * sum(t["observable"] for t in sw), "g|", ms=18, mew=2,
                label="true switch (changes cost)" if k == 0 else None)
        ax.plot([t["index"] for t in sw if not t["observable"]], [k] * sum(not t["observable"] for t in sw), "|", color="lightgreen", ms=18,
                mew=2, label="true switch (cost unchanged)" if k == 0 else None)
        ch = [c for c in res["changes"] if c["operator"] == op]
        ax.plot([c["index"] for c in ch], [k] * len(ch), "rx", label="reported change" if k == 0 else None)
    ax.set_yticks(range(len(ops)), ops)
    ax.set_xlabel("sample of the operator (completion order)")
    ax.set_title(f"regime switches, {focus}")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------- run
def run(quick: bool = False, traces: Sequence[Path] | None = None) -> BenchResult:
    paths = list(traces) if traces is not None else available()
    if quick and traces is None:
        paths = [p for p in paths if p.name.removesuffix(".jsonl.gz") in QUICK]
    if not paths:
        raise FileNotFoundError("no live traces to replay; record them with: python -m benchmarks.record_traces")
    results: dict[str, dict] = {}
    hours = 0.0
    t_start = time.perf_counter()
    for path in paths:
        trace = load(path)
        res = _replay(trace, {n: settled for n, (_, settled) in _settling(trace).items() if settled is not None})
        res["plans"] = _plans(trace, res.pop("predictions"), res.pop("predictions_settled"))
        res["truth"], res["detection"] = {}, {}
        if trace.header.get("emulated") and len(trace.blocks) > 1:
            # regimes are scored where the schedule and the cost model say which switches change an operator's cost
            profile = PipelineProfile.load(str(trace.header["pipeline"]))
            res["truth"] = {op: _truth(trace, profile, op) for op in trace.operators}
            n_samples = {op: len([s for s in trace.samples(op) if s.items_in >= 1]) for op in trace.operators}
            res["detection"] = {op: _score_detection(res["truth"][op], [c for c in res["changes"] if c["operator"] == op], n_samples[op],
                                                     _reordered(trace, op, profile.workloads))
                                for op in trace.operators}
            hours += trace.duration_s / 3600
        res["duration_s"] = trace.duration_s
        res["policy"] = trace.header.get("policy")
        res["summary_of_run"] = {k: trace.summary.get(k) for k in ("items_in", "wall_s", "reconfigurations", "ooms", "items_missing")}
        results[trace.name] = res
    held = [h["ape"] for r in results.values() for h in r["held"]]
    spans = [s for r in results.values() for s in r["spans"]]
    steady = [s for s in spans if s["steady"]]
    plans = [p for r in results.values() for p in r["plans"]]
    scored = [p for p in plans if p["status"] == "scored"]
    errors = [p["error_queue_aware"] for p in scored]
    errors_all = errors + [p["error_queue_aware"] for p in plans if p["status"].startswith(WORKLOAD_CHANGED) and "error_queue_aware" in p]
    busy_errors = [p["error_busy_time"] for p in scored if "error_busy_time" in p]
    policy_errors = [p["error_policy_predicted"] for r in results.values() if r["policy"] == "trident" for p in r["plans"]
                     if p["status"] == "scored" and "error_policy_predicted" in p]
    delays = [d for r in results.values() for det in r["detection"].values() for d in det["delays"]]
    false = sum(len(det["false_alarms"]) for r in results.values() for det in r["detection"].values())
    out_of_order = sum(len(det["out_of_order"]) for r in results.values() for det in r["detection"].values())
    missed = [dict(m, trace=n, operator=op) for n, r in results.items() for op, det in r["detection"].items() for m in det["missed"]]
    summary = {
        "capacity_mape": float(np.mean(held)) if held else math.nan,
        "saturated_capacity_mape": float(np.mean([s["ape"] for s in steady])) if steady else math.nan,
        "saturated_capacity_mape_busy_time": float(np.mean([s["ape_busy_time"] for s in steady])) if steady else math.nan,
        "plan_error_median": float(np.median(errors)) if errors else math.nan,
        "plan_error_p90": float(np.percentile(errors, 90)) if errors else math.nan,
        "plan_error_median_busy_time": float(np.median(busy_errors)) if busy_errors else math.nan,
        "plan_error_median_trident_recorded": float(np.median(policy_errors)) if policy_errors else math.nan,
        "detection_delay_samples": float(np.median(delays)) if delays else math.nan,
        "switches_within_6": float(np.mean([d <= 6 for d in delays + [math.inf] * len(missed)])) if delays or missed else math.nan,
        "false_alarms_per_hour": false / hours if hours > 0 else math.nan,
    }
    fits = [f for r in results.values() for f in r["fits_ms"]]
    raw = {
        "traces": {n: {"policy": r["policy"], "duration_s": round(r["duration_s"], 1), "run": r["summary_of_run"],
                       "held_out_windows": len(r["held"]), "capacity_mape": float(np.mean([h["ape"] for h in r["held"]])) if r["held"] else None,
                       "saturated_spans": r["spans"], "plans": r["plans"], "occupancy": r["occupancy"],
                       "changes": r["changes"], "truth": r["truth"],
                       "detection": {op: {"delays": d["delays"], "missed": d["missed"], "false_alarms": d["false_alarms"],
                                          "out_of_order": d["out_of_order"]}
                                     for op, d in r["detection"].items()}}
                   for n, r in results.items()},
        "held_out_windows": len(held), "capacity_ape_median": float(np.median(held)) if held else None,
        "capacity_ape_p90": float(np.percentile(held, 90)) if held else None,
        "saturated_spans": len(spans), "saturated_spans_steady": len(steady),
        "saturated_capacity_mape_all_spans": float(np.mean([s["ape"] for s in spans])) if spans else None,
        "saturated_capacity_mape_all_spans_busy_time": float(np.mean([s["ape_busy_time"] for s in spans])) if spans else None,
        "plans_scored": len(errors), "plans_returned": len(plans),
        "plans_workload_changed": len(errors_all) - len(errors),
        "plan_error_median_all": float(np.median(errors_all)) if errors_all else None,
        "plan_error_p90_all": float(np.percentile(errors_all, 90)) if errors_all else None,
        "switches_observable": len(delays) + len(missed), "switches_missed": missed, "false_alarms": false, "reports_out_of_order": out_of_order, "trace_hours": hours,
        "fit_ms_cpu": {"median": float(np.median(fits)) if fits else None, "p95": float(np.percentile(fits, 95)) if fits else None, "fits": len(fits)},
        "replay_s": time.perf_counter() - t_start,
        "settings": {"window": WINDOW, "refit_min_samples": REFIT_MIN_SAMPLES, "saturation_s": SATURATION_S, "settle_s": SETTLE_S,
                     "min_settle_s": MIN_SETTLE_S, "observable": OBSERVABLE, "match_samples": MATCH_SAMPLES},
    }
    targets = {"capacity_mape": Target("<=", 0.04), "plan_error_median": Target("<=", 0.10), "plan_error_p90": Target("<=", 0.25),
               "detection_delay_samples": Target("<=", 6), "false_alarms_per_hour": Target("<=", 1.0)}
    notes = (f"{len(results)} live traces ({hours * 60:.1f} min of emulated runs scored for regimes) replayed through the controller's observation loop; "
             "capacity_mape is the held-out-window error of the busy-time model, saturated_capacity_mape the queue-aware capacity "
             "against what saturated operators measurably took; plan error against completed input items/s after the plan settled.")
    return BenchResult("observe-live", summary, targets, raw, _figure(results), notes)
