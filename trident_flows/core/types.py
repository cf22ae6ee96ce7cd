"""Core value types shared by every layer.

Contract:
- Every type here is a frozen dataclass of plain data: picklable (it crosses Ray
  process boundaries) and JSON-serialisable through ``to_dict`` / ``from_dict``.
- Nothing here imports Ray, Prefect, scikit-learn or PuLP; the runtime, the scheduler
  and the Prefect layer all speak these types.
- Constructors validate their fields and raise ``ValueError`` with a message that
  names the field and says what to change.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from typing import Any, Iterable, Mapping

KnobValue = int | float | str | bool

CPU = "cpu"
GPU = "gpu"


def _freeze_knobs(knobs: Mapping[str, KnobValue] | Iterable[tuple[str, KnobValue]] | None) -> tuple[tuple[str, KnobValue], ...]:
    if knobs is None:
        return ()
    items = knobs.items() if isinstance(knobs, Mapping) else knobs
    frozen = tuple(sorted((str(k), v) for k, v in items))
    for name, value in frozen:
        if not isinstance(value, (int, float, str, bool)):
            raise ValueError(f"knob {name!r} has value {value!r}: knob values must be int, float, str or bool")
    return frozen


@dataclass(frozen=True)
class OpConfig:
    """The per-replica knobs of one operator.

    ``device`` is ``"cpu"`` or an accelerator kind (``"gpu"``); ``cpus`` and ``gpus`` are
    the Ray resources one replica holds (``gpus`` may be fractional); ``knobs`` holds
    operator-specific settings (threads, frames per second, ...) as sorted pairs so the
    config is hashable. Build one with ``OpConfig.make(device="gpu", batch_size=16, fps=2)``.
    """

    device: str = CPU
    batch_size: int = 1
    cpus: float = 1.0
    gpus: float = 0.0
    knobs: tuple[tuple[str, KnobValue], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "knobs", _freeze_knobs(self.knobs))
        if not isinstance(self.batch_size, int) or isinstance(self.batch_size, bool) or self.batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {self.batch_size!r}")
        if not (self.cpus >= 0 and math.isfinite(self.cpus)):
            raise ValueError(f"cpus must be a finite number >= 0, got {self.cpus!r}")
        if not (self.gpus >= 0 and math.isfinite(self.gpus)):
            raise ValueError(f"gpus must be a finite number >= 0, got {self.gpus!r}")
        if self.device == CPU and self.gpus > 0:
            raise ValueError(f"a device='cpu' config cannot hold gpus={self.gpus}; set gpus=0 or device='gpu'")
        if self.device != CPU and self.gpus <= 0:
            raise ValueError(f"device={self.device!r} needs gpus > 0 (a fraction such as 0.5 is allowed)")
        if self.cpus == 0 and self.gpus == 0:
            raise ValueError("a replica must hold some resource: set cpus > 0 or gpus > 0")

    def __hash__(self) -> int:
        # Configs key many dicts in the scheduler's hot loops (thousands of lookups per model fit):
        # compute the hash once. It is left out of the pickled state (``__getstate__``) because
        # string hashes differ between processes.
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash((self.device, self.batch_size, self.cpus, self.gpus, self.knobs))
            object.__setattr__(self, "_hash", cached)
        return cached

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    @classmethod
    def make(cls, device: str = CPU, batch_size: int = 1, cpus: float = 1.0, gpus: float | None = None, **knobs: KnobValue) -> "OpConfig":
        """Convenience constructor: ``gpus`` defaults to 1 for an accelerator device, 0 for cpu."""
        if gpus is None:
            gpus = 0.0 if device == CPU else 1.0
        return cls(device=device, batch_size=batch_size, cpus=cpus, gpus=gpus, knobs=_freeze_knobs(knobs))

    @property
    def knob_dict(self) -> dict[str, KnobValue]:
        return dict(self.knobs)

    def knob(self, name: str, default: KnobValue | None = None) -> KnobValue | None:
        return self.knob_dict.get(name, default)

    def with_changes(self, **changes: Any) -> "OpConfig":
        """A copy with fields changed; unknown names are treated as knobs."""
        fields = {k: changes.pop(k) for k in ("device", "batch_size", "cpus", "gpus") if k in changes}
        knobs = self.knob_dict
        knobs.update(changes)
        return replace(self, **fields, knobs=_freeze_knobs(knobs))

    def label(self) -> str:
        """Short human-readable form, e.g. ``gpu/b32/fps=2``."""
        parts = [self.device, f"b{self.batch_size}"] + [f"{k}={v}" for k, v in self.knobs]
        return "/".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "batch_size": self.batch_size, "cpus": self.cpus, "gpus": self.gpus, "knobs": dict(self.knobs)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "OpConfig":
        return cls(device=data.get("device", CPU), batch_size=int(data.get("batch_size", 1)), cpus=float(data.get("cpus", 1.0)),
                   gpus=float(data.get("gpus", 0.0)), knobs=_freeze_knobs(data.get("knobs")))


class Outcome(str, Enum):
    """How a batch ended on a replica."""

    OK = "ok"
    ERROR = "error"
    OOM = "oom"


@dataclass(frozen=True)
class BatchSample:
    """One processed batch, as observed on the replica that ran it.

    Times are wall-clock seconds since the epoch (``time.time()``); ``busy_s`` is the time
    the replica spent on this batch (excluding queueing). ``features`` are the workload
    features of the batch summed over its items (e.g. ``{"pages": 31, "scanned_pages": 4}``);
    ``config_epoch`` increases each time the operator's configuration changes, so the
    observation layer can tell samples taken under an old configuration apart.
    ``inflight`` is how many batches the replica held (queued or running) when this one started.
    ``bytes_read``: bytes of the stored batches (whole objects) the replica read, wherever they were
    (0 for rows the runner sent by value: the first operator's source rows);
    ``bytes_from_other_nodes``: the part of ``bytes_read`` that came from another node's object store;
    ``runner_bytes``: bytes the runner serialised for this batch (what it sent and got back).
    """

    operator: str
    replica_id: str
    config: OpConfig
    start: float
    end: float
    busy_s: float
    items_in: int
    items_out: int
    features: Mapping[str, float] = field(default_factory=dict)
    peak_host_mem_bytes: int = 0
    peak_device_mem_bytes: int = 0
    outcome: Outcome = Outcome.OK
    config_epoch: int = 0
    inflight: int = 1
    error: str = ""
    bytes_from_other_nodes: int = 0
    runner_bytes: int = 0
    bytes_read: int = 0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["config"] = self.config.to_dict()
        data["features"] = dict(self.features)
        data["outcome"] = self.outcome.value
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "BatchSample":
        fields = dict(data)
        fields["config"] = OpConfig.from_dict(fields["config"])
        fields["outcome"] = Outcome(fields.get("outcome", "ok"))
        fields["features"] = dict(fields.get("features", {}))
        return cls(**fields)


class KnobRole(str, Enum):
    """What changing a knob changes.

    ``EXECUTION``: only how fast the output is made (replicas, batch size, device, threads,
    inference chunk sizes); the rows written are the same (embeddings within float tolerance).
    Policies tune these. ``QUALITY``: what the output is (render resolution, sampling rate,
    thresholds, engine, precision). The user sets these; a policy may vary one only where the
    user marked it tunable with an explicit range, and then rows can differ by configuration.
    """

    EXECUTION = "execution"
    QUALITY = "quality"


@dataclass(frozen=True)
class KnobSpace:
    """The range of one tunable knob: ``kind`` is "int", "float" or "categorical"; ``role`` says
    whether it changes only speed (``EXECUTION``, the default) or the output (``QUALITY``, present
    in a space only where the user marked the knob tunable with this range)."""

    name: str
    kind: str
    low: float | None = None
    high: float | None = None
    choices: tuple[KnobValue, ...] = ()
    log: bool = False
    role: KnobRole = KnobRole.EXECUTION

    def __post_init__(self) -> None:
        object.__setattr__(self, "role", KnobRole(self.role))
        if self.kind not in ("int", "float", "categorical"):
            raise ValueError(f"knob {self.name!r}: kind must be 'int', 'float' or 'categorical', got {self.kind!r}")
        if self.kind == "categorical" and not self.choices:
            raise ValueError(f"knob {self.name!r}: a categorical knob needs at least one choice")
        if self.kind != "categorical" and (self.low is None or self.high is None or self.low > self.high):
            raise ValueError(f"knob {self.name!r}: needs low <= high, got low={self.low!r} high={self.high!r}")


@dataclass(frozen=True)
class ConfigSpace:
    """The OpConfig search space of one operator: devices, batch-size range and knobs.

    ``resources`` maps a device to the (cpus, gpus) one replica holds on it.
    """

    devices: tuple[str, ...] = (CPU,)
    batch_size_min: int = 1
    batch_size_max: int = 64
    knobs: tuple[KnobSpace, ...] = ()
    resources: tuple[tuple[str, tuple[float, float]], ...] = ((CPU, (1.0, 0.0)), (GPU, (1.0, 1.0)))

    def __post_init__(self) -> None:
        if not self.devices:
            raise ValueError("ConfigSpace.devices is empty: list at least one device, e.g. ('cpu',)")
        if not (1 <= self.batch_size_min <= self.batch_size_max):
            raise ValueError(f"ConfigSpace needs 1 <= batch_size_min <= batch_size_max, got {self.batch_size_min}..{self.batch_size_max}")

    @property
    def quality_knobs(self) -> tuple[str, ...]:
        """Names of the knobs in this space that change the output (marked tunable by the user)."""
        return tuple(k.name for k in self.knobs if k.role is KnobRole.QUALITY)

    def resources_for(self, device: str) -> tuple[float, float]:
        table = dict(self.resources)
        if device in table:
            return table[device]
        return (1.0, 0.0) if device == CPU else (1.0, 1.0)

    def config(self, device: str, batch_size: int, **knobs: KnobValue) -> OpConfig:
        cpus, gpus = self.resources_for(device)
        return OpConfig(device=device, batch_size=batch_size, cpus=cpus, gpus=gpus, knobs=_freeze_knobs(knobs))


@dataclass(frozen=True)
class NodeClass:
    """``count`` identical nodes. Memory in bytes; bandwidths in bytes/s per node: ``host_device_bandwidth_bps``
    between host and accelerators, ``nic_bandwidth_bps`` the node's network link in each direction (Ray does not
    report it, so it is declared; 0 = not declared: cross-node traffic does not constrain the placement)."""

    name: str
    count: int
    cpus: float
    gpus: int = 0
    gpu_memory_bytes: int = 0
    host_memory_bytes: int = 0
    host_device_bandwidth_bps: float = 0.0
    accelerator: str = GPU
    nic_bandwidth_bps: float = 0.0

    def __post_init__(self) -> None:
        for name in ("host_device_bandwidth_bps", "nic_bandwidth_bps"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"node class {self.name!r}: {name} must be bytes/s >= 0 (0: not declared), got {value!r}; "
                                 f"e.g. 12.5e9 for a 100 Gbit/s link")
        if self.count < 1:
            raise ValueError(f"node class {self.name!r}: count must be >= 1, got {self.count}")
        if self.cpus <= 0:
            raise ValueError(f"node class {self.name!r}: cpus must be > 0, got {self.cpus}")
        if self.gpus < 0 or (self.gpus > 0 and self.gpu_memory_bytes <= 0):
            raise ValueError(f"node class {self.name!r}: a node with gpus needs gpu_memory_bytes > 0")


@dataclass(frozen=True)
class ClusterSpec:
    """The fixed cluster the pipeline runs on, as classes of identical nodes."""

    node_classes: tuple[NodeClass, ...]

    def __post_init__(self) -> None:
        if not self.node_classes:
            raise ValueError("ClusterSpec needs at least one node class")
        names = [n.name for n in self.node_classes]
        if len(set(names)) != len(names):
            raise ValueError(f"ClusterSpec node class names must be unique, got {names}")

    @property
    def total_cpus(self) -> float:
        return sum(n.cpus * n.count for n in self.node_classes)

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus * n.count for n in self.node_classes)

    def node_class(self, name: str) -> NodeClass:
        for n in self.node_classes:
            if n.name == name:
                return n
        raise KeyError(f"no node class named {name!r}; known: {[n.name for n in self.node_classes]}")

    @classmethod
    def single_node(cls, cpus: float, gpus: int = 0, gpu_memory_bytes: int = 16 * 2**30, host_memory_bytes: int = 64 * 2**30,
                    host_device_bandwidth_bps: float = 16e9) -> "ClusterSpec":
        return cls((NodeClass("node", 1, cpus, gpus, gpu_memory_bytes if gpus else 0, host_memory_bytes, host_device_bandwidth_bps),))


@dataclass(frozen=True)
class ReplicaGroup:
    """``replicas`` replicas of one operator with one config on one node class (``None`` = anywhere)."""

    config: OpConfig
    replicas: int
    node_class: str | None = None

    def __post_init__(self) -> None:
        if self.replicas < 0:
            raise ValueError(f"replicas must be >= 0, got {self.replicas}")


@dataclass(frozen=True)
class OperatorPlan:
    operator: str
    groups: tuple[ReplicaGroup, ...]
    reason: str = ""
    canary: OpConfig | None = None

    @property
    def replicas(self) -> int:
        return sum(g.replicas for g in self.groups)


class PlanKind(str, Enum):
    """Why a policy made a plan."""

    THROUGHPUT = "throughput"        # a placement predicted to be faster than the current one
    MEMORY_SAFETY = "memory_safety"  # moves operators off configurations that ran, or may run, out of memory
    ROLLBACK = "rollback"            # restores the placement before a change that made the pipeline slower
    CANARY = "canary"                # starts canary replicas, or ends them with a verdict
    REGIME_PLAN = "regime_plan"      # moves operators to a known regime's allocation as its items reach them
    IDLE_CAPACITY = "idle_capacity"  # gives resources no replica holds to operators with work waiting
    REBALANCE = "rebalance"          # moves replicas of operators that sat mostly idle to operators with work waiting
    BATCH_DEPTH = "batch_depth"      # raises batch sizes so a stretch of expensive items cannot hold every replica


class CanaryVerdict(str, Enum):
    """How a canary ended."""

    ACCEPTED = "accepted"
    REJECTED = "rejected"
    ABANDONED = "abandoned"  # it got no batch, or never became warm, in time


@dataclass(frozen=True)
class CanaryEnd:
    """A canary of ``config`` on ``operator`` that a plan ends, and its verdict."""

    operator: str
    config: OpConfig
    verdict: CanaryVerdict


@dataclass(frozen=True)
class Rationale:
    """Why a plan was made and what it is expected to bring, as figures (None: the policy does not say).

    ``throughput_before`` / ``throughput_after``: predicted pipeline throughput (input items/s)
    of the current placement and of the plan; ``rollout_s``: seconds until the change is in
    place; ``switch_cost_items``: input items the switch costs (capacity lost while replicas
    start and drain); ``bottlenecks``: the operators that bound the plan's throughput.
    A rollback gives ``measured_before`` / ``measured_after``: end-to-end items/s measured
    before and after the change it undoes. A memory-safety plan lists the (operator, config)
    pairs it moves off in ``unsafe``; a canary plan the canaries it ends in ``canaries_ended``.
    """

    kind: PlanKind
    throughput_before: float | None = None
    throughput_after: float | None = None
    rollout_s: float | None = None
    switch_cost_items: float | None = None
    bottlenecks: tuple[str, ...] = ()
    measured_before: float | None = None
    measured_after: float | None = None
    unsafe: tuple[tuple[str, OpConfig], ...] = ()
    canaries_ended: tuple[CanaryEnd, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", PlanKind(self.kind))

    @property
    def payback_s(self) -> float | None:
        """Seconds the predicted gain takes to make up for the items the switch costs (None
        without a predicted gain or a price)."""
        if self.switch_cost_items is None or self.throughput_before is None or self.throughput_after is None:
            return None
        if self.throughput_after <= self.throughput_before:
            return None
        return self.switch_cost_items / (self.throughput_after - self.throughput_before)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "throughput_before": self.throughput_before, "throughput_after": self.throughput_after,
                "rollout_s": self.rollout_s, "switch_cost_items": self.switch_cost_items, "bottlenecks": list(self.bottlenecks),
                "measured_before": self.measured_before, "measured_after": self.measured_after,
                "unsafe": [{"operator": op, "config": c.to_dict()} for op, c in self.unsafe],
                "canaries_ended": [{"operator": e.operator, "config": e.config.to_dict(), "verdict": e.verdict.value}
                                   for e in self.canaries_ended]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Rationale":
        return cls(PlanKind(data["kind"]), data.get("throughput_before"), data.get("throughput_after"), data.get("rollout_s"),
                   data.get("switch_cost_items"), tuple(data.get("bottlenecks", ())), data.get("measured_before"),
                   data.get("measured_after"), tuple((u["operator"], OpConfig.from_dict(u["config"])) for u in data.get("unsafe", ())),
                   tuple(CanaryEnd(e["operator"], OpConfig.from_dict(e["config"]), CanaryVerdict(e["verdict"]))
                         for e in data.get("canaries_ended", ())))


@dataclass(frozen=True)
class Plan:
    """The desired configuration of every operator, the predicted pipeline throughput
    (input items/s) and, per operator, a human-readable reason for its change. ``rationale``
    holds why it was made and its figures as typed values (None from a policy that gives
    only the text)."""

    operators: tuple[OperatorPlan, ...]
    predicted_throughput: float = 0.0
    reason: str = ""
    rationale: Rationale | None = None

    def for_operator(self, name: str) -> OperatorPlan:
        for op in self.operators:
            if op.operator == name:
                return op
        raise KeyError(f"plan has no operator {name!r}; it has {[o.operator for o in self.operators]}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "predicted_throughput": self.predicted_throughput,
            "reason": self.reason,
            "rationale": self.rationale.to_dict() if self.rationale else None,
            "operators": [
                {"operator": o.operator, "reason": o.reason, "canary": o.canary.to_dict() if o.canary else None,
                 "groups": [{"config": g.config.to_dict(), "replicas": g.replicas, "node_class": g.node_class} for g in o.groups]}
                for o in self.operators
            ],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Plan":
        ops = tuple(
            OperatorPlan(o["operator"], tuple(ReplicaGroup(OpConfig.from_dict(g["config"]), int(g["replicas"]), g.get("node_class")) for g in o["groups"]),
                         o.get("reason", ""), OpConfig.from_dict(o["canary"]) if o.get("canary") else None)
            for o in data["operators"]
        )
        rationale = Rationale.from_dict(data["rationale"]) if data.get("rationale") else None
        return cls(ops, float(data.get("predicted_throughput", 0.0)), data.get("reason", ""), rationale)


class StepKind(str, Enum):
    """One rolling step: start replicas, drain-and-retire replicas, start or end a canary, or give running replicas
    another batch size in place (``RESIZE``: no restart, no cold start; the runner sends them batches of the new size)."""

    START = "start"
    RETIRE = "retire"
    CANARY = "canary"
    END_CANARY = "end_canary"
    RESIZE = "resize"


@dataclass(frozen=True)
class TransitionStep:
    """One step; a ``RESIZE`` moves ``count`` replicas running ``from_config`` to ``config``, which differs from it
    only in its batch size."""

    kind: StepKind
    operator: str
    config: OpConfig
    count: int = 1
    node_class: str | None = None
    reason: str = ""
    from_config: OpConfig | None = None

    @classmethod
    def resize(cls, operator: str, from_config: OpConfig, config: OpConfig, count: int, node_class: str | None,
               why: str) -> "TransitionStep":
        """A ``RESIZE`` of ``count`` replicas from ``from_config`` to ``config``, its reason saying ``why``."""
        return cls(StepKind.RESIZE, operator, config, count, node_class,
                   f"batch size {from_config.batch_size} -> {config.batch_size} in place: {why}", from_config)

    def to_dict(self) -> dict[str, Any]:
        out = {"kind": self.kind.value, "operator": self.operator, "config": self.config.to_dict(), "count": self.count,
               "node_class": self.node_class, "reason": self.reason}
        if self.from_config is not None:
            out["from_config"] = self.from_config.to_dict()
        return out


class TransitionVerdict(str, Enum):
    """Whether a priced transition is worth rolling out now, or waits."""

    ROLL_OUT = "roll_out"
    WAIT = "wait"


@dataclass(frozen=True)
class Transition:
    """Ordered rolling steps from the current placement to a plan.

    ``expected_gain`` is in input items/s, ``cold_start_cost_s`` the capacity-seconds lost to
    starting and draining replicas, ``rollout_s`` how long the steps take, ``cost_items`` the
    input items the switch costs over the regime; ``verdict`` says whether to roll out now or
    wait, and ``reason`` why. Steps are applied in order; a START step's replicas are warm before the
    next RETIRE step of the same operator drains old ones.
    """

    steps: tuple[TransitionStep, ...]
    verdict: TransitionVerdict = TransitionVerdict.ROLL_OUT
    reason: str = ""
    expected_gain: float = 0.0
    cold_start_cost_s: float = 0.0
    plan: Plan | None = None
    rollout_s: float = 0.0
    cost_items: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"steps": [s.to_dict() for s in self.steps], "verdict": self.verdict.value, "reason": self.reason,
                "expected_gain": self.expected_gain, "cold_start_cost_s": self.cold_start_cost_s,
                "plan": self.plan.to_dict() if self.plan else None, "rollout_s": self.rollout_s, "cost_items": self.cost_items}
