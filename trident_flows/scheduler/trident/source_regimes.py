"""Regimes recognised at the source: the input stream cut into segments by the first operator's item features.

Contract:
- ``observe(state, samples)`` reads the source operator's ok batches as runs of input items and
  starts a new segment when the newest ``source_regime_items`` items' per-item features differ from
  the current signature (``memory.same_regime`` at ``source_regime_rel``) and the next window
  confirms it; the segment's regime is a known one with a matching signature (this run or
  remembered), else a new one. Returns one ``TickEvent`` per new segment.
- Every operator's ok batches are credited to the segments their items lie in (by stream
  position); ``Regime.features`` / ``items`` / ``rate(op, config)`` / ``covered(ops)`` say what each
  operator measured on a regime.
- Segments start at strictly increasing input items: ``at(position)``, ``next_after(position)``,
  ``current``, ``live(state)``, ``known_ahead(state)`` and ``items_per_regime()`` query them;
  ``span(segment)`` is a segment's input items: to the next segment's start, and for the newest at
  least what its regime's earlier segments held on average.
- ``remember(signature, features)`` adds a regime known from an earlier run (``TridentMemory``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from trident_flows.core.state import RunnerState
from trident_flows.core.types import BatchSample, OpConfig, Outcome
from trident_flows.scheduler.decision_log import EventKind, TickEvent
from trident_flows.scheduler.throughput_measure import stream_positions
from trident_flows.scheduler.trident.memory import same_regime
from trident_flows.scheduler.trident_settings import SourceRegimeSettings


@dataclass
class Regime:
    """One workload regime: its signature at the source and what each operator measured on its items."""

    id: int
    signature: dict[str, float]
    remembered: bool = False  # known from an earlier run
    features: dict[str, dict[str, float]] = field(default_factory=dict)  # operator -> per-item features measured on this regime
    items: dict[str, float] = field(default_factory=dict)  # operator -> items those features were measured on
    busy: dict[str, dict[OpConfig, tuple[float, float]]] = field(default_factory=dict)  # operator -> config -> (items, busy s)

    def credit(self, sample: BatchSample) -> None:
        """Fold one ok batch of an operator into its per-item features and its config's items per busy second."""
        operator, items = sample.operator, float(sample.items_in)
        seen = self.items.get(operator, 0.0)
        old = self.features.get(operator, {})
        total = seen + items
        self.features[operator] = {f: (old.get(f, 0.0) * seen + sample.features.get(f, 0.0)) / total for f in set(old) | set(sample.features)}
        self.items[operator] = total
        done, busy = self.busy.setdefault(operator, {}).get(sample.config, (0.0, 0.0))
        self.busy[operator][sample.config] = (done + items, busy + max(0.0, sample.busy_s))

    def rate(self, operator: str, config: OpConfig) -> tuple[float, float] | None:
        """(items, items per busy second of one replica) measured for ``config`` on this regime; None: not measured."""
        done, busy = self.busy.get(operator, {}).get(config, (0.0, 0.0))
        return (done, done / busy) if done > 0 and busy > 0 else None

    def covered(self, operators: Sequence[str], least_items: float = 1.0) -> bool:
        return all(self.items.get(op, 0.0) >= least_items for op in operators)

    def describe(self) -> str:
        return ", ".join(f"{k} {v:.3g}/item" for k, v in sorted(self.signature.items())) or "no features"


@dataclass(frozen=True)
class Segment:
    """Input items from ``start`` on (to the next segment's start) belong to ``regime``."""

    start: float
    regime: Regime


