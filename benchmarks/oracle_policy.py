"""The oracle of the closed-loop benchmarks: a policy that knows the input stream's regime schedule.

Contract: ``OraclePolicy(blocks, configs, cpus, gpus)`` is a policy (``decide(state, samples) ->
Plan | None``) that switches each operator to the configuration given for the regime its own
input is in (see the class docstring). A regime's configuration is a ``StaticConfig`` (one config
per operator) or an ``Allocation`` (per operator, (config, replicas) groups: mixed devices). It uses knowledge no user has (the schedule and each
regime's best configuration), so it is a labelled upper reference, not a baseline.
"""

from __future__ import annotations

from typing import Mapping, Sequence, Union

from benchmarks.allocation import Allocation, allocation_of, label

from trident_flows.sim.static_search import StaticConfig
from trident_flows.core.state import RunnerState
from trident_flows.core.types import BatchSample, OpConfig, OperatorPlan, Plan, ReplicaGroup
from trident_flows.scheduler.replicas import held
from trident_flows.scheduler.throughput_measure import stream_positions


class OraclePolicy:
    """Knows the regime schedule: every operator runs the best static configuration of the regime
    its own input is in. An operator's position in the input stream comes from the runner's
    counters: the head's items taken, then for each later operator the share of the rows
    delivered to it that it has taken, applied to the position of the operator before it (so a
    downstream operator switches when the new block reaches it, not when it enters the pipeline).
    A mix of configurations that does not fit the cluster waits: only the operators whose new
    configuration holds no more than the current one switch until the rest fit."""

    name = "oracle"

    def __init__(self, blocks: Sequence[tuple[str, int, int]], configs: Mapping[str, Union[StaticConfig, Allocation]], cpus: float,
                 gpus: float) -> None:
        self.blocks = list(blocks)
        self.configs = {r: {name: dict(groups) for name, groups in allocation_of(c)} for r, c in configs.items()}
        self.labels = {r: label(allocation_of(c)) for r, c in configs.items()}
        self.predicted = {r: c.predicted_items_per_s if isinstance(c, StaticConfig) else 0.0 for r, c in configs.items()}
        self.cpus, self.gpus = cpus, gpus

    def regime_at(self, item: float) -> str:
        for regime, start, end in self.blocks:
            if start <= item < end:
                return regime
        return self.blocks[-1][0]

    @staticmethod
    def positions(state: RunnerState) -> dict[str, float]:
        """Each operator's estimated position (input items) in the stream (``throughput_measure.stream_positions``)."""
        return stream_positions(state)

    def decide(self, state: RunnerState, samples: Sequence[BatchSample]) -> Plan | None:
        positions = self.positions(state)
        current = {op.name: op.configs() for op in state.operators}
        target: dict[str, tuple[str, dict[OpConfig, int]]] = {}
        for op in state.operators:
            regime = self.regime_at(positions[op.name])
            target[op.name] = (regime, self.configs[regime][op.name])
        changing = [n for n, (_, groups) in target.items() if current[n] != groups]
        if not changing:
            return None
        final = {n: (groups if n in changing else current[n]) for n, (_, groups) in target.items()}
        cpus = sum(held(g)[0] for g in final.values())
        gpus = sum(held(g)[1] for g in final.values())
        if cpus > self.cpus + 1e-9 or gpus > self.gpus + 1e-9:
            changing = [n for n in changing if all(a <= b + 1e-9 for a, b in zip(held(final[n]), held(current[n])))]
            if not changing:
                return None
        ops = []
        for n in changing:
            regime, groups = target[n]
            ops.append(OperatorPlan(n, tuple(ReplicaGroup(c, r) for c, r in groups.items()),
                                    f"oracle: {n} is at input item ~{positions[n]:.0f}, regime {regime!r}: its configuration "
                                    f"{self.labels[regime]}"))
        head_regime = target[state.operators[0].name][0]
        return Plan(tuple(ops), self.predicted[head_regime], "; ".join(o.reason for o in ops))

