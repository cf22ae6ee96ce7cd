"""The oracle of the closed-loop benchmarks: a policy that knows the input stream's regime schedule.

Contract: ``OraclePolicy(blocks, configs, cpus, gpus)`` is a policy (``decide(state, samples) ->
Plan | None``) that switches each operator to the configuration given for the regime its own
input is in (see the class docstring). A regime's configuration is a ``StaticConfig`` (one config
per operator) or an ``Allocation`` (per operator, (config, replicas) groups: mixed devices). It uses knowledge no user has (the schedule and each
regime's best configuration), so it is a labelled upper reference, not a baseline.
"""

from __future__ import annotations

from collections import deque
from typing import Mapping, Sequence, Union

from benchmarks.allocation import Allocation, allocation_of, label
from trident_flows.core.decision import Decision
from trident_flows.core.state import RunnerState
from trident_flows.core.types import BatchSample, OpConfig, OperatorPlan, Plan, ReplicaGroup
from trident_flows.scheduler.replicas import held
from trident_flows.scheduler.throughput_measure import stream_positions
from trident_flows.sim.static_search import StaticConfig

RATE_TICKS = 5  # ticks over which an operator's intake rate is measured


class OraclePolicy:
    """Knows the regime schedule: every operator runs the best static configuration of the regime
    its own input is in. An operator's position in the input stream comes from the runner's
    counters: the head's items taken, then for each later operator the share of the rows
    delivered to it that it has taken, applied to the position of the operator before it (so a
    downstream operator switches when the new block reaches it, not when it enters the pipeline).
    It switches ahead of the block by the operator's cold start plus one tick (``tick_s``; the cold
    start its replicas measured, at the rate its position advanced over the last ``RATE_TICKS``
    ticks), so that the new replicas are warm when the block arrives, as a policy that anticipates
    can. Where the new mix does not fit the cluster (operators still on the old block hold what the
    new block's operators want), the operators whose new configuration holds no more than their
    current one switch, and each growing one, in pipeline order, takes as many replicas of its new
    configuration as fit beside the rest (its own resources and the free ones); it takes the rest
    at a later tick, as the others free theirs."""

    name = "oracle"

    def __init__(self, blocks: Sequence[tuple[str, int, int]], configs: Mapping[str, Union[StaticConfig, Allocation]], cpus: float,
                 gpus: float, tick_s: float = 1.0) -> None:
        self.blocks = list(blocks)
        self.configs = {r: {name: dict(groups) for name, groups in allocation_of(c)} for r, c in configs.items()}
        self.labels = {r: label(allocation_of(c)) for r, c in configs.items()}
        self.predicted = {r: c.predicted_items_per_s if isinstance(c, StaticConfig) else 0.0 for r, c in configs.items()}
        self.cpus, self.gpus = cpus, gpus
        self.tick_s = tick_s
        self._history: deque[tuple[float, dict[str, float]]] = deque(maxlen=RATE_TICKS)

    def regime_at(self, item: float) -> str:
        for regime, start, end in self.blocks:
            if start <= item < end:
                return regime
        return self.blocks[-1][0]

    def regime_ahead(self, item: float, rate: float, lead_s: float) -> str:
        """The regime at ``item``, or the next block's once its first item is within ``lead_s`` at ``rate`` items/s."""
        after = next((start for _, start, _ in self.blocks if start > item), None)
        if after is not None and rate > 0 and (after - item) / rate <= lead_s:
            return self.regime_at(after)
        return self.regime_at(item)

    @staticmethod
    def positions(state: RunnerState) -> dict[str, float]:
        """Each operator's estimated position (input items) in the stream (``throughput_measure.stream_positions``)."""
        return stream_positions(state)

    def decide(self, state: RunnerState, samples: Sequence[BatchSample]) -> Decision:
        positions = self.positions(state)
        rates = self._rates(state.wall_s, positions)
        self._history.append((state.wall_s, positions))
        current = {op.name: op.configs() for op in state.operators}
        target: dict[str, tuple[str, dict[OpConfig, int]]] = {}
        for op in state.operators:
            lead_s = max((r.cold_start_s for r in op.replicas), default=0.0) + self.tick_s
            regime = self.regime_ahead(positions[op.name], rates.get(op.name, 0.0), lead_s)
            target[op.name] = (regime, self.configs[regime][op.name])
        changing = [n for n, (_, groups) in target.items() if current[n] != groups]
        if not changing:
            return Decision.no_change()
        final = {n: (groups if n in changing else current[n]) for n, (_, groups) in target.items()}
        cpus = sum(held(g)[0] for g in final.values())
        gpus = sum(held(g)[1] for g in final.values())
        if cpus > self.cpus + 1e-9 or gpus > self.gpus + 1e-9:
            final, changing = self._fitting(state, current, final, changing)
            if not changing:
                return Decision.no_change("the next configurations do not fit the cluster yet")
        ops = []
        for n in changing:
            regime, groups = target[n][0], final[n]
            ops.append(OperatorPlan(n, tuple(ReplicaGroup(c, r) for c, r in groups.items()),
                                    f"oracle: {n} is at input item ~{positions[n]:.0f}, regime {regime!r}: its configuration "
                                    f"{self.labels[regime]}"))
        head_regime = target[state.operators[0].name][0]
        plan = Plan(tuple(ops), self.predicted[head_regime], "; ".join(o.reason for o in ops))
        return Decision.roll_out(plan, plan.reason, plan.predicted_throughput)


    def _fitting(self, state: RunnerState, current: Mapping[str, dict[OpConfig, int]], final: Mapping[str, dict[OpConfig, int]],
                 changing: Sequence[str]) -> tuple[dict[str, dict[OpConfig, int]], list[str]]:
        """The mix that fits (see the class docstring): shrinking operators switch; each growing one, in pipeline order, takes
        the replicas of its new configuration that fit. Returns the mix and the operators it changes."""
        shrinking = [n for n in changing if all(a <= b + 1e-9 for a, b in zip(held(final[n]), held(current[n])))]
        mix = {n: dict(final[n]) if n in shrinking else dict(current[n]) for n in final}
        moved = list(shrinking)
        for op in state.operators:
            n = op.name
            if n not in changing or n in shrinking:
                continue
            free_cpus = self.cpus - sum(held(g)[0] for k, g in mix.items() if k != n)
            free_gpus = self.gpus - sum(held(g)[1] for k, g in mix.items() if k != n)
            part: dict[OpConfig, int] = {}
            for config, replicas in sorted(final[n].items(), key=lambda kv: kv[0].label()):
                fit = replicas
                if config.cpus > 0:
                    fit = min(fit, int((free_cpus - held(part)[0]) // config.cpus + 1e-9))
                if config.gpus > 0:
                    fit = min(fit, int((free_gpus - held(part)[1]) / config.gpus + 1e-9))
                if fit > 0:
                    part[config] = fit
            if part and part != current[n]:
                mix[n] = part
                moved.append(n)
        return mix, [n for n in changing if n in moved]

    def _rates(self, wall_s: float, positions: Mapping[str, float]) -> dict[str, float]:
        """Input items per second each operator's position advanced over the last ``RATE_TICKS`` ticks."""
        if not self._history or wall_s <= self._history[0][0]:
            return {}
        t0, before = self._history[0]
        return {name: max(0.0, (p - before.get(name, p)) / (wall_s - t0)) for name, p in positions.items()}
