"""The Trident decision logic: one tick = observe -> regime -> optimize -> placement -> transition -> verify.

Contract:
- ``TridentPolicy(spec, cluster, settings)`` (``settings``: a ``TridentSettings``, every option
  validated; ``make_policy("trident", **options)`` builds it from options) implements the
  ``Policy`` protocol. ``tick(state, samples)`` is a function of the runner's ``RunnerState`` and the ``BatchSample``s that arrived since the
  last tick (plus the policy's own memory of earlier ticks) and returns a frozen ``TickRecord``
  whose ``plan`` is the change to apply (``None``: keep the current configuration); ``decide``
  returns just that plan. It makes no runner call: applying the plan is the caller's step, which
  reports the ``ApplyOutcome`` back through ``observe_apply(plan, outcome)``: a plan that was
  refused or only partly landed is never issued again unchanged against the same placement
  (the tick says so instead), and a rollout that did not land is not verified. Every plan it
  issues carries a ``Rationale`` (throughput, memory safety, rollback or canary) with its
  figures as typed values: predicted throughput before and after, rollout seconds, the items
  the switch costs, the bottlenecks; the measured throughputs of a rollback; the unsafe configs
  or the canary verdicts. The reason text says the same for the log.
- observe: the samples go to a sliding window per operator and its ``OperatorModel`` is refitted
  once ``refit_min_samples`` new samples have arrived since its last fit when its config epoch
  changed, its window was cut at a change point, or its workload moved (a features regime change
  at its detector, its model turned stale); otherwise once the new samples are ``refit_fraction`` of those
  the last fit used (samples of older config epochs are invalidated by the model itself) and
  ``refit_ticks`` ticks have passed since that fit, for at most 1/``refit_ticks`` of the operators per
  tick (the longest unfitted first: operators that started together otherwise refit together, and on
  256 simulated nodes ten such fits in one tick took 550 ms). A fit costs tens of milliseconds per operator:
  refitting every operator every few samples of an unchanged workload made the fits most of the
  controller's CPU (video: 230 ms a tick), and that CPU is taken from the pipeline it schedules when
  they share cores. On 8 simulated nodes an operator brings ~1,000 samples a tick, so
  ``refit_fraction`` alone refitted every operator (and re-solved the placement after it) on every tick.
- regime: each sample, with its throughput residual under the current model, goes to the
  operator's ``RegimeDetector`` (``observe_many``: a tick's samples in one prediction), at most
  ``detector_samples`` of a tick, evenly spaced with the newest always among them (on 256 simulated
  nodes an operator brings ~9,000 samples a tick and reading them all made detection the largest
  part of a tick, up to 1.5 s; 500 a tick still outnumber the detector's vote window and persistence
  many times over). The detector counts only the samples it read; ``_window_seq`` maps its change
  points back to the window's sample numbers. On a residual change the window keeps only samples since the
  change point. On a change to a regime seen before, the remembered model and best config
  (``RegimeMemory``) are served at once. Every fit is remembered under its regime (once per fit).
- optimize: a ``ConfigOptimizer`` per (operator, regime) is told measurements of the configs
  that run (every ``tell_every`` batches) and the OOMs. When a proposal differs from what runs
  and the free CPUs/GPUs fit one more replica, it is tried on a canary replica
  (``OperatorPlan.canary``) and judged by ``canary.decide``; an accepted config becomes a
  candidate of the placement. Canaries start only once the placement has settled (its last
  solve found nothing worth rolling out) and no rollout is being verified, with resources free
  for one; at most one optimiser is asked per tick (the longest unasked, busiest first) and one
  whose proposal could not start is not asked again for ``reask_ticks`` ticks (an ask costs
  0.1-0.3 s of CPU); only while the run (items left at the measured intake, when the input's size
  is known) has ``canary_payback`` x (the operator's longest cold start + ``canary_timeout_s``) left
  (in 80-second video runs canaries of 20-second GPU cold starts cost up to a fifth of the
  throughput and could never pay); never a "seed" of a device the operator already runs on;
  only for operators busy at least ``canary_min_busy`` of the time (a starved canary measures
  nothing; one that gets no batch within ``canary_timeout_s`` is abandoned, and the operator gets
  no other canary until its workload changes: in a live cpu-only run OCR's canaries were abandoned
  six times in a row while born-digital items left it starved, each one a replica start; one that
  holds a batch then is not starved and is judged when the batch is back: ending it would wait for
  that batch anyway, holding the control loop), and
  not for a config whose predicted batch time exceeds ``canary_max_batch_s`` (a canary must be
  drained when it ends; a minutes-long batch would stall every later rollout; the operator then gets
  no other canary until its workload changes, as the optimiser proposes the same config until told
  more). A canary still being measured is kept by every plan issued meanwhile. A config that ran out of memory, or whose memory upper bound
  (``mean + k*std`` at the worst recent workload) exceeds the budget, is never a candidate; an
  operator running such a config is moved off it at once (safety comes before gain), with a
  feasible order (a move that cannot be ordered is not issued) and its price recorded. Before
  the evidence gate lets the placement run, while a rollout is being verified (its
  verification is dropped: the move changes what it measures), and whenever the placement
  does not move it (no priced option, no feasible order, a failed solve), it is moved replica
  for replica to the largest smaller batch that is not unsafe (``_safety_plan``: same
  resources, so it always fits). Without the last two, an operator that ran out of memory
  during a verification or with no priced smaller batch kept its config and ran out of memory
  again (the simulated video spike run: 4 OOMs, the placement failing every tick).
- placement: per operator, candidates (the running configs, accepted canaries, the optimiser's
  best, the regime's remembered best) with capacity curves from the model's predictions
  (``placement.inputs.concave_curve``), memory upper bounds and the bytes per item it reads from
  the operator before it (``transfer.transfer_estimate`` over its window, for the network rows of
  node classes that declare a link); the MILP (``placement.milp.solve_placement``) runs on the cluster minus what running canaries hold and,
  while an operator may still get a canary (``_exploring``), one CPU kept free for it. It is solved again only when an input
  changed (a refit or remembered model, a regime, the running placement, the cluster, a stale,
  unsafe or accepted config) or ``resolve_ticks`` ticks passed; its answer is priced every tick.
- queue awareness: every runner snapshot goes to an ``occupancy.OccupancyTracker``; an operator
  whose input queue stayed non-empty and whose serving replicas all held a batch over the last
  ``saturation_s`` seconds ran at its capacity, and the ``SaturatedSpan`` of what it took then
  calibrates its model (``OperatorModel.calibrate``), so every capacity the model reports (the
  placement's curves included) is what the operator measurably can do; a regime change or a
  remembered model drops the calibration (it measured another workload). Spans are timed on the
  samples' clock (the runner's ``wall_s`` plus its origin on that clock, estimated from the
  newest sample ends), as the model compares their age with its newest sample.
- stale models: a calibration under ``1 / stale_ratio`` says the model describes a workload that
  has passed (an operator shrunk for a cheap regime, then flooded by an expensive one, finishes
  too few batches to refit soon); the placement's note says so. Without the calibration, such an
  operator stayed starved for a minute.
  A model turning stale also re-arms the evidence gate, as a features regime change does
  (``_arm_on_stale``): the workload moved without its features saying so, and the operators
  downstream have not measured it yet (in the simulated video run, decode turned stale on the HD
  block and the move made at once took the replicas safety needed there: 0.91x static-avg;
  with the gate re-armed no move was made: 1.00x).
- evidence gate: no placement until every operator has a fitted model and ``min_samples``
  samples, ``min_config_samples`` of them taken since the workload last changed (a features
  regime change at an operator re-arms it there and downstream: the new items reach the downstream
  operators seconds later, and until they have been measured there, their models describe the
  old workload; in the simulated video run a move made on decode's first samples of the HD
  block took 3 of safety's 7 replicas, which the HD items needed, and was rolled back). The
  operators upstream have measured those items already, and an operator with no work left (input
  closed, nothing queued or in flight at it or upstream) takes no more samples: neither holds the
  gate (re-arming every operator kept it shut for whole runs once the head had read the last input).
  An operator so slow on the new workload that ``evidence_max_s`` seconds pass before it has
  ``min_config_samples`` samples passes with ``SLOW_EVIDENCE_SAMPLES`` (embed on long documents
  finished a batch a minute; waiting for 16 held a starved pipeline at 0.2 items/s for 13 minutes).
  A config that does not run is compared only with ``min_config_samples`` samples of
  it (an accepted canary passed its own test; a move off an unsafe config is exempt), and
  capacity beyond what runs now counts at its lower confidence bound (``OperatorModel.capacity_lower``:
  ``confidence_z`` standard deviations below the median in what more replicas add relative to the running
  ones; the level of a workload far from the evidence, in doubt at every count alike, is what the running
  replicas measure: counted as the GP mean - z std, OCR's doubt on long documents, 10^5 items/s against a
  mean of 0.6, made every added replica worth 0 and held it at one replica for 45 simulated minutes), so a
  change is made only when its gain holds there.
- transition: ``placement.transition_cost.plan_transition`` orders the change exactly as the runner will
  (``order_steps``) and prices it against the time it can pay off: the current regime's expected
  remaining time (past regimes longer than this one so far, less its elapsed time; never less than with
  this one counted among them as lasting as long again: ``_expected_regime_s``), capped by the input items left (not yet read +
  read and not yet completed, ``throughput_measure.remaining_input_items``, input open or closed) at the measured intake or end-to-end rate, with each option's cold start the
  longest one measured for that operator and device (``ReplicaState.cold_start_s``;
  ``default_cold_start_s`` before any) and its drain two median batches. A plan is rolled out
  when the pricing decides ROLL_OUT (items gained over the regime at least ``benefit_ratio``
  times the items the switch costs: 2 by default, as measured cold starts leave out the
  replica actor's own start-up) and the predicted gain is at least
  ``min_gain`` of the current predicted throughput (10% by default: smaller predicted gains are
  within the live models' error and chasing them costs cold starts); otherwise the record says WAIT and why.
- verify: after a rollout, once the plan is in place and settled (``placement_settled``: no
  replica of its operators draining, each with a finished batch; waited for within the same
  ``apply_grace_ticks``, then measured anyway, as an operator with no work finishes no batch), the end-to-end throughput
  (``throughput_measure.sustainable_throughput``: input items the whole pipeline finished per
  second, which filling queues do not inflate; the unit of every predicted throughput, so the
  decision log's predicted and measured figures compare, and the same measure the benchmarks
  score plans by) of the next ``verify_ticks`` ticks is compared with the ticks before the change,
  whatever the input state (``worse_than_before``: lower by more than ``verify_z`` standard errors
  and by 5%); a change that made things worse is rolled back (the previous placement restored,
  with the figures as reason) and not proposed again in this regime, unless a features regime
  change was seen while it was measured (the regimes' rates differ up to 8x on the documents
  stream: a rollout made as scanned documents arrived was rolled back against the born-digital
  rate before it), or the throughput after is at least what the previous placement was predicted
  to do on the current workload (within ``VERIFY_TOLERANCE``: the sink may still drain a lighter
  regime's items when the plan is made). New placements wait until the verification ends.
- ``max_changes`` (also a field of the Prefect ``TridentSettingsBlock``) caps the operators
  one plan changes: growing ones first, then the most saturated, as long as the cluster's
  CPUs/GPUs hold; the limited plan is what is priced (the MILP's full plan may gain more).
  (The sidecar's CPU/GPU budgets arrive already applied to ``cluster``.)
- failures: every step runs guarded; an exception (solver error, a model that cannot fit, ...)
  is recorded in the tick's ``error``, the current plan is kept (no plan this tick) and the
  next tick starts afresh. No samples yet means "waiting for samples".
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

from trident_flows.core.state import ApplyOutcome, ApplyStatus, RunnerState
from trident_flows.scheduler.blas import one_blas_thread
from trident_flows.scheduler.decision_log import Action, EventKind, Hold, HoldKind, TickEvent, TickRecord
from trident_flows.scheduler.placement.milp import solve_placement
from trident_flows.scheduler.placement.inputs import current_placement
from trident_flows.scheduler.replicas import held
from trident_flows.scheduler.placement.transition_cost import plan_transition
from trident_flows.scheduler.trident_settings import TridentSettings
from trident_flows.scheduler.trident.canaries import Canaries
from trident_flows.scheduler.trident.context import Context
from trident_flows.scheduler.trident.gate import EvidenceGate, done_operators  # noqa: F401 - done_operators: importable here
from trident_flows.scheduler.trident.models import Models
from trident_flows.scheduler.trident.pace import Pace
from trident_flows.scheduler.trident.placement_step import PlacementStep
from trident_flows.scheduler.trident.refusals import RefusedPlans
from trident_flows.scheduler.trident.regimes import Regimes
from trident_flows.scheduler.trident.safety import MemorySafety
from trident_flows.scheduler.trident.search import ConfigSearch
from trident_flows.scheduler.trident.verifier import Verifier, worse_than_before  # noqa: F401 - worse_than_before: importable here
from trident_flows.scheduler.trident.operators import (ColdStarts, Operators, replica_counts)
from trident_flows.core.types import (BatchSample, CanaryEnd, ClusterSpec, Decision, OperatorPlan, Plan, PlanKind, Rationale)



@dataclass(frozen=True)
class _Decided:
    """What the transition step decided: roll ``plan`` out, or keep the current placement (no plan,
    with why as a ``Hold``); ``predicted`` is the MILP's pipeline throughput (input items/s)."""

    action: Action
    reason: str
    plan: Plan | None
    predicted: float
    hold: Hold | None = None

    @classmethod
    def roll_out(cls, plan: Plan, reason: str, predicted: float) -> "_Decided":
        return cls(Action.ROLL_OUT, reason, plan, predicted)

    @classmethod
    def optimal(cls, reason: str, predicted: float) -> "_Decided":
        """The current placement is the MILP's optimum: nothing to change."""
        return cls(Action.NONE, reason, None, predicted, Hold(HoldKind.OPTIMAL))

    @classmethod
    def wait(cls, reason: str, predicted: float, hold: Hold) -> "_Decided":
        """A better placement exists but is not rolled out now, for the reason ``hold`` names."""
        return cls(Action.WAIT, reason, None, predicted, hold)


