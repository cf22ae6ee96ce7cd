"""What one batch of a simulated operator costs: the emulated operator's cost model on rows.

Contract: ``SimOperator.from_spec(op_spec, features)`` reads an emulated operator's
``OperatorSpec`` (its cost model and ``time_scale``, exactly what ``EmulatedOperator`` runs);
for a batch of ``workload`` rows (``sums``: its feature columns summed) and a device, ``cost`` is
(seconds, working-set bytes): seconds ``per_batch_s + per_item_s * items + sum_f per_unit_s[f] *
sum(feature f)`` times the time scale (0 for an empty batch), bytes with each row scaled by its
``memory_scale`` (``uniform``: every scale is 1) and the reused working set (``reused_unit_bytes``)
of the largest row once; ``features`` the per-batch feature sums a
``BatchSample`` carries, and ``route`` what leaves the operator, decided by the row's id as the
emulated operator decides it (``sim.ids``): rows a filter drops (``unit >= selectivity``) and,
for a splitter, each kept row repeated ``int(s)`` or ``int(s) + 1`` times as children
``{id}/{k}``. Cold start on a device is the model's ``cold_start_s`` times the time scale.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from trident_flows.runtime.costmodel import DeviceCost, OperatorCost
from trident_flows.runtime.spec import OperatorSpec
from trident_flows.sim.ids import Hasher, child_ids
from trident_flows.sim.workload import FEATURES, ID_CRC, ID_LEN, MEMSCALE


@dataclass(frozen=True)
class _DeviceArrays:
    per_batch_s: float
    per_item_s: float
    per_item_bytes: float
    unit: np.ndarray        # (features, 3): seconds, bytes and reused bytes per unit of each pipeline feature column
    reuses: bool            # any reused bytes
    resident_bytes: int
    cold_start_s: float


class SimOperator:
    def __init__(self, cost: OperatorCost, features: Sequence[str], time_scale: float = 1.0) -> None:
        self.name = cost.name
        self.cost = cost
        self.time_scale = float(time_scale)
        self.selectivity = cost.selectivity
        self._hasher = Hasher(cost.name)
        names = tuple(cost.features) or tuple(sorted({f for d in cost.devices.values() for f in d.feature_names()}))
        self.feature_names = tuple(f for f in names if f in features)
        self._feature_idx = np.array([list(features).index(f) for f in self.feature_names], dtype=np.intp)
        self._devices = {d: self._arrays(c, features) for d, c in cost.devices.items()}

    @classmethod
    def from_spec(cls, spec: OperatorSpec, features: Sequence[str]) -> "SimOperator":
        from trident_flows.pipelines.emulated import EmulatedOperator, _operator_cost

        if spec.cls is not EmulatedOperator or "cost" not in spec.params:
            raise ValueError(f"operator {spec.name!r} is not an emulated operator with a cost model; the simulator runs "
                             "emulated pipelines (emulated-docs, emulated-video)")
        return cls(_operator_cost(spec.name, spec.params["cost"]), features, float(spec.params.get("time_scale", 1.0)))

    def _arrays(self, c: DeviceCost, features: Sequence[str]) -> _DeviceArrays:
        unit = np.array([[float(c.per_unit_s.get(f, 0.0)), float(c.per_unit_bytes.get(f, 0.0)), float(c.reused_unit_bytes.get(f, 0.0))]
                         for f in features]).reshape(-1, 3)
        return _DeviceArrays(c.per_batch_s, c.per_item_s, float(c.per_item_bytes), unit, bool(unit[:, 2].any()), int(c.resident_bytes),
                             c.cold_start_s)

    def device(self, device: str) -> _DeviceArrays:
        if device not in self._devices:
            raise ValueError(f"operator {self.name!r} has no cost model for device {device!r}; it has {sorted(self._devices)}")
        return self._devices[device]

    def batch_cost(self, device: str, rows: np.ndarray, sums: np.ndarray, uniform: bool) -> tuple[float, int]:
        """(seconds, working-set bytes) of a batch of ``rows`` whose feature columns sum to ``sums``."""
        n = len(rows)
        if n == 0:
            return 0.0, 0
        d = self._devices[device]
        per_s, per_b, _ = (sums @ d.unit).tolist()
        seconds = (d.per_batch_s + d.per_item_s * n + per_s) * self.time_scale
        reused = rows[:, FEATURES:] @ d.unit[:, 2] if d.reuses else None
        if uniform:
            return seconds, int(d.per_item_bytes * n + per_b + (float(reused.max()) if reused is not None else 0.0))
        per_row = d.per_item_bytes + rows[:, FEATURES:] @ d.unit[:, 1]
        largest = float((rows[:, MEMSCALE] * reused).max()) if reused is not None else 0.0
        return seconds, int((rows[:, MEMSCALE] * per_row).sum() + largest)

    def resident_bytes(self, device: str) -> int:
        return self.device(device).resident_bytes

    def cold_start_s(self, device: str) -> float:
        return self.device(device).cold_start_s * self.time_scale

    def features(self, sums: np.ndarray) -> dict[str, float]:
        """The operator's workload features of a batch whose feature columns sum to ``sums``."""
        return dict(zip(self.feature_names, sums[self._feature_idx].tolist()))

    def route(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(rows passed on, rows dropped by a filter)."""
        s = self.selectivity
        if s == 1.0:
            return rows, rows[:0]
        u = self._hasher.unit(rows[:, ID_CRC], rows[:, ID_LEN])
        if s < 1.0:
            keep = u < s
            return rows[keep], rows[~keep]
        base = int(s)
        counts = base + (u < s - base)
        out = np.repeat(rows, counts, axis=0)
        child = np.arange(len(out)) - np.repeat(np.cumsum(counts) - counts, counts)  # k of each child {id}/{k}
        for k in np.unique(child).tolist():
            at = child == k
            out[at, ID_CRC], out[at, ID_LEN] = child_ids(out[at, ID_CRC], out[at, ID_LEN], k)
        return out, rows[:0]
