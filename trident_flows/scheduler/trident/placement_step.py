"""The placement step of the Trident policy: per operator its candidate configs as placement options, and the MILP's answer.

Contract:
- ``place(state, tick) -> Placed``: demands, cluster, the solver's result, the unsafe running
  configs (``forced``) and notes. Raises while an operator has no fitted model or safe candidate,
  or when the solver fails. Re-solved only when an input changed or ``resolve_ticks`` passed.
- ``candidates(state, name)``: running configs, accepted canaries, the optimiser's and regime
  memory's best and, off an unsafe config, the next smaller batch; a config whose canary was
  rejected since the operator's workload last changed, or (not running) whose batch is below the
  operator's in-flight depth (``BatchDepth.too_small``), is none of these; unsafe, unfitting or
  under-sampled (``min_config_samples``: the evidence gate) ones are no option. Capacity curves
  are the model's lower confidence bound (``confidence_z``) of what more replicas add, made concave.
- ``cluster_for_placement(state)``: the cluster minus running canaries and, while
  ``Canaries.exploring``, one CPU kept free for a canary (on a single node of the largest class, when that
  leaves a CPU per operator); ``keeps_canary_cpu(state)``: whether it keeps it now (idle capacity keeps the same).
- ``replica_cap`` and ``placement_option`` serve the regime plans too; ``solve`` is the solver.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace
from typing import Any, Callable, NamedTuple

from trident_flows.core.signatures import placement_signature
from trident_flows.core.state import RunnerState
from trident_flows.core.types import CPU, ClusterSpec, OpConfig
from trident_flows.scheduler.model_values import NoModelError
from trident_flows.scheduler.placement.inputs import concave_curve, current_placement, work_per_item
from trident_flows.scheduler.placement.types import OperatorDemand, PlacementOption
from trident_flows.scheduler.replicas import replica_limits
from trident_flows.scheduler.transfer import transfer_estimate
from trident_flows.scheduler.trident.batch_depth import BatchDepth
from trident_flows.scheduler.trident.canaries import Canaries
from trident_flows.scheduler.trident.context import Context
from trident_flows.scheduler.trident.gate import EvidenceGate
from trident_flows.scheduler.trident.models import calibration_step
from trident_flows.scheduler.trident.operators import ColdStarts, Operators, drain_s
from trident_flows.scheduler.trident.pace import Pace
from trident_flows.scheduler.trident.regimes import Regimes
from trident_flows.scheduler.trident.safety import MemorySafety
from trident_flows.scheduler.trident.search import ConfigSearch
from trident_flows.scheduler.trident_settings import PlacementSettings


class Placed(NamedTuple):
    """The placement's answer and what it was solved on."""

    demands: Any         # the operators' ``OperatorDemand``s
    cluster: Any         # the ``ClusterSpec`` placed on
    result: Any          # the solver's result (plan, throughput, bottlenecks)
    forced: Any          # (operator, config, why) of running configs that are unsafe
    notes: Any           # notes for the plan's reason