class SourceRegimes:
    """The input stream's segments and the regimes they belong to (see the module docstring)."""

    def __init__(self, settings: SourceRegimeSettings) -> None:
        self.settings = settings
        self.regimes: list[Regime] = []
        self.segments: list[Segment] = []
        self.position = 0.0  # input items the source has read (its ok batches, in arrival order)
        self._recent: deque[tuple[float, float, dict[str, float]]] = deque()  # (first item, items, feature sums), newest last
        self._signature_items = 0.0  # items of the current segment folded into its signature
        self._positions: dict[str, float] = {}  # each operator's stream position at the last tick
        self._pending: tuple[float, dict[str, float]] | None = None  # (first item, signature) of a change not yet confirmed

    @property
    def current(self) -> Segment | None:
        return self.segments[-1] if self.segments else None

    def remember(self, signature: Mapping[str, float], features: Mapping[str, Mapping[str, float]]) -> Regime:
        regime = Regime(len(self.regimes), dict(signature), remembered=True,
                        features={op: dict(f) for op, f in features.items()}, items={op: 0.0 for op in features})
        self.regimes.append(regime)
        return regime

    def at(self, position: float) -> Segment | None:
        found = None
        for segment in self.segments:
            if segment.start > position:
                break
            found = segment
        return found

    def items_per_regime(self) -> dict[int, float]:
        """Input items read so far in each regime (its segments, the newest up to ``position``)."""
        out: dict[int, float] = {}
        for segment in self.segments:
            out[segment.regime.id] = out.get(segment.regime.id, 0.0) + max(0.0, self._end_of(segment.start) - segment.start)
        return out

    def span(self, segment: Segment) -> float:
        """Input items of ``segment``: exact once a later segment started; for the newest, the items read so far or
        the mean of its regime's earlier segments, whichever is more."""
        read = max(0.0, self._end_of(segment.start) - segment.start)
        if self.next_after(segment.start) is not None:
            return read
        earlier = [max(0.0, self._end_of(s.start) - s.start) for s in self.segments if s.regime is segment.regime and s.start < segment.start]
        return max(read, sum(earlier) / len(earlier)) if earlier else read

    def known_ahead(self, state: RunnerState) -> float:
        """Input items of the segment the last operator works on that the source has read and the last operator has
        not taken yet: that regime lasts at least this long at the end of the pipeline (0 before any segment)."""
        if not self.segments or not state.operators:
            return 0.0
        last = stream_positions(state)[state.operators[-1].name]
        return max(0.0, self._end_of(last) - last)

    def live(self, state: RunnerState) -> set[int]:
        """Ids of the regimes some operator works on now (the segments at the operators' stream positions)."""
        return {s.regime.id for s in (self.at(p) for p in stream_positions(state).values()) if s is not None}

    def next_after(self, position: float) -> Segment | None:
        return next((s for s in self.segments if s.start > position), None)

    def _end_of(self, position: float) -> float:
        """Where the segment holding input item ``position`` ends: the next segment's start, or for the newest the
        items the source has read so far."""
        ahead = self.next_after(position)
        return ahead.start if ahead is not None else self.position

    def observe(self, state: RunnerState, samples: Sequence[BatchSample]) -> list[TickEvent]:
        if not state.operators:
            return []
        source = state.operators[0].name
        events = []
        for s in sorted((s for s in samples if s.operator == source and s.outcome == Outcome.OK and s.items_in > 0), key=lambda s: s.end):
            first = self.position
            self._recent.append((first, float(s.items_in), dict(s.features)))
            self.position += s.items_in
            event = self._step()
            if event is not None:
                events.append(event)
            segment = self.at(first)
            if segment is not None:
                segment.regime.credit(s)
        positions = stream_positions(state)
        by_op: dict[str, list[BatchSample]] = {}
        for s in samples:
            if s.operator != source and s.outcome == Outcome.OK and s.items_in > 0 and s.operator in positions:
                by_op.setdefault(s.operator, []).append(s)
        for name, batch in by_op.items():
            # the tick's batches spread, in the order they ended, over the stream positions the operator moved through
            now, before = positions[name], min(self._positions.get(name, 0.0), positions[name])
            total, done = sum(s.items_in for s in batch), 0.0
            for s in sorted(batch, key=lambda s: s.end):
                segment = self.at(before + (now - before) * (done + s.items_in / 2) / total)
                done += s.items_in
                if segment is not None:
                    segment.regime.credit(s)
        self._positions = positions
        return events

    def _step(self) -> TickEvent | None:
        """Compare the newest window with the current segment; a change is confirmed by the window after it."""
        want = self.settings.items
        rel = self.settings.rel
        while len(self._recent) > 1 and sum(n for _, n, _ in self._recent) - self._recent[0][1] >= want:
            self._recent.popleft()
        items = sum(n for _, n, _ in self._recent)
        if items < want:
            return None
        window = _per_item(self._recent)
        current = self.current
        if current is not None and same_regime(window, current.regime.signature, rel):
            self._pending = None  # a blip: the current regime goes on
            if self._signature_items < 4 * want:  # the signature is the mean of a segment's first items
                k = self._signature_items + items
                current.regime.signature = {f: (current.regime.signature.get(f, 0.0) * self._signature_items + window.get(f, 0.0) * items) / k
                                            for f in set(window) | set(current.regime.signature)}
                self._signature_items = min(k, 4 * want)
            return None
        start = self._recent[0][0] if current is not None else 0.0
        self._recent.clear()
        if current is not None and (self._pending is None or not same_regime(window, self._pending[1], rel)):
            # the first window unlike the current regime may straddle the boundary: the next one confirms (or replaces) it
            self._pending = (start if self._pending is None else self._pending[0], window)
            return None
        if self._pending is not None:
            start = self._pending[0]
        self._pending = None
        regime = next((r for r in self.regimes if same_regime(window, r.signature, rel)), None)
        seen = regime is not None
        if regime is None:
            regime = Regime(len(self.regimes), window)
            self.regimes.append(regime)
        self.segments.append(Segment(start, regime))
        self._signature_items = items
        kind = "remembered from an earlier run" if regime.remembered else "seen before in this run" if seen else "new"
        return TickEvent(EventKind.SOURCE_REGIME, "", f"source regime {regime.id} ({kind}) from input item {start:.0f}: {regime.describe()}")


def _per_item(runs: Sequence[tuple[float, float, Mapping[str, float]]]) -> dict[str, float]:
    items = sum(n for _, n, _ in runs)
    names = {f for _, _, sums in runs for f in sums}
    return {f: sum(sums.get(f, 0.0) for _, _, sums in runs) / items for f in names}
