"""The Trident policy's memory across runs: read when the policy starts, written at regime ends and at the run's end.

Contract:
- ``RunMemory(uri, spec, cluster)`` reads ``memory.load`` at once (``uri`` None: nothing read or
  written); ``loaded`` is the memory (None: cold start), ``warning`` the line ``load`` gave.
- ``seed(sources, plans, cold_starts)`` hands the remembered regimes, their allocations (origin
  "memory") and cold starts to the parts.
- ``starting_allocation()``: the remembered regime with the most input items, what a run starts
  in (``TridentPolicy.starting_spec``); none when its items take under ``START_MIN_S``.
- ``write(state, ops, sources, plans, cold_starts, ended=False)`` writes ``memory.merged(loaded,
  this run)`` atomically; a failed write is returned as a one-line warning (the run goes on);
  ``writes`` counts them.
"""

from __future__ import annotations

from typing import Any

from trident_flows.core.state import RunnerState
from trident_flows.core.types import ClusterSpec
from trident_flows.scheduler.trident import memory
from trident_flows.scheduler.trident.memory import PipelineIdentity, RegimeEntry, TridentMemory
from trident_flows.scheduler.trident.operators import ColdStarts, Operators
from trident_flows.scheduler.trident.regime_plans import RegimePlan, RegimePlans
from trident_flows.scheduler.trident.source_regimes import SourceRegimes

START_MIN_S = 120.0  # a run starts in a remembered plan only if its regime held this long (items / predicted rate)


class RunMemory:
    """What an earlier run remembered, and this run's memory written back (see the module docstring)."""

    def __init__(self, uri: str | None, spec: Any | None, cluster: ClusterSpec | None) -> None:
        self.uri = uri
        self.loaded: TridentMemory | None = None
        self.warning: str | None = None
        self.writes = 0
        self._pipeline = PipelineIdentity.of(spec) if uri and spec is not None else None
        self._cluster = cluster
        if uri and self._pipeline is not None and cluster is not None:
            found = memory.load(uri, self._pipeline, cluster)
            self.loaded, self.warning = found.memory, found.warning
        elif uri:
            self.warning = f"trident memory {uri} not read: the policy was built without the pipeline spec and cluster"

    @property
    def regimes_known(self) -> int:
        return len(self.loaded.regimes) if self.loaded is not None else 0

    def seed(self, sources: SourceRegimes, plans: RegimePlans, cold_starts: ColdStarts) -> None:
        if self.loaded is None:
            return
        for entry in self.loaded.regimes:
            regime = sources.remember(entry.signature, entry.operator_features)
            plans.remember(RegimePlan(regime.id, {op: dict(groups) for op, groups in entry.allocation.items()},
                                      entry.predicted_items_per_s, "memory"))
        cold_starts.remember({name: e.cold_start_s for name, e in self.loaded.operators.items()})

    def starting_allocation(self) -> tuple[RegimeEntry | None, str]:
        """The remembered regime with the most input items (then segments seen), and a line saying so; (None, why) without
        one, or when its items would have taken under ``START_MIN_S`` at its plan's predicted rate (a plan solved on a
        regime that short rests on a few batches per operator: too thin to start a whole run in before any output)."""
        if self.loaded is None or not self.loaded.regimes:
            return None, "no regime remembered"
        entry = max(self.loaded.regimes, key=lambda r: (r.items, r.seen))
        held_s = entry.items / entry.predicted_items_per_s if entry.predicted_items_per_s > 0 else 0.0
        if held_s < START_MIN_S:
            return None, (f"the remembered regime with the most items held {held_s:.0f} s of earlier runs at its plan's rate, "
                          f"under {START_MIN_S:.0f} s: too thin a plan to start in")
        share = entry.items / sum(r.items for r in self.loaded.regimes) if entry.items > 0 else None
        what = f"{share:.0%} of the input items" if share is not None else f"seen {entry.seen} time(s)"
        return entry, f"the remembered regime with the most items ({what} of {self.loaded.runs} earlier run(s))"

    def write(self, state: RunnerState, ops: Operators, sources: SourceRegimes, plans: RegimePlans, cold_starts: ColdStarts,
              ended: bool = False) -> str | None:
        if not self.uri or self._pipeline is None:
            return None
        cluster = self._cluster or ClusterSpec.single_node(state.cluster_cpus, int(state.cluster_gpus))
        entries = []
        items = sources.items_per_regime()
        live = set() if ended else sources.live(state)
        for regime in sources.regimes:
            plan = plans.plan(state, regime, regime.id in live)
            if plan is None:
                continue
            seen = sum(1 for s in sources.segments if s.regime is regime)
            entries.append(RegimeEntry(dict(regime.signature),
                                       {op: tuple(sorted(g.items(), key=lambda kv: kv[0].label())) for op, g in plan.groups.items()},
                                       plan.predicted, max(1, seen), {op: dict(f) for op, f in regime.features.items()},
                                       items.get(regime.id, 0.0)))
        samples = {name: [s for _, s in op.window] for name, op in ops.items()}
        newer = memory.memory_of(self._pipeline, cluster, samples, cold_starts.measured(), entries)
        try:
            memory.save(memory.merged(self.loaded, newer), self.uri)
        except Exception as exc:  # noqa: BLE001 - a memory that cannot be written costs the next run its warm start, not this run
            return f"trident memory not written to {self.uri}: {type(exc).__name__}: {exc}"
        self.writes += 1
        return None