class PlacementStep:
    """Candidates, options and the placement solve (see the module docstring)."""

    def __init__(self, settings: PlacementSettings, ctx: Context, ops: Operators, *, search: ConfigSearch, safety: MemorySafety,
                 canaries: Canaries, regimes: Regimes, gate: EvidenceGate, pace: Pace, cold_starts: ColdStarts, depth: BatchDepth,
                 solve: Callable[..., Any]) -> None:
        self.settings = settings
        self.ctx = ctx
        self.ops = ops
        self.search = search
        self.safety = safety
        self.canaries = canaries
        self.regimes = regimes
        self.gate = gate
        self.pace = pace
        self.cold_starts = cold_starts
        self.depth = depth
        self.solve = solve
        self._solved: tuple | None = None  # (inputs, tick, answer) of the last solve

    def cluster_for_placement(self, state: RunnerState) -> ClusterSpec:
        """The cluster minus what running canaries hold and, while an operator may still get a canary
        (``Canaries.exploring``), one CPU kept free for it."""
        cluster = self.ctx.planned_for(state)
        cpus, gpus = self._kept(state)
        if cpus == 0 and gpus == 0:
            return cluster
        return _less(cluster, cpus, gpus, len(state.operators)) or cluster

    def keeps_canary_cpu(self, state: RunnerState) -> bool:
        """Whether ``cluster_for_placement`` keeps a CPU free for a canary now: what idle capacity keeps free too."""
        if not self.canaries.exploring(state):
            return False
        cpus, gpus = self._kept(state)
        return _less(self.ctx.planned_for(state), cpus, gpus, len(state.operators)) is not None

    def _kept(self, state: RunnerState) -> tuple[float, int]:
        """The CPUs and whole GPUs the running canaries hold, plus a CPU while an operator may still get a canary."""
        held = [r.config for op in state.operators for r in op.active if r.canary]
        cpus = sum(c.cpus for c in held) + (1.0 if self.canaries.exploring(state) else 0.0)
        return cpus, math.ceil(sum(c.gpus for c in held) - 1e-9)

    def candidates(self, state: RunnerState, name: str) -> tuple[list[OpConfig], list[str]]:
        op = self.ops[name]
        serving = list(state.operator(name).configs())
        cands: list[OpConfig] = list(serving)
        extra: list[OpConfig] = list(op.accepted)
        space = self.search.space(name)
        if space is not None:
            best = self.search.optimizer(name).best()
            if best is not None:
                extra.append(best)
        record = self.regimes.memory.recall(op.detector.current, name) if op.detector.current is not None else None
        if record is not None and record.best_config is not None:
            extra.append(record.best_config)
        notes = []
        for c in serving:
            why = self.safety.unsafe(name, c)
            if why is not None and c.batch_size > 1:
                smaller = c.with_changes(batch_size=max(1, c.batch_size // 2))
                extra.append(smaller)
                notes.append(f"{name}: {c.label()} is unsafe ({why}); candidate {smaller.label()}")
        for c in extra:
            if c not in cands and not self.canaries.rejected_here(name, c) and not self.depth.too_small(name, c):
                cands.append(c)
        return cands, notes

    def place(self, state: RunnerState, tick: int) -> Placed:
        cluster = self.cluster_for_placement(state)
        key = (cluster, placement_signature(state), frozenset(self.gate.stale),
               tuple((n, o.model_version, o.detector.current, frozenset(o.unsafe), frozenset(o.accepted), frozenset(o.rejected),
                      calibration_step(o.model))
                     for n, o in sorted(self.ops.items())))
        if self._solved is not None and self._solved[0] == key and tick - self._solved[1] < self.settings.resolve_ticks:
            return self._solved[2]
        solved = self._solve(state, cluster)
        self._solved = (key, tick, solved)
        return solved

    def _solve(self, state: RunnerState, cluster: ClusterSpec) -> Placed:
        work = work_per_item(state, tuple(self.pace.history))
        demands, forced, notes = [], [], []
        for op_state in state.operators:
            name = op_state.name
            op = self.ops[name]
            if not op.model.ready:
                raise NoModelError(f"operator {name!r} has no throughput model yet ({op.model.report.reason if op.model.report else 'no samples'})")
            lo, hi = replica_limits(name, self.ctx.spec)
            cands, cand_notes = self.candidates(state, name)
            notes += cand_notes
            if op.model.calibration is not None:
                notes.append(op.model.calibration.describe())
            serving_counts = op_state.configs()
            moving_off = any(self.safety.unsafe(name, c) is not None for c in serving_counts)
            seen = Counter(smp.config for _, smp in op.window)
            options = []
            for config in cands:
                unsafe = self.safety.unsafe(name, config)
                serving = config in serving_counts
                if unsafe is not None:
                    if serving:
                        forced.append((name, config, unsafe))
                    continue
                cap = replica_cap(cluster, config, hi)
                if cap < 1:
                    continue
                if not serving and not moving_off and config not in op.accepted and seen.get(config, 0) < self.gate.settings.min_config_samples:
                    continue  # evidence gate: too few measurements to compare it (an accepted canary passed its own test; a safety move is exempt)
                try:
                    # Evidence gate: capacity beyond what runs now counts at its lower confidence bound, so a
                    # change is chosen only when its gain holds there (a safety move uses the median).
                    z = 0.0 if moving_off else self.gate.settings.confidence_z
                    totals = op.model.capacity_lower(config, cap, serving_counts.get(config, 0), z)
                    curve = concave_curve(totals.tolist())
                except (NoModelError, ValueError):
                    continue
                options.append(placement_option(name, config, curve, self.search, self.cold_starts, op))
            if not options:
                raise ValueError(f"operator {name!r}: no safe candidate config with a throughput prediction")
            moved = transfer_estimate(smp for _, smp in op.window)
            demands.append(OperatorDemand(name, work[name], tuple(options), min_replicas=lo, max_replicas=hi,
                                          input_bytes_per_item=moved.bytes_per_item if moved else 0.0))
        result = self.solve(demands, cluster, current_placement(state), solver=self.settings.solver, time_limit_s=self.settings.time_limit_s)
        return Placed(demands, cluster, result, forced, notes)


def replica_cap(cluster: ClusterSpec, config: OpConfig, most: int) -> int:
    """The most replicas of ``config`` the cluster's CPUs and GPUs hold, at most ``most``."""
    cap = min(most, int(cluster.total_cpus // config.cpus) if config.cpus > 0 else most)
    if config.gpus > 0:
        cap = min(cap, int(cluster.total_gpus / config.gpus + 1e-9))
    return cap


def placement_option(name: str, config: OpConfig, curve: Any, search: ConfigSearch, cold_starts: ColdStarts, op: Any) -> PlacementOption:
    """``config`` of operator ``name`` as a MILP option: its capacity ``curve``, its memory upper bound (host for a CPU
    config, device otherwise), its cold start on the device and ``op``'s drain."""
    bound = search.memory_bound(name, config) or 0.0
    is_cpu = config.device == CPU
    return PlacementOption(config, curve, host_mem_bytes=int(bound) if is_cpu else 0, device_mem_bytes=0 if is_cpu else int(bound),
                           cold_start_s=cold_starts.cold_start(name, config.device), drain_s=drain_s(op))


def _less(cluster: ClusterSpec, cpus: float, gpus: int, operators: int) -> ClusterSpec | None:
    """``cluster`` with ``cpus`` and ``gpus`` taken from a single node of its largest class, when that leaves a CPU per
    operator and the GPUs exist (None otherwise: nothing is kept)."""
    classes = list(cluster.node_classes)
    big = max(range(len(classes)), key=lambda i: classes[i].cpus * classes[i].count)
    nc = classes[big]
    if nc.count != 1 or nc.cpus - cpus < operators or nc.gpus - gpus < 0:
        return None
    classes[big] = replace(nc, cpus=nc.cpus - cpus, gpus=nc.gpus - gpus, gpu_memory_bytes=nc.gpu_memory_bytes if nc.gpus - gpus > 0 else 0)
    return ClusterSpec(tuple(classes))
