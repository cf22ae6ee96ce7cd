"""The Trident policy (arXiv 2603.02075): an arbiter over the parts in ``scheduler/trident/``.

Contract:
- ``TridentPolicy(spec, cluster, settings, *, solve)`` implements ``Policy``: ``tick(state, samples)``
  returns a frozen ``TickRecord`` whose ``decision`` holds the plan to apply (None: keep the current
  configuration); ``decide`` returns that ``Decision``. It makes no runner call; each
  ``ApplyOutcome`` comes back through ``observe_apply`` (a plan that did not land fully is never
  re-issued unchanged against the same placement). ``records`` / ``last_record`` keep recent ticks.
- A tick runs its parts and decides, the first that applies: roll back a rollout that measured
  worse; a known regime's pre-positioning; before the evidence gate opens, a memory-safety move or
  idle capacity, else wait; while verifying, nothing; else placement and the transition's verdict,
  and where that issues nothing, batch sizes raised as in-flight depth (``BatchDepth``).
  Every plan carries its ``Rationale`` and fits the cluster's CPUs and GPUs with its canaries
  (``replicas.within_cluster``); a tick that issues none says why as a ``Hold``.
- ``starting_spec(spec)``, ``finish(state)`` and ``run_figures()``: the run's start from memory, the
  memory written at its end, its ``RunSummary`` fields. Every step runs guarded: an exception goes
  to the tick's ``error`` (``ERROR`` when nothing else is issued), the current plan is kept.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import replace
from typing import Any, Callable, Sequence

from trident_flows.core.decision import Action, Decision, Hold, HoldKind
from trident_flows.core.state import ApplyOutcome, ApplyStatus, RunnerState
from trident_flows.core.types import BatchSample, CanaryEnd, ClusterSpec, OperatorPlan, Plan, PlanKind
from trident_flows.scheduler.blas import one_blas_thread
from trident_flows.scheduler.decision_log import EventKind, TickEvent, TickRecord
from trident_flows.scheduler.placement.inputs import work_per_item
from trident_flows.scheduler.placement.milp import solve_placement
from trident_flows.scheduler.replicas import within_cluster
from trident_flows.scheduler.trident.batch_depth import BatchDepth
from trident_flows.scheduler.trident.canaries import Canaries
from trident_flows.scheduler.trident.context import Context
from trident_flows.scheduler.trident.gate import EvidenceGate
from trident_flows.scheduler.trident.guarded_steps import GuardedSteps
from trident_flows.scheduler.trident.idle_capacity import IdleCapacity
from trident_flows.scheduler.trident.memory_start import start_in
from trident_flows.scheduler.trident.models import Models
from trident_flows.scheduler.trident.operators import ColdStarts, Operators, upper_median
from trident_flows.scheduler.trident.pace import Pace
from trident_flows.scheduler.trident.placement_step import PlacementStep
from trident_flows.scheduler.trident.preposition import PrePositioning
from trident_flows.scheduler.trident.refusals import RefusedPlans
from trident_flows.scheduler.trident.regime_plans import RegimePlans
from trident_flows.scheduler.trident.regimes import Regimes
from trident_flows.scheduler.trident.run_memory import RunMemory
from trident_flows.scheduler.trident.safety import MemorySafety
from trident_flows.scheduler.trident.search import ConfigSearch
from trident_flows.scheduler.trident.source_regimes import SourceRegimes
from trident_flows.scheduler.trident.transition import TransitionStep
from trident_flows.scheduler.trident.verifier import Verifier
from trident_flows.scheduler.trident_settings import TridentSettings


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
        self.records: deque[TickRecord] = deque(maxlen=settings.records.max_records)
        self.last_record: TickRecord | None = None
        self._tick = 0
        self.ops = Operators(settings.models.window)
        self.cold_starts = ColdStarts(settings.transition.default_cold_start_s)
        self.pace = Pace(spec)
        self.models = Models(settings.models, self.ops)
        self.gate = EvidenceGate(settings.gate, self.ops, self.models)
        self.search = ConfigSearch(settings.search, settings.safety, self.ctx, self.ops)
        self.safety = MemorySafety(self.ops, self.search)
        self.verifier = Verifier(settings.verify, self.ops, self.safety)
        self.refusals = RefusedPlans()
        self.regimes = Regimes(settings.regimes, self.ctx, self.ops, self.gate, self.search)
        self.canaries = Canaries(settings.canary, self.ops, self.search, self.safety, self.gate, self.pace, self.cold_starts, self.verifier)
        self.depth = BatchDepth(self.search.space, self.safety.unsafe, self.pace.completion_rate,
                                lambda state: work_per_item(state, tuple(self.pace.history)))
        self.placement = PlacementStep(settings.placement, self.ctx, self.ops, search=self.search, safety=self.safety, canaries=self.canaries,
                                       regimes=self.regimes, gate=self.gate, pace=self.pace, cold_starts=self.cold_starts, depth=self.depth,
                                       solve=solve)
        self.sources = SourceRegimes(settings.sources)
        self.transition = TransitionStep(settings.transition, self.regimes, self.pace, self.verifier, self.sources)
        self.regime_plans = RegimePlans(settings.placement, self.ctx, self.ops, search=self.search, safety=self.safety, pace=self.pace,
                                        cold_starts=self.cold_starts, depth=self.depth, solve=solve, confidence_z=settings.gate.confidence_z)
        self.preposition = PrePositioning(self.ctx, self.sources, self.regime_plans, pace=self.pace, cold_starts=self.cold_starts,
                                          safety=self.safety, depth=self.depth, benefit_ratio=settings.transition.benefit_ratio)
        self.idle = IdleCapacity(settings.idle, self.ctx, self.safety, memory_safety=settings.safety, memory_bound=self.search.memory_bound,
                                 keep_cpu=self.placement.keeps_canary_cpu)
        self.memory = RunMemory(settings.memory.location, spec, cluster)
        self._reactions: list[float] = []  # seconds from a regime recognised at the source to the first rollout after it
        self._recognised_at: float | None = None
        self.started_from: str | None = None  # what ``starting_spec`` changed, noted on the first tick
        self.memory.seed(self.sources, self.regime_plans, self.cold_starts)

    @property
    def spec(self) -> Any | None:
        return self.ctx.spec

    @property
    def cluster(self) -> ClusterSpec | None:
        """The cluster planned for: the one given, or the live nodes once the runner reports them."""
        return self.ctx.cluster

    # ------------------------------------------------------------------ the Policy protocol
    def decide(self, state: RunnerState, samples: Sequence[BatchSample]) -> Decision:
        return self.tick(state, samples).decision

    def tick(self, state: RunnerState, samples: Sequence[BatchSample]) -> TickRecord:
        """One tick (see the module docstring), BLAS single-threaded (``blas``)."""
        with one_blas_thread():
            return self._tick_once(state, samples)

    def observe_apply(self, plan: Plan, outcome: ApplyOutcome) -> None:
        """The runner's outcome of the last plan issued (see the module docstring)."""
        if outcome.status == ApplyStatus.LANDED:
            return
        self.refusals.observe_apply(plan, outcome)
        self.verifier.observe_apply(plan, outcome)
        if self.last_record is None:
            return
        event = TickEvent(EventKind.APPLY_REFUSED, "", f"apply {outcome.status.value} after {outcome.steps_done}/{outcome.steps_total} "
                                                      f"steps: {outcome.reason[:200]}")
        self.last_record = replace(self.last_record, events=(*self.last_record.events, event))
        if self.records and self.records[-1].tick == self.last_record.tick:
            self.records[-1] = self.last_record

    def run_figures(self) -> dict[str, Any]:
        """What the run summary reports of the memory and the source regimes (``RunSummary``'s trident keys)."""
        return {"memory_loaded": self.memory.loaded is not None, "memory_regimes_known": self.memory.regimes_known,
                "memory_warning": self.memory.warning, "reaction_s_median": upper_median(self._reactions) if self._reactions else None,
                "prepositioned_moves": self.preposition.moves}

    def starting_spec(self, spec: Any) -> Any:
        """``spec`` as the run should start it: with ``start_from_memory`` and a memory read, moved to the allocation of
        the remembered regime with the most items (``RunMemory.starting_allocation``) with the least change
        (``memory_start.start_in``). ``started_from`` says what was done, for the first tick's record."""
        entry, why = self.memory.starting_allocation() if self.settings.memory.start_from else (None, "")
        if entry is None or spec is None:
            return spec
        started, moved = start_in(spec, entry.allocation, self.ctx.given_cluster)
        if moved:
            self.started_from = f"started from the memory: {why}: " + ", ".join(moved)
        return started

    def finish(self, state: RunnerState) -> None:
        """The run ended: its memory is written (when ``settings.memory.location`` names where), with every model fitted on
        all it measured and a plan for each regime this run covered (``RegimePlans.settle``)."""
        if self.memory.uri:
            with one_blas_thread():
                failed = self.models.fit_all(state, self._tick)
                if self.settings.sources.regime_plans:
                    self.regime_plans.settle(state, self.sources.regimes)
            if failed:
                note = "model fit failed at the run's end for " + "; ".join(failed)
                self.memory.warning = f"{self.memory.warning}; {note}" if self.memory.warning else note
        warning = self.memory.write(state, self.ops, self.sources, self.regime_plans, self.cold_starts, ended=True)
        if warning is not None:
            self.memory.warning = warning

    # ------------------------------------------------------------------ one tick
    def _tick_once(self, state: RunnerState, samples: Sequence[BatchSample]) -> TickRecord:
        t_start = time.perf_counter()
        self._tick += 1
        self.ctx.follow(state)
        steps = GuardedSteps()
        events: list[TickEvent] = []
        ended: list[CanaryEnd] = []  # canaries judged this tick, for the plan's rationale
        measured, pipeline_t = self.pace.start_tick(state)
        self.cold_starts.track(state)
        self.idle.observe(state)
        if self._tick == 1:
            events += [TickEvent(EventKind.NOTE, "", note) for note in (self.memory.warning, self.started_from) if note]
        new = steps.run("observe", lambda: self.models.observe(state, samples, self._tick)) or {}
        source_events = steps.run("source", lambda: self.sources.observe(state, samples)) or []
        steps.run("batch depth", lambda: self.depth.observe(state, samples))
        events += source_events
        if self.settings.sources.regime_plans:
            steps.run("regime plans", lambda: self.regime_plans.refresh(state, self.sources.regimes, self.sources.live(state), pipeline_t))
        if source_events and self._recognised_at is None:
            self._recognised_at = state.wall_s
        if source_events and len(self.sources.segments) > 1:  # a regime ended at the source: what it taught is kept
            steps.run("memory", lambda: self._write_memory(state, events))
        steps.run("regime", lambda: self.regimes.observe(state, new, events))
        # a plan under verification, even one still being placed, is not compared with the old regime's baseline
        if any(e.kind == EventKind.REGIME_CHANGE for e in events) and not self.verifier.mark_workload_changed():
            self.pace.forget_baseline()  # throughput before a regime change is no baseline for a plan made after it
        steps.run("calibrate", lambda: self.models.calibrate(state, samples))
        steps.run("stale", lambda: self.gate.arm_on_stale(state, events))
        canary_ops = steps.run("optimize", lambda: self._optimize(state, new, events, ended)) or {}
        verification, rollback = steps.run("verify", lambda: self.verifier.verify(state, pipeline_t)) or ("", None)
        self.pace.count(pipeline_t)
        safety = steps.run("safety", lambda: self.safety.plan(state))
        if safety is not None and self.verifier.pending is not None:
            # memory safety comes before verification: the move changes the placement being measured
            verification = f"verification dropped for a memory-safety move ({verification or 'measuring'})"
            self.verifier.drop()
            rollback = None
        decided = self._with_canaries(state, self._decide(state, steps, rollback, safety, verification, canary_ops), canary_ops, ended)
        if decided is None or (steps.errors and decided.plan is None and decided.action.issues_nothing):
            decided = Decision.error("kept the current plan after a failed step: " + "; ".join(steps.errors),
                                     decided.predicted_throughput if decided is not None else 0.0)
        decided = self._unless_refused(state, _within_cluster(state, decided))
        if decided.action == Action.ROLL_OUT and decided.plan is not safety and not _unverified(decided.plan):
            # a safety move is not undone for speed; a regime plan is measured on the regime it was made for, not the one
            # before; replicas on idle resources slow no operator
            self.verifier.start(state, decided.plan, decided.predicted_throughput, list(self.pace.recent))
        if decided.action == Action.ROLL_OUT and self._recognised_at is not None:
            self._reactions.append(state.wall_s - self._recognised_at)
            self._recognised_at = None
        self.pace.end_tick(state)
        steps.timings["total"] = (time.perf_counter() - t_start) * 1e3
        record = TickRecord(self._tick, time.time(), decided, measured, pipeline_t, {n: o.detector.current for n, o in self.ops.items()},
                            tuple(events), verification, "; ".join(steps.errors), steps.timings)
        self.records.append(record)
        self.last_record = record
        return record

    def _write_memory(self, state: RunnerState, events: list[TickEvent]) -> None:
        warning = self.memory.write(state, self.ops, self.sources, self.regime_plans, self.cold_starts)
        if warning is not None:
            events.append(TickEvent(EventKind.NOTE, "", warning))

    def _optimize(self, state: RunnerState, new: dict[str, list[BatchSample]], events: list[TickEvent],
                  ended: list[CanaryEnd]) -> dict[str, OperatorPlan]:
        """OOMs make configs unsafe, then the optimisers are told and the canaries judged or started."""
        self.safety.record_ooms(new, events)
        return self.canaries.step(state, new, events, ended, self._tick)

    def _decide(self, state: RunnerState, steps: GuardedSteps, rollback: Plan | None, safety: Plan | None, verification: str,
                canary_ops: dict[str, OperatorPlan]) -> Decision | None:
        """What the tick issues before its canaries: the first that applies (see the module docstring); None when a
        step failed before anything was decided."""
        if rollback is not None:
            return Decision.rollback(rollback)
        if safety is None and self.settings.sources.regime_plans:
            ahead = steps.run("preposition", lambda: self.preposition.plan(state))
            if ahead is not None:
                self.verifier.drop()  # the workload the verification measures is leaving
                return Decision.roll_out(ahead, ahead.reason, ahead.predicted_throughput)
        gate_open = self.gate.passed(state)
        if safety is not None and not gate_open:
            return Decision.roll_out(safety, safety.reason)
        if not gate_open:
            grow = steps.run("idle capacity", lambda: self.idle.plan(state)) if safety is None else None
            if grow is not None:
                return Decision.roll_out(grow, f"{grow.reason} ({self.gate.waiting_reason(state)})")
            return Decision.no_change(self.gate.waiting_reason(state), Hold(HoldKind.WAITING_FOR_SAMPLES))
        if self.verifier.pending is not None:
            return Decision.no_change(f"verifying the last rollout before planning again ({verification or 'waiting for it to be in place'})",
                                      Hold(HoldKind.VERIFYING))
        decided = self._placed(state, steps, canary_ops)
        if safety is None and decided is not None and decided.plan is None:
            deeper = steps.run("batch depth", lambda: self.depth.plan(state))
            if deeper is not None:
                return Decision.roll_out(deeper, f"{deeper.reason} ({decided.reason})", decided.predicted_throughput)
        if safety is not None and (decided is None or decided.plan is None):
            # the placement could not move an operator off an unsafe config (no priced option, no
            # feasible order, a failed solve): the replica-for-replica move always fits
            why = decided.reason if decided is not None else "; ".join(steps.errors) or "no placement"
            return Decision.roll_out(safety, f"{safety.reason} (the placement did not move it: {why})",
                                     decided.predicted_throughput if decided is not None else 0.0)
        return decided

    def _placed(self, state: RunnerState, steps: GuardedSteps, canary_ops: dict[str, OperatorPlan]) -> Decision | None:
        """The placement and the transition step's decision on it; None when either step failed."""
        placed = steps.run("placement", lambda: self.placement.place(state, self._tick))
        if placed is None:
            return None
        decided = steps.run("transition", lambda: self.transition.decide(state, placed))
        if decided is None:
            return None
        self.canaries.settled = decided.action.issues_nothing
        if decided.plan is None or canary_ops:
            return decided
        # the MILP's plan names no canary: keep the one being measured
        return replace(decided, plan=replace(decided.plan, operators=tuple(self.canaries.keeping(state, o) for o in decided.plan.operators)))

    def _with_canaries(self, state: RunnerState, decided: Decision | None, canary_ops: dict[str, OperatorPlan],
                       ended: list[CanaryEnd]) -> Decision | None:
        """The tick's canary plans join its plan; a tick that issues nothing else issues them."""
        if not canary_ops:
            return decided
        plan = self.canaries.attach(state, decided.plan if decided is not None else None, canary_ops, ended)
        if decided is not None and not decided.action.issues_nothing:
            return replace(decided, plan=plan)
        reason = "; ".join(o.reason for o in canary_ops.values()) + (f" (placement: {decided.reason})" if decided is not None else "")
        return Decision.canary(plan, reason, decided.predicted_throughput if decided is not None else 0.0)

    def _unless_refused(self, state: RunnerState, decided: Decision) -> Decision:
        """Never re-issue a plan the runner refused, unchanged, against an unchanged placement."""
        refused = self.refusals.refused_before(state, decided.plan) if decided.plan is not None else None
        if refused is None:
            return decided
        return Decision.wait(f"not re-issuing a plan the runner refused ({refused}); keeping the current placement ({decided.reason})",
                             Hold(HoldKind.REFUSED_BEFORE), decided.predicted_throughput)


def _unverified(plan: Plan) -> bool:
    """A regime plan, replicas on idle resources or batch sizes raised as depth: rollouts that are not verified against the
    throughput before."""
    return plan.rationale is not None and plan.rationale.kind in (PlanKind.REGIME_PLAN, PlanKind.IDLE_CAPACITY, PlanKind.BATCH_DEPTH)


def _within_cluster(state: RunnerState, decided: Decision) -> Decision:
    """``decided`` with its plan trimmed to the cluster (``replicas.within_cluster``), the trim stated in its reason."""
    if decided.plan is None:
        return decided
    plan, trimmed = within_cluster(decided.plan, state)
    if not trimmed:
        return decided
    note = f" (trimmed to the cluster's CPUs and GPUs beside its canaries: {'; '.join(trimmed)})"
    return replace(decided, reason=decided.reason + note, plan=replace(plan, reason=plan.reason + note))
