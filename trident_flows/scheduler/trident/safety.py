"""Memory safety of the Trident policy: which configs are unsafe, and the move off them that always fits.

Contract:
- ``record_ooms(new, events)``: a config that ran out of memory becomes unsafe for its operator (it and
  every larger batch of the same device and knobs), with an ``OOM`` event; the operator's optimiser
  is told, when the config lies in its space.
- ``unsafe(name, config)`` says why ``config`` is unsafe for ``name`` (it or a smaller batch ran out of
  memory, or its memory upper bound exceeds the budget's limit), None when it is safe. Memory does not
  fall as the batch grows: a config no larger than a batch of the same device and knobs that ran
  without running out of memory and whose own bound is within the limit is safe, however wide its own
  bound (an unmeasured small batch's bound is an extrapolation).
- ``plan(state)`` moves every operator off its unsafe running configs to the largest smaller batch that
  is not unsafe (halving down to 1), replica for replica: the same CPUs/GPUs, so it always fits. It
  keeps the operator's canary and carries a ``MEMORY_SAFETY`` rationale naming the unsafe configs.
  None when every running config is safe. Safety comes before gain: the arbiter issues this move
  before the evidence gate opens, while a rollout is verified, and whenever the placement does not
  move the operator.
"""

from __future__ import annotations

from trident_flows.core.state import RunnerState
from trident_flows.core.types import BatchSample, OpConfig, OperatorPlan, Outcome, Plan, PlanKind, Rationale, ReplicaGroup
from trident_flows.scheduler.constraint import per_item
from trident_flows.scheduler.decision_log import EventKind, TickEvent
from trident_flows.scheduler.replicas import canary_config, serving_groups
from trident_flows.scheduler.trident.operators import Operators, replica_counts
from trident_flows.scheduler.trident.search import ConfigSearch


class MemorySafety:
    """Unsafe configs and the move off them (see the module docstring)."""

    def __init__(self, ops: Operators, search: ConfigSearch) -> None:
        self.ops = ops
        self.search = search

    def record_ooms(self, new: dict[str, list[BatchSample]], events: list[TickEvent]) -> None:
        for name, batch in new.items():
            op = self.ops[name]
            for s in batch:
                if s.outcome == Outcome.OOM and s.config not in op.unsafe:
                    op.unsafe[s.config] = f"{s.config.label()} ran out of memory"
                    events.append(TickEvent(EventKind.OOM, name, f"{s.config.label()} ran out of memory: it and larger batches are unsafe"))
                    space = self.search.space(name)
                    if space is not None and s.config.device in space.devices and space.batch_size_min <= s.config.batch_size <= space.batch_size_max:
                        self.search.optimizer(name).tell_oom(s.config, per_item(s.features, s.items_in), items=s.items_in)

    def unsafe(self, name: str, config: OpConfig) -> str | None:
        op = self.ops[name]
        for bad, why in op.unsafe.items():
            if bad.device == config.device and bad.knobs == config.knobs and config.batch_size >= bad.batch_size:
                return why
        bound = self.search.memory_bound(name, config)
        if bound is not None and bound > self.search.limit(config) and not self._below_a_safe_batch(name, config):
            return f"memory upper bound {bound / 2**20:.0f} MiB > limit {self.search.limit(config) / 2**20:.0f} MiB"
        return None

    def _below_a_safe_batch(self, name: str, config: OpConfig) -> bool:
        """Whether a larger batch of ``config``'s device and knobs ran (in the operator's window) without running out of
        memory, its own memory upper bound within the limit."""
        larger = {s.config for _, s in self.ops[name].window
                  if s.outcome != Outcome.OOM and s.config.device == config.device and s.config.knobs == config.knobs
                  and s.config.batch_size > config.batch_size}
        for c in larger:
            bound = self.search.memory_bound(name, c)
            if bound is not None and bound <= self.search.limit(c):
                return True
        return False

    def plan(self, state: RunnerState) -> Plan | None:
        ops, unsafe = [], []
        for op_state in state.operators:
            if op_state.name not in self.ops:
                continue
            groups, moved = [], []
            for config, n in replica_counts(serving_groups(op_state)):
                safe = config
                while self.unsafe(op_state.name, safe) is not None and safe.batch_size > 1:
                    safe = safe.with_changes(batch_size=max(1, safe.batch_size // 2))
                if safe != config:
                    moved.append(f"{config.label()} -> {safe.label()} ({self.unsafe(op_state.name, config)})")
                    unsafe.append((op_state.name, config))
                groups.append(ReplicaGroup(safe, n))
            if moved:
                ops.append(OperatorPlan(op_state.name, tuple(groups), f"memory safety: {op_state.name} " + "; ".join(moved), canary_config(op_state)))
        if not ops:
            return None
        return Plan(tuple(ops), 0.0, "memory safety: " + "; ".join(o.reason for o in ops),
                    Rationale(PlanKind.MEMORY_SAFETY, unsafe=tuple(unsafe)))
