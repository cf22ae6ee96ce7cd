"""Per-operator state of the Trident policy: what it keeps about each operator between ticks.

Contract:
- ``Operator``: one operator's model, regime detector, sliding ``window`` of ``(sequence number,
  BatchSample)`` (``fed``, ``read``), fit bookkeeping, optimisers per regime, canary, and accepted,
  rejected and unsafe configs; the policy's parts read and write these fields.
- ``Operators``: name -> ``Operator`` in first-seen order; ``ensure(name)`` adds a fresh one;
  ``regime_key()`` names every operator's current regime.
- ``ColdStarts``: the longest cold start per (operator, device); ``cold_start(name, device)``
  falls back to any device, then ``default_s``; ``measured()`` / ``remember(measured)`` carry them
  across runs; ``drain_s(op)``: two median batches.
- ``replica_counts(groups)`` and ``plan_key(plan)`` compare placements.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

from trident_flows.core.state import RunnerState
from trident_flows.core.types import OpConfig, Plan
from trident_flows.scheduler.operator_model import OperatorModel
from trident_flows.scheduler.regime import RegimeDetector

if TYPE_CHECKING:
    from trident_flows.scheduler.trident.canaries import CanaryTrial

# Detector samples whose window sequence numbers an operator keeps (``Operator.read``): a change point the
# detector reports lies within its vote window, persistence or CUSUM history (256 samples) of the newest.
DETECTOR_LOOKBACK = 4096


@dataclass
class Operator:
    """What the policy keeps about one operator between ticks."""

    name: str
    model: OperatorModel
    detector: RegimeDetector
    window: deque
    fed: int = 0
    # the window sequence number of each sample given to the detector, the newest last (``regimes.window_seq``)
    read: deque = field(default_factory=lambda: deque(maxlen=DETECTOR_LOOKBACK))
    restored: bool = False
    optimizers: dict = field(default_factory=dict)
    to_tell: dict = field(default_factory=dict)
    canary: CanaryTrial | None = None
    accepted: set = field(default_factory=set)
    rejected: dict = field(default_factory=dict)  # config -> runner wall_s when its canary was rejected
    unsafe: dict = field(default_factory=dict)
    unfitted: int = 0                  # samples since the last fit
    fitted_epoch: int | None = None    # the config epoch of the last fit (None: refit at the next samples)
    fitted_on: int = 0                 # window samples the last fit used
    fitted_tick: int = -10**9          # the tick of the last fit
    workload_moved: bool = False       # a features regime change or a stale model since the last fit
    remembered: tuple | None = None    # (regime, fit report) last stored in the regime memory
    asked_tick: int = -1               # the tick its optimiser was last asked for a canary config
    next_ask: int = 0                  # the first tick it may be asked again (after a proposal that could not start)
    model_version: int = 0             # counts fits and restored models (the placement is re-solved after one)
    canary_abandoned_s: float | None = None  # runner wall_s when its last canary was abandoned (none again until the workload changes)


class Operators(Mapping[str, Operator]):
    """Every operator's ``Operator``, by name, in the order first seen."""

    def __init__(self, window: int) -> None:
        self.window_size = window
        self._by_name: dict[str, Operator] = {}

    def __getitem__(self, name: str) -> Operator:
        return self._by_name[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def ensure(self, name: str) -> Operator:
        """``name``'s state, added empty when first seen."""
        if name not in self._by_name:
            self._by_name[name] = Operator(name, OperatorModel(name), RegimeDetector(name), deque(maxlen=self.window_size))
        return self._by_name[name]

    def regime_key(self) -> tuple:
        return tuple(sorted((n, o.detector.current) for n, o in self._by_name.items()))


class ColdStarts:
    """The longest cold start measured per (operator, device): what starting another replica costs."""

    def __init__(self, default_s: float) -> None:
        self.default_s = default_s
        self._longest: dict[tuple[str, str], float] = {}

    def track(self, state: RunnerState) -> None:
        for op in state.operators:
            for r in op.replicas:
                if r.cold_start_s > 0:
                    key = (op.name, r.config.device)
                    self._longest[key] = max(self._longest.get(key, 0.0), r.cold_start_s)

    def measured(self) -> dict[str, dict[str, float]]:
        """operator -> device -> the longest cold start measured (what the memory keeps)."""
        out: dict[str, dict[str, float]] = {}
        for (name, device), s in self._longest.items():
            out.setdefault(name, {})[device] = s
        return out

    def remember(self, measured: Mapping[str, Mapping[str, float]]) -> None:
        """Cold starts measured in an earlier run: kept until this run measures longer ones."""
        for name, devices in measured.items():
            for device, s in devices.items():
                self._longest[(name, device)] = max(self._longest.get((name, device), 0.0), float(s))

    def cold_start(self, name: str, device: str) -> float:
        if (name, device) in self._longest:
            return self._longest[(name, device)]
        known = [v for (n, _d), v in self._longest.items() if n == name]
        return max(known) if known else self.default_s


def drain_s(op: Operator) -> float:
    """Seconds a retiring replica needs to finish its in-flight batches (two median batches)."""
    busy = [s.busy_s for _, s in list(op.window)[-64:]]
    return 2.0 * upper_median(busy) if busy else 1.0


def upper_median(xs: Sequence[float]) -> float:
    """The middle value (the upper one of an even count: a measured value, not a mean of two); 0.0 for none."""
    return sorted(xs)[len(xs) // 2] if xs else 0.0


def replica_counts(groups) -> list[tuple[OpConfig, int]]:
    out: dict[OpConfig, int] = {}
    for g in groups:
        if g.replicas:
            out[g.config] = out.get(g.config, 0) + g.replicas
    return sorted(out.items(), key=lambda kv: kv[0].label())


def plan_key(plan: Plan) -> frozenset:
    return frozenset((o.operator, c, n) for o in plan.operators for c, n in replica_counts(o.groups))
