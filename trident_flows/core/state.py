"""Plain-data values the runner speaks: its settings, a snapshot of its state, apply reports.

Contract:
- Frozen dataclasses, picklable and JSON-serialisable (``to_dict``), with no Ray import,
  so the scheduler (pure Python) and the Prefect layer can read them anywhere.
- ``RunnerSettings`` validates itself; a bad value raises ``RuntimeConfigError`` (a
  ``ValueError``) naming the setting and what to change.
- ``RunnerState`` is what ``PipelineRunner.state()`` returns: per operator its replicas
  (id, config, warm, draining, canary, in-flight batches, busy fraction), its input queue
  (items, bytes), items processed and ``config_epoch``; per pipeline the item counts,
  whether it finished, wall time, throughput and the cluster's resources.
- ``NodeState`` is one live Ray node as the runner last read it (``ray.nodes()``, refreshed
  every second): its id, its node class (identical nodes share one) and resources.
  ``RunnerState.nodes`` lists them and each ``ReplicaState`` names the node it runs on.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any

from trident_flows.core.types import OpConfig


class RuntimeConfigError(ValueError):
    """A setting, pipeline or plan the runtime refuses before starting anything."""


@dataclass(frozen=True)
class RunnerSettings:
    """How the runner streams.

    - ``max_inflight_per_replica``: batches sent to one replica and not yet returned.
    - ``queue_max_items`` / ``queue_max_bytes``: bound of each operator's input queue
      (backpressure: upstream stops sending work when the downstream queue is full).
    - ``max_attempts``: attempts of a single item before it goes to the dead-letter table.
    - ``shard_items``: items per implicit shard when the input is a PipelineSpec source.
    - ``linger_s``: how long a partial batch waits for more items before it is sent anyway.
    - ``warm_timeout_s``: how long a starting replica may take to become warm.
    - ``device_memory_bytes``: capacity of each emulated device (one per logical GPU).
    - ``sample_buffer``: how many BatchSamples the runner keeps for ``samples()``.
    - ``dip_window_s``: the window before an apply whose throughput the dip is measured against.
    """

    max_inflight_per_replica: int = 2
    queue_max_items: int = 512
    queue_max_bytes: int = 64 * 2**20
    max_attempts: int = 3
    shard_items: int = 256
    linger_s: float = 0.05
    warm_timeout_s: float = 300.0
    device_memory_bytes: int = 16 * 2**30
    sample_buffer: int = 10000
    dip_window_s: float = 10.0

    def __post_init__(self) -> None:
        ints = {"max_inflight_per_replica": 1, "queue_max_items": 1, "queue_max_bytes": 1, "max_attempts": 1, "shard_items": 1,
                "device_memory_bytes": 1, "sample_buffer": 1}
        for name, low in ints.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise RuntimeConfigError(f"RunnerSettings.{name} must be an integer >= {low}, got {value!r}")
        for name in ("linger_s", "warm_timeout_s", "dip_window_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise RuntimeConfigError(f"RunnerSettings.{name} must be a finite number >= 0, got {value!r}")
        if self.warm_timeout_s <= 0:
            raise RuntimeConfigError("RunnerSettings.warm_timeout_s must be > 0")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ReplicaState:
    """One replica: ``busy_fraction`` is busy seconds / seconds alive (since warm); ``cold_start_s``
    how long its cold start took, from the request to warm: scheduling, process start and the
    operator's constructor (0 until it is warm)."""

    replica_id: str
    actor_name: str
    config: OpConfig
    warm: bool
    draining: bool
    canary: bool
    inflight: int
    busy_fraction: float
    batches: int
    config_epoch: int
    cold_start_s: float = 0.0
    node_id: str = ""      # the Ray node it runs on ("" until known: not pinned and not yet warm)
    node_class: str = ""   # that node's class (``NodeState.node_class``)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["config"] = self.config.to_dict()
        return data


@dataclass(frozen=True)
class NodeState:
    """One live Ray node. ``node_class`` is the same for nodes of identical CPUs, GPUs, accelerator
    type, custom resources and memory (whole GiB); ``gpu_memory_bytes`` is the memory of one of its
    GPUs (the emulated devices' capacity; 0 without GPUs). ``resources`` are its custom resources;
    ``nic_bandwidth_bps`` its network link in bytes/s each way, as its ``trident.nic`` label declares
    it (Ray does not measure it; 0 = not declared)."""

    node_id: str
    node_class: str
    cpus: float
    gpus: float
    memory_bytes: int
    gpu_memory_bytes: int = 0
    accelerator: str = ""
    resources: tuple[tuple[str, float], ...] = ()
    is_head: bool = False
    nic_bandwidth_bps: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["resources"] = dict(self.resources)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "NodeState":
        return cls(**{**data, "resources": tuple(sorted(dict(data.get("resources", {})).items()))})


