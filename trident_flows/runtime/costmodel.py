"""Calibrated cost models of operators, the data behind emulated operators (see docs/architecture.md).

Contract:
- A ``PipelineProfile`` is what ``trident-flows profile NAME`` measures on the real
  operators and writes to ``trident_flows/pipelines/profiles/NAME.json``; emulated
  pipelines load it with ``PipelineProfile.load(NAME)``. Nothing here is invented:
  every number in a committed profile comes from a measurement.
- Cost of one batch on one device is linear in the batch's workload features:
      seconds = per_batch_s + per_item_s * items + sum_f per_unit_s[f] * features[f]
      memory  = resident_bytes + per_item_bytes * items + sum_f per_unit_bytes[f] * features[f]
                + sum_f reused_unit_bytes[f] * largest[f]
  (``resident_bytes`` is what a replica holds once warm, e.g. model weights; the rest is
  the working set of one batch). ``features`` are summed over the items of the batch;
  ``largest`` are the features of its item with the largest ``reused_unit_bytes`` term: a
  working set the operator needs for one item at a time and reuses for the next (a decoder's
  frame buffers at the source's frame size), so a batch holds it once, for its largest item.
  Without per-item features (a planner's mean item), ``largest`` is the mean item.
- ``cold_start_s`` is the time ``__init__`` takes (loading models) on that device.
- ``selectivity`` is items out per item in (a filter < 1, a splitter > 1).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

PROFILE_DIR = Path(__file__).resolve().parent.parent / "pipelines" / "profiles"


@dataclass(frozen=True)
class DeviceCost:
    """Cost of an operator's batch on one device kind (see the module docstring for the formula)."""

    per_batch_s: float = 0.0
    per_item_s: float = 0.0
    per_unit_s: Mapping[str, float] = field(default_factory=dict)
    resident_bytes: int = 0
    per_item_bytes: int = 0
    per_unit_bytes: Mapping[str, float] = field(default_factory=dict)
    cold_start_s: float = 0.0
    reused_unit_bytes: Mapping[str, float] = field(default_factory=dict)

    def seconds(self, items: int, features: Mapping[str, float]) -> float:
        return self.per_batch_s + self.per_item_s * items + sum(c * float(features.get(f, 0.0)) for f, c in self.per_unit_s.items())

    def reused_bytes(self, item: Mapping[str, float]) -> float:
        """The working set one item of these features needs that the batch's next item reuses."""
        return sum(c * float(item.get(f, 0.0)) for f, c in self.reused_unit_bytes.items())

    def batch_bytes(self, items: int, features: Mapping[str, float], largest: Mapping[str, float] | None = None) -> int:
        """Working-set bytes of one batch, on top of ``resident_bytes``; ``largest``: the features of the item with the
        largest reused working set (default: the mean item, ``features / items``)."""
        if largest is None:
            largest = {f: float(features.get(f, 0.0)) / items for f in self.reused_unit_bytes} if items else {}
        return int(self.per_item_bytes * items + sum(c * float(features.get(f, 0.0)) for f, c in self.per_unit_bytes.items())
                   + self.reused_bytes(largest))

    def peak_bytes(self, items: int, features: Mapping[str, float], largest: Mapping[str, float] | None = None) -> int:
        return self.resident_bytes + self.batch_bytes(items, features, largest)

    def feature_names(self) -> tuple[str, ...]:
        """Every workload feature this cost reads, in order of first mention."""
        return tuple(dict.fromkeys((*self.per_unit_s, *self.per_unit_bytes, *self.reused_unit_bytes)))


@dataclass(frozen=True)
class OperatorCost:
    name: str
    devices: Mapping[str, DeviceCost]
    selectivity: float = 1.0
    features: tuple[str, ...] = ()
    notes: str = ""

    def device(self, device: str) -> DeviceCost:
        if device not in self.devices:
            raise ValueError(f"operator {self.name!r} has no cost model for device {device!r}; it has {sorted(self.devices)}")
        return self.devices[device]


@dataclass(frozen=True)
class PipelineProfile:
    """Cost models of every operator of one pipeline, with where and how they were measured."""

    name: str
    operators: tuple[OperatorCost, ...]
    measured_on: Mapping[str, Any] = field(default_factory=dict)
    workloads: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    def operator(self, name: str) -> OperatorCost:
        for op in self.operators:
            if op.name == name:
                return op
        raise KeyError(f"profile {self.name!r} has no operator {name!r}; it has {[o.name for o in self.operators]}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "measured_on": dict(self.measured_on),
            "workloads": {k: dict(v) for k, v in self.workloads.items()},
            "operators": [
                {"name": o.name, "selectivity": o.selectivity, "features": list(o.features), "notes": o.notes,
                 "devices": {d: {**asdict(c), "per_unit_s": dict(c.per_unit_s), "per_unit_bytes": dict(c.per_unit_bytes),
                                 "reused_unit_bytes": dict(c.reused_unit_bytes)} for d, c in o.devices.items()}}
                for o in self.operators
            ],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "PipelineProfile":
        ops = tuple(
            OperatorCost(o["name"], {d: DeviceCost(**c) for d, c in o["devices"].items()}, float(o.get("selectivity", 1.0)),
                         tuple(o.get("features", ())), o.get("notes", ""))
            for o in data["operators"]
        )
        return cls(data["name"], ops, dict(data.get("measured_on", {})), {k: dict(v) for k, v in data.get("workloads", {}).items()})

    def save(self, path: Path | None = None) -> Path:
        path = path or PROFILE_DIR / f"{self.name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, name_or_path: str | Path) -> "PipelineProfile":
        path = Path(name_or_path)
        if not path.suffix:
            path = PROFILE_DIR / f"{name_or_path}.json"
        if not path.exists():
            raise FileNotFoundError(f"no cost-model profile at {path}; write it with `trident-flows profile {Path(name_or_path).stem}`")
        return cls.from_dict(json.loads(path.read_text()))
