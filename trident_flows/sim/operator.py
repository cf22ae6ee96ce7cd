"""What one batch of a simulated operator costs: the emulated operator's cost model on rows.

Contract: ``SimOperator.from_spec(op_spec, features)`` reads an emulated operator's
``OperatorSpec`` (its cost model and ``time_scale``, exactly what ``EmulatedOperator`` runs);
for a batch of ``workload`` rows (``sums``: its feature columns summed) and a device, ``seconds`` is
``per_batch_s + per_item_s * items + sum_f per_unit_s[f] * sum(feature f)`` times the time
scale (0 for an empty batch), ``work_bytes`` the working set (each row scaled by its
``memory_scale``), ``features`` the per-batch feature sums a ``BatchSample`` carries, and
``route`` what leaves the operator: rows a filter drops (key >= selectivity) and, for a
splitter, each kept row repeated ``int(s)`` or ``int(s) + 1`` times with fresh keys.
Cold start on a device is the model's ``cold_start_s`` times the time scale.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from trident_flows.runtime.costmodel import DeviceCost, OperatorCost
from trident_flows.runtime.spec import OperatorSpec
from trident_flows.sim.workload import FEATURES, KEY, MEMSCALE


@dataclass(frozen=True)
class _DeviceArrays:
    per_batch_s: float
    per_item_s: float
    unit_s: np.ndarray      # per pipeline feature column
    per_item_bytes: float
    unit_bytes: np.ndarray
    resident_bytes: int
    cold_start_s: float


class SimOperator:
    def __init__(self, cost: OperatorCost, features: Sequence[str], time_scale: float = 1.0) -> None:
        self.name = cost.name
        self.cost = cost
        self.time_scale = float(time_scale)
        self.selectivity = cost.selectivity
        self._salt = (sum(map(ord, cost.name)) % 997) / 997.0  # stable across processes (str hash is not)
        names = tuple(cost.features) or tuple(sorted({f for d in cost.devices.values() for f in (*d.per_unit_s, *d.per_unit_bytes)}))
        self.feature_names = tuple(f for f in names if f in features)
        self._feature_idx = [list(features).index(f) for f in self.feature_names]
        self._devices = {d: self._arrays(c, features) for d, c in cost.devices.items()}

    @classmethod
    def from_spec(cls, spec: OperatorSpec, features: Sequence[str]) -> "SimOperator":
        from trident_flows.pipelines.emulated import EmulatedOperator, _operator_cost

        if spec.cls is not EmulatedOperator or "cost" not in spec.params:
            raise ValueError(f"operator {spec.name!r} is not an emulated operator with a cost model; the simulator runs "
                             "emulated pipelines (emulated-docs, emulated-video)")
        return cls(_operator_cost(spec.name, spec.params["cost"]), features, float(spec.params.get("time_scale", 1.0)))

    def _arrays(self, c: DeviceCost, features: Sequence[str]) -> _DeviceArrays:
        unit_s = np.array([float(c.per_unit_s.get(f, 0.0)) for f in features])
        unit_b = np.array([float(c.per_unit_bytes.get(f, 0.0)) for f in features])
        return _DeviceArrays(c.per_batch_s, c.per_item_s, unit_s, float(c.per_item_bytes), unit_b, int(c.resident_bytes), c.cold_start_s)

    def device(self, device: str) -> _DeviceArrays:
        if device not in self._devices:
            raise ValueError(f"operator {self.name!r} has no cost model for device {device!r}; it has {sorted(self._devices)}")
        return self._devices[device]

    def seconds(self, device: str, items: int, sums: np.ndarray) -> float:
        """A batch of ``items`` rows whose feature columns sum to ``sums``."""
        if items == 0:
            return 0.0
        d = self._devices[device]
        return (d.per_batch_s + d.per_item_s * items + float(sums @ d.unit_s)) * self.time_scale

    def work_bytes(self, device: str, rows: np.ndarray, sums: np.ndarray) -> int:
        d = self._devices[device]
        scale = rows[:, MEMSCALE]
        if scale.min() == 1.0 == scale.max():
            return int(d.per_item_bytes * len(rows) + float(sums @ d.unit_bytes))
        per_row = d.per_item_bytes + rows[:, FEATURES:] @ d.unit_bytes
        return int((scale * per_row).sum())

    def resident_bytes(self, device: str) -> int:
        return self.device(device).resident_bytes

    def cold_start_s(self, device: str) -> float:
        return self.device(device).cold_start_s * self.time_scale

    def features(self, sums: np.ndarray) -> dict[str, float]:
        """The operator's workload features of a batch whose feature columns sum to ``sums``."""
        return {f: float(sums[k]) for f, k in zip(self.feature_names, self._feature_idx)}

    def route(self, rows: np.ndarray, keys: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(rows passed on, rows dropped by a filter)."""
        s = self.selectivity
        # the emulator hashes (operator, id): a per-operator draw from the row's key keeps two filters independent
        u = np.modf(rows[:, KEY] * 7919.0 + self._salt)[0]
        if s < 1.0:
            keep = u < s
            return rows[keep], rows[~keep]
        if s > 1.0:
            base = int(s)
            counts = base + (u < s - base).astype(int)
            out = np.repeat(rows, counts, axis=0)
            out[:, KEY] = keys.random(len(out))
            return out, rows[:0]
        return rows, rows[:0]