@dataclass(frozen=True)
class OperatorState:
    """One operator's pool and input queue. ``items_in`` counts items sent to replicas and
    completed; ``items_out`` rows it returned (after splitting/filter marks); ``items_forwarded``
    the rows it passed on to the next operator (not filtered, not failed; 0 for the last one)."""

    name: str
    replicas: tuple[ReplicaState, ...]
    queue_items: int
    queue_bytes: int
    items_in: int
    items_out: int
    config_epoch: int
    busy_fraction: float
    errors: int
    ooms: int
    items_forwarded: int = 0

    @property
    def active(self) -> tuple[ReplicaState, ...]:
        """Replicas that take new batches or will soon (not draining, canaries included)."""
        return tuple(r for r in self.replicas if not r.draining)

    def configs(self, include_canary: bool = False) -> dict[OpConfig, int]:
        """Replica count per config among non-draining replicas."""
        counts: dict[OpConfig, int] = {}
        for r in self.active:
            if r.canary and not include_canary:
                continue
            counts[r.config] = counts.get(r.config, 0) + 1
        return counts

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if k != "replicas"}
        data["replicas"] = [r.to_dict() for r in self.replicas]
        return data


@dataclass(frozen=True)
class RunnerState:
    """A snapshot of a running (or finished) pipeline."""

    pipeline: str
    operators: tuple[OperatorState, ...]
    items_in: int
    items_written: int
    items_dead_lettered: int
    items_dropped: int
    rows_written: int
    input_closed: bool
    finished: bool
    wall_s: float
    throughput: float
    cluster_cpus: float
    cluster_gpus: float
    reconfigurations: int
    ooms: int
    error: str = ""
    nodes: tuple[NodeState, ...] = ()  # the live Ray nodes (empty where the runner does not read them, e.g. the simulator)

    def operator(self, name: str) -> OperatorState:
        for op in self.operators:
            if op.name == name:
                return op
        raise KeyError(f"no operator {name!r}; operators are {[o.name for o in self.operators]}")

    @property
    def used_cpus(self) -> float:
        return sum(r.config.cpus for o in self.operators for r in o.replicas)

    @property
    def used_gpus(self) -> float:
        return sum(r.config.gpus for o in self.operators for r in o.replicas)

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if k not in ("operators", "nodes")}
        data["operators"] = [o.to_dict() for o in self.operators]
        data["nodes"] = [n.to_dict() for n in self.nodes]
        return data


@dataclass(frozen=True)
class ApplyReport:
    """What ``apply`` did: the steps done (as dicts), seconds it took, and the throughput dip:
    completed input items/s during the apply against the ``dip_window_s`` before it;
    ``dip`` = max(0, 1 - during/before). ``started_at``: the wall-clock time (``time.time()``) its
    first step began, so it ran over [started_at, started_at + seconds] (0 where no step ran or
    the clock is simulated)."""

    steps_done: tuple[dict[str, Any], ...]
    seconds: float
    throughput_before: float
    throughput_during: float
    dip: float
    ok: bool = True
    error: str = ""
    reason: str = ""
    steps_total: int = 0
    started_at: float = 0.0

    @property
    def outcome(self) -> "ApplyOutcome":
        return ApplyOutcome.from_report(self)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["steps_done"] = list(self.steps_done)
        data["outcome"] = self.outcome.to_dict()
        return data


class ApplyStatus(str, Enum):
    """How an apply ended: every step done, some done before one failed, or nothing done."""

    LANDED = "landed"
    PARTIAL = "partial"
    REFUSED = "refused"


@dataclass(frozen=True)
class ApplyOutcome:
    """The outcome of applying one plan, returned to the policy that issued it (a simulator
    returns the same value): ``status``, steps done of ``steps_total``, and why it did not land."""

    status: ApplyStatus
    steps_done: int = 0
    steps_total: int = 0
    reason: str = ""

    @classmethod
    def landed(cls, steps: int, reason: str = "") -> "ApplyOutcome":
        return cls(ApplyStatus.LANDED, steps, steps, reason)

    @classmethod
    def partial(cls, done: int, total: int, reason: str) -> "ApplyOutcome":
        return cls(ApplyStatus.PARTIAL, done, total, reason)

    @classmethod
    def refused(cls, reason: str, total: int = 0) -> "ApplyOutcome":
        return cls(ApplyStatus.REFUSED, 0, total, reason)

    @classmethod
    def from_report(cls, report: "ApplyReport") -> "ApplyOutcome":
        done = len(report.steps_done)
        if report.ok:
            return cls.landed(done, report.reason)
        if done:
            return cls.partial(done, max(done, report.steps_total), report.error)
        return cls.refused(report.error, report.steps_total)

    @property
    def changed(self) -> bool:
        """Whether replicas changed (a landed plan with steps, or a partly landed one)."""
        return self.steps_done > 0

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status.value, "steps_done": self.steps_done, "steps_total": self.steps_total, "reason": self.reason}


@dataclass(frozen=True)
class ShardStatus:
    """Progress of one input shard; ``done`` once every row is written or dead-lettered and the
    shard's partition is committed."""

    shard_id: str
    items_in: int
    items_written: int
    items_dead_lettered: int
    items_dropped: int
    pending: int
    closed: bool
    done: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SamplePage:
    """``samples`` with sequence numbers in (since, next]; pass ``next`` as ``since`` next time."""

    samples: tuple[Any, ...]  # tuple[BatchSample, ...]
    next: int
