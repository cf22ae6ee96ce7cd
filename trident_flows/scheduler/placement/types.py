"""Inputs of the placement MILP.

Contract:
- ``PlacementOption``: one way to run an operator (an ``OpConfig``) with its predicted throughput
  as a concave piecewise-linear function of replicas, per-replica memory, host<->device traffic,
  cold-start and drain seconds, and optionally the node classes it may run on.
- ``OperatorDemand``: an operator's options, the work one input item creates for it, its replica
  limits. ``CurrentPlacement``: what runs now (operator -> ``ReplicaGroup``s).
- Frozen dataclasses of plain data; constructors validate and raise ``ValueError`` naming the
  operator/field and what to change. Nothing here imports PuLP.
- Units: throughput in the operator's own items per second, memory in bytes, bandwidth in bytes
  per operator item, times in seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Iterable, Mapping

from trident_flows.core.types import CPU, OpConfig, Plan, ReplicaGroup

GiB = 2**30


@dataclass(frozen=True)
class PlacementOption:
    """One candidate per-replica configuration of an operator.

    ``throughput_curve`` holds ``(replicas, items_per_s_total)`` breakpoints with strictly
    increasing replica counts; the curve starts implicitly at ``(0, 0)``, is linear between
    breakpoints and continues with the last segment's slope beyond the last one. It must be
    concave (per-replica gains never increase: diminishing returns are allowed, speed-ups
    are not), which keeps the MILP free of extra binaries. ``device_mem_bytes`` is the peak
    device memory of one replica on each device it uses; ``host_mem_bytes`` its peak host
    memory; ``bandwidth_bytes_per_item`` the host<->device bytes one item moves (accelerator
    configs only). ``node_classes`` restricts the option to those classes (``None`` = any).
    """

    config: OpConfig
    throughput_curve: tuple[tuple[int, float], ...]
    host_mem_bytes: int = 0
    device_mem_bytes: int = 0
    bandwidth_bytes_per_item: float = 0.0
    cold_start_s: float = 0.0
    drain_s: float = 0.0
    node_classes: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        curve = tuple((int(n), float(r)) for n, r in self.throughput_curve)
        object.__setattr__(self, "throughput_curve", curve)
        where = f"option {self.config.label()}"
        if not curve:
            raise ValueError(f"{where}: throughput_curve is empty; give at least one (replicas, items_per_s) point")
        prev_n, prev_r, prev_slope = 0, 0.0, math.inf
        for n, r in curve:
            if n <= prev_n:
                raise ValueError(f"{where}: throughput_curve replicas must be strictly increasing integers >= 1, got {[p[0] for p in curve]}")
            if not (math.isfinite(r) and r >= prev_r):
                raise ValueError(f"{where}: throughput_curve rates must be finite and non-decreasing, got {[p[1] for p in curve]}")
            slope = (r - prev_r) / (n - prev_n)
            if slope > prev_slope * (1 + 1e-9) + 1e-12:
                raise ValueError(f"{where}: throughput_curve must be concave (per-replica gain may not grow); segment ending at "
                                 f"{n} replicas has slope {slope:.4g} > {prev_slope:.4g}")
            prev_n, prev_r, prev_slope = n, r, slope
        if curve[0][1] <= 0:
            raise ValueError(f"{where}: throughput at {curve[0][0]} replica(s) must be > 0")
        for name in ("host_mem_bytes", "device_mem_bytes", "bandwidth_bytes_per_item", "cold_start_s", "drain_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{where}: {name} must be a finite number >= 0, got {value!r}")
        if self.config.device == CPU and (self.device_mem_bytes or self.bandwidth_bytes_per_item):
            raise ValueError(f"{where}: a cpu config cannot have device_mem_bytes or bandwidth_bytes_per_item; set them to 0")
        if self.node_classes is not None:
            object.__setattr__(self, "node_classes", tuple(self.node_classes))

    @classmethod
    def from_rate(cls, config: OpConfig, items_per_s: float, max_replicas: int = 1024, contention: float = 0.0,
                  **fields: object) -> "PlacementOption":
        """An option whose total rate is ``items_per_s * n / (1 + contention * (n - 1))``.

        ``contention`` in [0, 1] models diminishing returns (0 = linear scaling). Breakpoints
        are placed at 1, 2, 4, ... up to ``max_replicas``; interpolating a concave function
        between them under-estimates it, so the plan never over-promises.
        """
        if not (0.0 <= contention <= 1.0):
            raise ValueError(f"option {config.label()}: contention must be within [0, 1], got {contention}")
        if items_per_s <= 0 or max_replicas < 1:
            raise ValueError(f"option {config.label()}: needs items_per_s > 0 and max_replicas >= 1")
        points, n = [], 1
        while True:
            points.append((n, items_per_s * n / (1.0 + contention * (n - 1))))
            if n >= max_replicas or contention == 0.0:
                break
            n = min(2 * n, max_replicas)
        return cls(config=config, throughput_curve=tuple(points), **fields)  # type: ignore[arg-type]

    @property
    def rate_per_replica(self) -> float:
        """Items/s of a single replica (the steepest slope of the curve)."""
        n, r = self.throughput_curve[0]
        return r / n

    @cached_property
    def _lines(self) -> tuple[tuple[float, float], ...]:
        lines, prev_n, prev_r = [], 0, 0.0
        for n, r in self.throughput_curve:
            slope = (r - prev_r) / (n - prev_n)
            lines.append((prev_r - slope * prev_n, slope))
            prev_n, prev_r = n, r
        return tuple(lines)

    def segments(self) -> tuple[tuple[float, float], ...]:
        """The curve as lines ``(intercept, slope)``; the curve is their pointwise minimum."""
        return self._lines

    def rate_at(self, replicas: float) -> float:
        """Total items/s of ``replicas`` replicas (0 for none)."""
        if replicas <= 0:
            return 0.0
        return min(a + s * replicas for a, s in self._lines)


@dataclass(frozen=True)
class OperatorDemand:
    """One operator of the pipeline as the placement sees it.

    ``work_per_item``: items of this operator one pipeline input item creates (e.g. 40
    chunks per document for the embedder; 1.0 for a one-to-one stage). ``node_classes``
    restricts every option to those classes (``None`` = any). ``input_bytes_per_item``: bytes
    of stored batches one item of this operator reads from the replicas of the operator before
    it in the pipeline (the demands are given in pipeline order; measured by
    ``scheduler.transfer.transfer_estimate``); 0 = not known, its traffic is not counted
    against the nodes' network links.
    """

    name: str
    work_per_item: float
    options: tuple[PlacementOption, ...]
    min_replicas: int = 1
    max_replicas: int | None = None
    node_classes: tuple[str, ...] | None = None
    input_bytes_per_item: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", tuple(self.options))
        if not self.name:
            raise ValueError("OperatorDemand.name is empty")
        if not (math.isfinite(self.work_per_item) and self.work_per_item > 0):
            raise ValueError(f"operator {self.name!r}: work_per_item must be a finite number > 0, got {self.work_per_item!r}")
        if not self.options:
            raise ValueError(f"operator {self.name!r}: options is empty; give at least one PlacementOption")
        if self.min_replicas < 1:
            raise ValueError(f"operator {self.name!r}: min_replicas must be >= 1 (every operator needs a replica), got {self.min_replicas}")
        if self.max_replicas is not None and self.max_replicas < self.min_replicas:
            raise ValueError(f"operator {self.name!r}: max_replicas={self.max_replicas} < min_replicas={self.min_replicas}")
        if self.node_classes is not None:
            object.__setattr__(self, "node_classes", tuple(self.node_classes))
        if not (math.isfinite(self.input_bytes_per_item) and self.input_bytes_per_item >= 0):
            raise ValueError(f"operator {self.name!r}: input_bytes_per_item must be a finite number >= 0 (0: not known), "
                             f"got {self.input_bytes_per_item!r}")

    def allows(self, option: PlacementOption, node_class: str) -> bool:
        """Whether the operator and the option both allow ``node_class``."""
        return ((self.node_classes is None or node_class in self.node_classes)
                and (option.node_classes is None or node_class in option.node_classes))

    def option_index(self, config: OpConfig) -> int | None:
        """The option running ``config``: an exact match, or the same config with its GPU
        fraction raised by the placement (see ``placement.model.effective_gpus``)."""
        for i, opt in enumerate(self.options):
            if opt.config == config:
                return i
        for i, opt in enumerate(self.options):  # only a GPU option's fraction is raised (a cpu config cannot hold GPUs)
            if opt.config.gpus > 0 and config.gpus >= opt.config.gpus and opt.config.with_changes(gpus=config.gpus) == config:
                return i
        return None


@dataclass(frozen=True)
class CurrentPlacement:
    """What runs now: for each operator, its ``ReplicaGroup``s (a group's ``node_class``
    ``None`` means "not known"; it is then counted on the first class the option may use)."""

    groups: tuple[tuple[str, tuple[ReplicaGroup, ...]], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "groups", tuple((str(op), tuple(gs)) for op, gs in self.groups))
        names = [op for op, _ in self.groups]
        if len(set(names)) != len(names):
            raise ValueError(f"CurrentPlacement lists an operator twice: {names}")

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Iterable[ReplicaGroup]]) -> "CurrentPlacement":
        return cls(tuple((op, tuple(gs)) for op, gs in mapping.items()))

    @classmethod
    def from_plan(cls, plan: Plan) -> "CurrentPlacement":
        return cls(tuple((o.operator, o.groups) for o in plan.operators))

    def for_operator(self, name: str) -> tuple[ReplicaGroup, ...]:
        for op, groups in self.groups:
            if op == name:
                return groups
        return ()

    @property
    def operators(self) -> tuple[str, ...]:
        return tuple(op for op, _ in self.groups)
