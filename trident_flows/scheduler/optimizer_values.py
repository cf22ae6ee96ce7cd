"""What the config optimiser works with: its objective, what it is told, what it proposes.

Contract:
- ``objective(config, throughput, gpu_weight)``: items/s of one replica per unit of resource cost,
  ``resource_cost = cpus + gpu_weight * gpus`` (``DEFAULT_GPU_WEIGHT`` 4: one accelerator costs as much
  as four CPUs); the optimiser maximises it.
- ``Observation``: one evaluated config (items/s per replica, peak memory, per-item features, OOM or
  not, resident memory and item count when known), with ``to_dict`` / ``from_dict`` for run memory.
- ``Proposal``: a config to try on a canary, what the models expect of it, its kind (seed, expand,
  exploit) and reason. ``Rollback``: after an OOM, the config to go back to.
- ``NoSafeConfigError``: no configuration of the operator fits its memory budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from trident_flows.core.types import OpConfig

DEFAULT_GPU_WEIGHT = 4.0


def resource_cost(config: OpConfig, gpu_weight: float = DEFAULT_GPU_WEIGHT) -> float:
    """The resource cost of one replica: ``cpus + gpu_weight * gpus``."""
    return config.cpus + gpu_weight * config.gpus


def objective(config: OpConfig, throughput: float, gpu_weight: float = DEFAULT_GPU_WEIGHT) -> float:
    """Items/s of one replica per unit of resource cost (what the optimiser maximises)."""
    return throughput / resource_cost(config, gpu_weight)


class NoSafeConfigError(RuntimeError):
    """No configuration of the operator fits its memory budget."""


@dataclass(frozen=True)
class Observation:
    """One evaluated config: items/s per replica, peak memory in bytes (host memory for CPU
    replicas, device memory for accelerator replicas), per-item workload features, and whether
    it ran out of memory (then ``throughput`` is 0 and ``peak_memory`` the budget it exceeded);
    ``resident_memory``: bytes the warm replica held before its first batch, when known;
    ``items``: how many items ``features`` were averaged over, when known."""

    config: OpConfig
    throughput: float
    peak_memory: float
    features: Mapping[str, float] = field(default_factory=dict)
    oom: bool = False
    resident_memory: float | None = None
    items: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config.to_dict(), "throughput": self.throughput, "peak_memory": self.peak_memory,
                "features": dict(self.features), "oom": self.oom, "resident_memory": self.resident_memory, "items": self.items}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Observation":
        return cls(OpConfig.from_dict(data["config"]), float(data["throughput"]), float(data["peak_memory"]),
                   dict(data.get("features", {})), bool(data.get("oom", False)),
                   None if data.get("resident_memory") is None else float(data["resident_memory"]),
                   None if data.get("items") is None else int(data["items"]))


@dataclass(frozen=True)
class Proposal:
    """A config to try on a canary replica, with what the models expect of it and why it was chosen.
    ``predicted_throughput`` (items/s per replica) is ``nan`` before any measurement;
    ``memory_upper_bound`` is ``inf`` for a seed on a device with no memory measurement yet.
    ``kind``: "seed" (first config of a device), "expand" (a larger batch than any safe one near it)
    or "exploit" (inside the measured safe region)."""

    config: OpConfig
    predicted_throughput: float
    memory_upper_bound: float
    memory_limit: float
    kind: str
    reason: str


@dataclass(frozen=True)
class Rollback:
    """After an OOM: go back to ``to`` (``None``: no safe config is known yet; stop the canary and
    keep the running replicas as they are). ``failed`` is the config that ran out of memory."""

    to: OpConfig | None
    failed: OpConfig
    reason: str
