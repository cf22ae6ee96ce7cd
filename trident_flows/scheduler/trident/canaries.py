"""Canaries of the Trident policy: a config the optimiser proposes, tried on one extra replica before the placement may use it.

Contract:
- ``step(state, new, events, ended, tick)`` runs once a tick for every operator with a config
  space: its optimiser is told its new measurements, its running canary is judged
  (``canary.decide``: accepted configs become placement candidates, rejected ones are told to the
  optimiser, an OOM makes the config unsafe, one with no batch in ``canary_timeout_s`` is
  abandoned unless it holds one), and at most one optimiser is asked for a proposal. Returns the
  tick's canary plans by operator, an event each; ended ones go to ``ended``.
- A proposal starts only when the placement has ``settled``, nothing is verified, the operator is
  busy enough, and the proposal is new, fits the memory limit, is fast enough per batch and can pay
  back its start in the run's time left (``needs_s``), and fits the free resources or, where it does
  not and ``in_place`` is set, takes the place of one of the operator's own replicas on its device
  (``in_place_of``: the operator keeps at least one); a canary that ends gives that replica back.
- A rejected canary's config is ``Operator.rejected`` (with the runner ``wall_s``): neither the placement
  nor another canary tries it again until the operator's workload changes.
- ``attach(state, plan, canaries, ended)`` adds the canary plans to ``plan``; ``keeping(state, o)``
  keeps a canary still being measured; ``exploring(state)``: some operator may still get one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from trident_flows.core.state import RunnerState
from trident_flows.core.types import BatchSample, CanaryEnd, CanaryVerdict, OpConfig, OperatorPlan, Plan, PlanKind, Rationale, ReplicaGroup
from trident_flows.scheduler import canary as canary_protocol
from trident_flows.scheduler.decision_log import EventKind, TickEvent
from trident_flows.scheduler.model_values import NoModelError
from trident_flows.scheduler.optimize import ConfigOptimizer
from trident_flows.scheduler.optimizer_values import NoSafeConfigError
from trident_flows.scheduler.replicas import canary_busy, canary_config, free_resources, serving_groups
from trident_flows.scheduler.trident.gate import EvidenceGate
from trident_flows.scheduler.trident.operators import ColdStarts, Operators
from trident_flows.scheduler.trident.pace import Pace
from trident_flows.scheduler.trident.safety import MemorySafety
from trident_flows.scheduler.trident.search import ConfigSearch
from trident_flows.scheduler.trident.verifier import Verifier
from trident_flows.scheduler.trident_settings import CanarySettings


@dataclass
class CanaryTrial:
    """One running canary: its config, when it started (runner ``wall_s``), why, and the samples of the
    canary (``candidate``) and of the running replicas (``incumbent``) since."""

    config: OpConfig
    started_s: float
    reason: str
    candidate: list = field(default_factory=list)
    incumbent: list = field(default_factory=list)
    in_place_of: OpConfig | None = None  # the operator's own config one replica of which the canary replaced


class Canaries:
    """Canary trials of optimiser proposals (see the module docstring)."""

    def __init__(self, settings: CanarySettings, ops: Operators, search: ConfigSearch, safety: MemorySafety, gate: EvidenceGate,
                 pace: Pace, cold_starts: ColdStarts, verifier: Verifier) -> None:
        self.settings = settings
        self.ops = ops
        self.search = search
        self.safety = safety
        self.gate = gate
        self.pace = pace
        self.cold_starts = cold_starts
        self.verifier = verifier
        self.settled = False  # the last placement found nothing worth rolling out: time to explore configs
        self._refused: set = set()  # (operator, config or "run left") refused once, with an event

    def step(self, state: RunnerState, new: dict[str, list[BatchSample]], events: list[TickEvent], ended: list[CanaryEnd],
             tick: int) -> dict[str, OperatorPlan]:
        canaries: dict[str, OperatorPlan] = {}
        askable: list[tuple[int, float, str]] = []  # (last asked tick, -busy fraction, operator) of operators that may start one
        free_cpus, free_gpus = free_resources(state)
        for name, op in self.ops.items():
            space = self.search.space(name)
            if space is None:
                continue
            self.search.tell(state, name, space, new.get(name, []))
            state_op = state.operator(name)
            canary_ids = {r.replica_id for r in state_op.active if r.canary}
            if op.canary is not None:
                plan = self._judge(state, name, new.get(name, []), canary_ids, events, ended)
                if plan is not None:
                    canaries[name] = plan
            elif (self.settings.enabled and op.model.ready and self.verifier.pending is None and self.settled and tick >= op.next_ask
                  and state_op.busy_fraction >= self.settings.min_busy and not self.abandoned_here(name)):
                askable.append((op.asked_tick, -state_op.busy_fraction, name))
        # At most one optimiser is asked per tick, the longest unasked (busiest first), and only with
        # resources free for a canary; one whose proposal could not start waits ``reask_ticks`` ticks. An
        # ask fits its surrogate (0.1-0.3 s): asking every operator every tick made canary search the
        # controller's largest cost while the proposals could not start (no free CPU, already running).
        if askable and not canaries and (free_cpus > 1e-9 or free_gpus > 1e-9):
            name = min(askable)[2]
            plan = self._start(state, name, self.search.optimizer(name), free_cpus, free_gpus, events, tick)
            if plan is not None:
                canaries[name] = plan
            else:
                self.ops[name].next_ask = tick + self.settings.reask_ticks
        return canaries

    def _start(self, state: RunnerState, name: str, opt: ConfigOptimizer, free_cpus: float, free_gpus: float,
               events: list[TickEvent], tick: int) -> OperatorPlan | None:
        op = self.ops[name]
        op.asked_tick = tick
        left_s, needed_s = self.pace.run_left_s(state), self.needs_s(name)
        if left_s is not None and left_s < needed_s:
            if (name, "run left") not in self._refused:
                self._refused.add((name, "run left"))
                events.append(TickEvent(EventKind.CANARY, name, f"no canary: the run has about {left_s:.0f} s left, under the {needed_s:.0f} s "
                                        f"a canary needs to pay (canary_payback={self.settings.payback:g} x (cold start + canary_timeout_s))"))
            return None
        try:
            proposal = opt.ask()
        except NoSafeConfigError as exc:
            events.append(TickEvent(EventKind.NOTE, name, str(exc)))
            return None
        if proposal is None:
            return None
        config = proposal.config
        serving = state.operator(name).configs()
        if config in serving or config in op.accepted or self.rejected_here(name, config) or self.safety.unsafe(name, config):
            return None
        if proposal.kind == "seed" and any(c.device == config.device for c in serving):
            return None  # the running replicas measure that device already (they are told every tell_every batches)
        swapped = None
        if config.cpus > free_cpus + 1e-9 or config.gpus > free_gpus + 1e-9:
            swapped = in_place_of(serving, config, free_cpus, free_gpus) if self.settings.in_place else None
            if swapped is None:
                return None
        if math.isfinite(proposal.memory_upper_bound) and proposal.memory_upper_bound > self.search.limit(config):
            return None
        try:
            rate = op.model.per_replica(config, max(1, sum(serving.values()))).mean
        except (NoModelError, ValueError):
            rate = 0.0
        if rate > 0 and config.batch_size / rate > self.settings.max_batch_s:
            # the optimiser proposes the same config until it is told more: no other canary until the workload
            # changes, so the CPU kept for one goes back to the placement
            op.canary_abandoned_s = state.wall_s
            if (name, config) not in self._refused:
                self._refused.add((name, config))
                events.append(TickEvent(EventKind.CANARY, name, f"no canary of {config.label()}: one batch would take about {config.batch_size / rate:.0f} s "
                              f"(> canary_max_batch_s={self.settings.max_batch_s:g}); draining it would stall the rollouts"))
            return None
        op.canary = CanaryTrial(config, state.wall_s, proposal.reason, in_place_of=swapped)
        where = f" in place of one {swapped.label()} replica (no free {config.device})" if swapped is not None else ""
        reason = f"canary {config.label()} for {name}{where}: {proposal.reason}"
        events.append(TickEvent(EventKind.CANARY, name, reason))
        return OperatorPlan(name, with_one_more(serving_groups(state.operator(name)), swapped, -1), reason, config)

    def rejected_here(self, name: str, config: OpConfig) -> bool:
        """True while ``config``'s canary of ``name`` was rejected since the operator's workload last changed."""
        rejected = self.ops[name].rejected.get(config)
        return rejected is not None and self.gate.changed_wall(name) <= rejected

    def abandoned_here(self, name: str) -> bool:
        """True while ``name``'s last canary was abandoned since its workload last changed."""
        abandoned = self.ops[name].canary_abandoned_s
        return abandoned is not None and self.gate.changed_wall(name) <= abandoned

    def needs_s(self, name: str) -> float:
        """Run time a canary of ``name`` must have left to pay: ``canary_payback`` x (its longest cold start
        + ``canary_timeout_s``): the canary holds resources that long, and what it finds pays only after a
        rollout (another cold start) and for the rest of the run."""
        space = self.search.space(name)
        devices = space.devices if space is not None else ()
        cold = max((self.cold_starts.cold_start(name, d) for d in devices), default=self.cold_starts.default_s)
        return self.settings.payback * (cold + self.settings.timeout_s)

    def _judge(self, state: RunnerState, name: str, batch: list[BatchSample], canary_ids: set, events: list[TickEvent],
               ended: list[CanaryEnd]) -> OperatorPlan | None:
        op = self.ops[name]
        c = op.canary
        for s in batch:
            if s.replica_id in canary_ids and s.config == c.config:
                c.candidate.append(s)
            elif s.replica_id not in canary_ids:
                c.incumbent.append(s)
        elapsed = state.wall_s - c.started_s
        running = canary_config(state.operator(name)) == c.config
        if not c.candidate:
            if elapsed < self.settings.timeout_s or canary_busy(state.operator(name), c.config):
                # a canary holding a batch is measuring a slow one: ending it now would wait for that batch anyway
                # (a retiring replica drains), holding the control loop
                return None
            op.canary, op.canary_abandoned_s = None, state.wall_s
            why = "got no batch (the operator is starved)" if running else "never became warm"
            reason = f"canary {c.config.label()} of {name} abandoned: it {why} within canary_timeout_s={self.settings.timeout_s:g}"
            events.append(TickEvent(EventKind.CANARY, name, reason))
            ended.append(CanaryEnd(name, c.config, CanaryVerdict.ABANDONED))
            return OperatorPlan(name, with_one_more(serving_groups(state.operator(name)), c.in_place_of, 1), reason, None)
        decision = canary_protocol.decide(c.candidate, c.incumbent, elapsed_s=elapsed, policy=self.settings.policy,
                                          memory_limit=self.search.limit(c.config))
        if decision.verdict == canary_protocol.Verdict.MEASURE:
            return None
        m = canary_protocol.measure(c.candidate)
        opt = self.search.optimizer(name)
        if m.oom:
            op.unsafe[c.config] = f"canary {c.config.label()} ran out of memory"
        elif m.throughput > 0 and m.peak_memory > 0:
            opt.tell(c.config, m.throughput, m.peak_memory, m.features, items=m.items)
        if decision.verdict == canary_protocol.Verdict.ACCEPT:
            op.accepted.add(c.config)
        else:
            op.rejected[c.config] = state.wall_s
        op.canary = None
        reason = f"canary {c.config.label()} of {name} {decision.verdict.value}ed: {decision.reason}"
        events.append(TickEvent(EventKind.CANARY, name, reason))
        accepted = decision.verdict == canary_protocol.Verdict.ACCEPT
        ended.append(CanaryEnd(name, c.config, CanaryVerdict.ACCEPTED if accepted else CanaryVerdict.REJECTED))
        return OperatorPlan(name, with_one_more(serving_groups(state.operator(name)), c.in_place_of, 1), reason, None)

    def attach(self, state: RunnerState, plan: Plan | None, canaries: dict[str, OperatorPlan], ended: list[CanaryEnd]) -> Plan:
        if plan is None:
            return Plan(tuple(canaries.values()), 0.0, "; ".join(o.reason for o in canaries.values()),
                        Rationale(PlanKind.CANARY, canaries_ended=tuple(ended)))
        ops = [replace(o, canary=canaries[o.operator].canary) if o.operator in canaries else self.keeping(state, o)
               for o in plan.operators]
        named = {o.operator for o in ops}
        ops += [o for n, o in canaries.items() if n not in named]
        return replace(plan, operators=tuple(ops))

    def keeping(self, state: RunnerState, o: OperatorPlan) -> OperatorPlan:
        """``o`` with the operator's canary kept while it is still being measured (the placement's plans carry
        no canary: without this a rollout would end the one running)."""
        return replace(o, canary=canary_config(state.operator(o.operator)) if self.ops[o.operator].canary else None)

    def exploring(self, state: RunnerState) -> bool:
        """True while canaries are on and some operator may still get one: busy enough, not backed off,
        and its optimiser for the current regime not finished. Once none may, the CPU kept for a canary
        goes back to the placement."""
        if not self.settings.enabled:
            return False
        for op_state in state.operators:
            op = self.ops.get(op_state.name)
            if op is None or self.search.space(op_state.name) is None:
                continue
            if op.canary is not None:
                return True
            if (op.model.ready and op_state.busy_fraction >= self.settings.min_busy and not self.abandoned_here(op_state.name)
                    and not self.search.optimizer(op_state.name).finished):
                return True
        return False


def in_place_of(serving: Mapping[OpConfig, int], config: OpConfig, free_cpus: float, free_gpus: float) -> OpConfig | None:
    """The serving config (of those with most replicas) one replica of which, retired, frees room for a canary of ``config``
    on the same device, where the operator keeps at least one replica; None where none does."""
    if sum(serving.values()) < 2:
        return None
    fits = [c for c in serving if c.device == config.device and free_cpus + c.cpus + 1e-9 >= config.cpus
            and free_gpus + c.gpus + 1e-9 >= config.gpus]
    return max(fits, key=lambda c: (serving[c], c.label()), default=None)


def with_one_more(groups: tuple[ReplicaGroup, ...], config: OpConfig | None, delta: int) -> tuple[ReplicaGroup, ...]:
    """``groups`` with ``delta`` (+1 or -1) replicas of ``config`` (unchanged for None); a group left empty is dropped."""
    if config is None:
        return groups
    out = [replace(g, replicas=g.replicas + delta) if g.config == config else g for g in groups]
    if not any(g.config == config for g in groups) and delta > 0:
        out.append(ReplicaGroup(config, delta))
    return tuple(g for g in out if g.replicas > 0)