class TridentPolicy:
    """The Trident controller's decision logic (see the module docstring)."""

    name = "trident"

    settings_type = TridentSettings

    def __init__(self, spec: Any | None = None, cluster: ClusterSpec | None = None, settings: TridentSettings | None = None, *,
                 solve: Callable[..., Any] = solve_placement) -> None:
        """``settings``: the options (defaults when None); ``solve``: the placement solver (tests swap in a failing one)."""
        settings = settings if settings is not None else TridentSettings()
        if not isinstance(settings, TridentSettings):
            raise TypeError(f"trident: settings must be a TridentSettings, got {type(settings).__name__}; "
                            "build one with TridentSettings(...) or use make_policy('trident', **options)")
        self.settings = settings
        self.ctx = Context(spec, cluster)
        # what the policy keeps between ticks
        self.cold_starts = ColdStarts(settings.default_cold_start_s)
        self.records: deque[TickRecord] = deque(maxlen=settings.max_records)
        self.last_record: TickRecord | None = None
        self.ops = Operators(settings.window)
        self.pace = Pace(spec)
        self.models = Models(settings, self.ops)
        self.gate = EvidenceGate(settings, self.ops, self.models)
        self.search = ConfigSearch(settings, self.ctx, self.ops)
        self.safety = MemorySafety(self.ops, self.search)
        self.verifier = Verifier(settings, self.ops, self.safety)
        self.refusals = RefusedPlans()
        self.regimes = Regimes(settings, self.ctx, self.ops, self.gate, self.search)
        self.canaries = Canaries(settings, self.ops, self.search, self.safety, self.gate, self.pace, self.cold_starts, self.verifier)
        self.placement = PlacementStep(settings, self.ctx, self.ops, search=self.search, safety=self.safety, canaries=self.canaries,
                                       regimes=self.regimes, gate=self.gate, pace=self.pace, cold_starts=self.cold_starts, solve=solve)
        self._tick = 0

    @property
    def spec(self) -> Any | None:
        return self.ctx.spec

    @property
    def cluster(self) -> ClusterSpec | None:
        """The cluster planned for: the one given, or the live nodes once the runner reports them."""
        return self.ctx.cluster

    # ------------------------------------------------------------------ the Policy protocol
    def decide(self, state: RunnerState, samples: Sequence[BatchSample]) -> Plan | None:
        return self.tick(state, samples).plan

    # ------------------------------------------------------------------ one tick
    def tick(self, state: RunnerState, samples: Sequence[BatchSample]) -> TickRecord:
        """One observe -> regime -> optimize -> verify -> placement -> transition tick, BLAS single-threaded (``blas``)."""
        with one_blas_thread():
            return self._tick_once(state, samples)

    def _tick_once(self, state: RunnerState, samples: Sequence[BatchSample]) -> TickRecord:
        t_start = time.perf_counter()
        self._tick += 1
        self.ctx.follow(state)
        timings: dict[str, float] = {}
        errors: list[str] = []
        events: list[TickEvent] = []
        ended: list[CanaryEnd] = []  # canaries judged this tick, for the plan's rationale
        measured, pipeline_t = self.pace.start_tick(state)

        def step(name: str, fn: Callable[[], Any]) -> Any:
            t0 = time.perf_counter()
            try:
                return fn()
            except Exception as exc:  # noqa: BLE001 - a failed step is recorded; the current plan stays
                errors.append(f"{name}: {type(exc).__name__}: {exc}")
                return None
            finally:
                timings[name] = (time.perf_counter() - t0) * 1e3

        self.cold_starts.track(state)
        new = step("observe", lambda: self.models.observe(state, samples, self._tick)) or {}
        step("regime", lambda: self.regimes.observe(state, new, events))
        if any(e.kind == EventKind.REGIME_CHANGE for e in events):
            # a plan under verification, even one still being placed, is not compared with the old regime's baseline
            if not self.verifier.mark_workload_changed():
                self.pace.forget_baseline()  # throughput before a regime change is no baseline for a plan made after it
        step("calibrate", lambda: self.models.calibrate(state, samples))
        step("stale", lambda: self.gate.arm_on_stale(state, events))
        canary_ops = step("optimize", lambda: self._optimize(state, new, events, ended)) or {}
        verdict = step("verify", lambda: self.verifier.verify(state, pipeline_t)) or ("", None)
        self.pace.count(pipeline_t)
        verification, rollback = verdict
        action, reason, plan, predicted, hold = Action.NONE, "", None, 0.0, None
        safety = step("safety", lambda: self.safety.plan(state))
        if safety is not None and self.verifier.pending is not None:
            # memory safety comes before verification: the move changes the placement being measured
            verification = f"verification dropped for a memory-safety move ({verification or 'measuring'})"
            self.verifier.drop()
            rollback = None
        if rollback is not None:
            action, plan, reason = Action.ROLLBACK, rollback, rollback.reason
        elif safety is not None and not self.gate.passed(state):
            action, plan, reason = Action.ROLL_OUT, safety, safety.reason
        elif not self.gate.passed(state):
            reason = self.gate.waiting_reason(state)
            hold = Hold(HoldKind.WAITING_FOR_SAMPLES)
        elif self.verifier.pending is not None:
            reason = f"verifying the last rollout before planning again ({verification or 'waiting for it to be in place'})"
            hold = Hold(HoldKind.VERIFYING)
        else:
            solved = step("placement", lambda: self.placement.place(state, self._tick))
            if solved is not None:
                decided = step("transition", lambda: self._transition(state, *solved))
                if decided is not None:
                    action, reason, plan, predicted, hold = decided.action, decided.reason, decided.plan, decided.predicted, decided.hold
                    self.canaries.settled = action.issues_nothing
                    if plan is not None and not canary_ops:  # the MILP's plan names no canary: keep the one being measured
                        plan = replace(plan, operators=tuple(self.canaries.keeping(state, o) for o in plan.operators))
            if safety is not None and plan is None:
                # the placement could not move an operator off an unsafe config (no priced option, no
                # feasible order, a failed solve): the replica-for-replica move always fits
                why = reason or "; ".join(errors) or "no placement"
                action, plan, reason, hold = Action.ROLL_OUT, safety, f"{safety.reason} (the placement did not move it: {why})", None
        if canary_ops:
            plan = self.canaries.attach(state, plan, canary_ops, ended)
            if action.issues_nothing:
                action, hold = Action.CANARY, None
                reason = "; ".join(o.reason for o in canary_ops.values()) + (f" (placement: {reason})" if reason else "")
        if errors and plan is None and action.issues_nothing:
            action, hold = Action.ERROR, Hold(HoldKind.STEP_FAILED)
            reason = "kept the current plan after a failed step: " + "; ".join(errors)
        if plan is not None:
            refused = self.refusals.refused_before(state, plan)
            if refused is not None:  # never re-issue a refused plan unchanged against an unchanged placement
                reason = f"not re-issuing a plan the runner refused ({refused}); keeping the current placement ({reason})"
                action, plan, hold = Action.WAIT, None, Hold(HoldKind.REFUSED_BEFORE)
        if action == Action.ROLL_OUT and plan is not None and plan is not safety:  # a safety move is not undone for speed
            self.verifier.start(state, plan, predicted, list(self.pace.recent))
        self.pace.end_tick(state)
        timings["total"] = (time.perf_counter() - t_start) * 1e3
        record = TickRecord(self._tick, time.time(), action, reason or "no change", measured, pipeline_t,
                            {n: o.detector.current for n, o in self.ops.items()}, tuple(events), plan, predicted,
                            verification, "; ".join(errors), timings, hold if plan is None else None)
        self.records.append(record)
        self.last_record = record
        return record

    # ------------------------------------------------------------------ observe
    # ------------------------------------------------------------------ optimize
    def _optimize(self, state: RunnerState, new: dict[str, list[BatchSample]], events: list[TickEvent],
                  ended: list[CanaryEnd]) -> dict[str, OperatorPlan]:
        """OOMs make configs unsafe, then the optimisers are told and the canaries judged or started."""
        self.safety.record_ooms(new, events)
        return self.canaries.step(state, new, events, ended, self._tick)

    def observe_apply(self, plan: Plan, outcome: ApplyOutcome) -> None:
        """The runner's outcome of the last plan issued: a plan that did not land fully is not issued
        again against the same placement, and a rollout that did not land is not verified."""
        if outcome.status == ApplyStatus.LANDED:
            return
        self.refusals.observe_apply(plan, outcome)
        self.verifier.observe_apply(plan, outcome)
        if self.last_record is not None:
            event = TickEvent(EventKind.APPLY_REFUSED, "", f"apply {outcome.status.value} after {outcome.steps_done}/{outcome.steps_total} "
                                                          f"steps: {outcome.reason[:200]}")
            self.last_record = replace(self.last_record, events=(*self.last_record.events, event))
            if self.records and self.records[-1].tick == self.last_record.tick:
                self.records[-1] = self.last_record

    # ------------------------------------------------------------------ placement
    # ------------------------------------------------------------------ transition
    def _transition(self, state: RunnerState, demands, cluster, result, forced, notes) -> _Decided:
        plan = result.plan
        current = current_placement(state)
        expected = self.regimes.expected_s(state, self.pace.completion_rate() or result.throughput)
        changed = [o for o in plan.operators if dict(replica_counts(o.groups)) != dict(replica_counts(current.for_operator(o.operator)))]
        if not changed:
            return _Decided.optimal(f"the current placement is the MILP's optimum ({plan.reason})", plan.predicted_throughput)
        limited = ""
        if self.settings.max_changes is not None and len(changed) > self.settings.max_changes:
            changed = self._limit_changes(state, changed)
            limited = f"; limited to {len(changed)} operator change(s) per plan (max_changes={self.settings.max_changes})"
            if not changed:
                return _Decided.wait(f"the MILP's plan changes operators but max_changes={self.settings.max_changes} allows none ({plan.reason})",
                                     result.throughput, Hold(HoldKind.MAX_CHANGES))
        plan = replace(plan, operators=tuple(changed), reason=plan.reason + limited)
        if self.verifier.rejected(plan):
            return _Decided.wait(f"the MILP's plan was rolled back before in this regime: keeping the current placement ({plan.reason})",
                                 result.throughput, Hold(HoldKind.ROLLED_BACK_BEFORE))
        named = {o.operator for o in changed}
        executed = replace(result.plan, operators=tuple(o if o.operator not in named else next(c for c in changed if c.operator == o.operator)
                                                        for o in result.plan.operators if o.operator in named)
                           + tuple(OperatorPlan(o.operator, current.for_operator(o.operator), "unchanged")
                                   for o in result.plan.operators if o.operator not in named))
        try:  # the same ordering the runner executes: a plan that cannot be ordered is never issued
            transition = plan_transition(demands, cluster, current, executed, expected, benefit_ratio=self.settings.benefit_ratio,
                                         run_left_s=self.pace.run_left_s(state))
        except (ValueError, RuntimeError) as exc:
            return _Decided.wait(f"cannot order or price the change ({exc}); keeping the current placement", result.throughput,
                                 Hold(HoldKind.CANNOT_PRICE))
        t_now = result.throughput - transition.expected_gain
        gain = transition.expected_gain / t_now if t_now > 0 else math.inf
        figures = dict(throughput_before=t_now, throughput_after=result.throughput, rollout_s=transition.rollout_s,
                       switch_cost_items=transition.cost_items, bottlenecks=result.bottlenecks)
        if forced:  # safety comes before gain, but only with a feasible order; the price is recorded
            runs = "; ".join(f"{name} runs {config.label()}: {why}" for name, config, why in forced)
            rationale = Rationale(PlanKind.MEMORY_SAFETY, **figures, unsafe=tuple((name, config) for name, config, _ in forced))
            return _Decided.roll_out(replace(plan, rationale=rationale), f"memory safety: {runs}; {transition.reason}; new placement {plan.reason}",
                                     result.throughput)
        if transition.decision != Decision.ROLL_OUT:
            kind = HoldKind.NO_GAIN if transition.expected_gain <= 0 else HoldKind.DOES_NOT_PAY
            return _Decided.wait(f"{transition.reason} ({plan.reason})", result.throughput, Hold(kind))
        if gain < self.settings.min_gain:
            return _Decided.wait(f"predicted gain {gain:+.1%} ({t_now:.4g} -> {result.throughput:.4g} items/s) is under min_gain "
                                 f"{self.settings.min_gain:.0%}: keeping the current placement", result.throughput, Hold(HoldKind.UNDER_MIN_GAIN, gain, self.settings.min_gain))
        head = f"predicted {t_now:.4g} -> {result.throughput:.4g} input items/s ({gain:+.1%}); {transition.reason}"
        if notes:
            head += "; " + "; ".join(notes)
        return _Decided.roll_out(replace(plan, reason=f"{head}; {plan.reason}", rationale=Rationale(PlanKind.THROUGHPUT, **figures)),
                                 f"{head}; {plan.reason}", result.throughput)


    def _limit_changes(self, state: RunnerState, changed: list[OperatorPlan]) -> list[OperatorPlan]:
        """At most ``max_changes`` operator plans, operators that grow first (a plan that only shrinks
        gains nothing), most saturated first, keeping the cluster's CPUs/GPUs."""
        used_cpus, used_gpus = state.used_cpus, state.used_gpus
        kept = []
        grows = lambda o: sum(n for _, n in replica_counts(o.groups)) > sum(state.operator(o.operator).configs().values())  # noqa: E731
        for o in sorted(changed, key=lambda o: (not grows(o), -state.operator(o.operator).busy_fraction)):
            if len(kept) == self.settings.max_changes:
                break
            new_cpus, new_gpus = held(dict(replica_counts(o.groups)))
            old_cpus, old_gpus = held(state.operator(o.operator).configs())
            d_cpus, d_gpus = new_cpus - old_cpus, new_gpus - old_gpus
            if used_cpus + d_cpus <= state.cluster_cpus + 1e-9 and used_gpus + d_gpus <= state.cluster_gpus + 1e-9:
                kept.append(o)
                used_cpus += d_cpus
                used_gpus += d_gpus
        return kept
