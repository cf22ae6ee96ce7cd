"""Trident's memory across runs: what one run of a pipeline learned, kept for the next run of it.

Contract:
- ``TridentMemory`` is plain data: the pipeline (``PipelineIdentity``, hashed), the cluster shape
  (``ClusterShape``), per operator its latest batches (OOMs included) and cold starts per device,
  and the regimes seen (``RegimeEntry``: source features, each operator's allocation, predicted
  rate, times seen, items read in it, per-operator features).
- ``save(memory, uri)`` writes versioned JSON (never pickle: a memory from a shared bucket cannot
  run code) to a path or any pyarrow filesystem URI, atomically.
- ``load(uri, pipeline, cluster) -> Loaded`` never raises for what it reads: a missing memory is a
  silent cold start; an unreadable, other-version or other-pipeline one a cold start with a
  ``warning``; one of another cluster shape keeps its measurements, its allocations rescaled
  (replicas by the CPU ratio, GPU groups by the GPU ratio; a regime needing absent GPUs dropped).
- ``merged(memory, newer)``: what the next run writes (newest ``MAX_SAMPLES`` batches and cold
  starts, regimes matched by ``same_regime`` and counted).
"""

from __future__ import annotations

import hashlib
import json
import math
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from trident_flows.core.types import BatchSample, ClusterSpec, OpConfig

SCHEMA = "trident-memory"
VERSION = 1
MAX_SAMPLES = 256  # batches kept per operator: enough for a fit (the evidence gate asks 32), small on disk
SAME_REGIME_REL = 0.25  # two signatures are one regime when every feature is within 25% of the larger (or both ~0)

Allocation = tuple[tuple[OpConfig, int], ...]  # one operator's (config, replicas) groups


class MemoryFormatError(ValueError):
    """A memory document that is not one this version can read; the message says what is wrong."""


@dataclass(frozen=True)
class PipelineIdentity:
    """What makes two runs the same pipeline: its name, and per operator its name, class, parameters
    (less those naming the run's own resources) and search space (what it computes and what may be
    tuned), hashed into ``fingerprint``."""

    name: str
    operators: tuple[str, ...]
    fingerprint: str

    @classmethod
    def of(cls, spec: Any) -> "PipelineIdentity":
        """The identity of a ``PipelineSpec`` (its initial configuration and replica counts are not part of it)."""
        parts = [{"name": op.name, "class": f"{op.cls.__module__}.{op.cls.__qualname__}",
                  "params": json.dumps({k: v for k, v in op.params.items() if k not in op.run_params}, sort_keys=True,
                                       default=str),
                  "space": repr(op.space)}
                 for op in spec.operators]
        digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]
        return cls(spec.name, tuple(op.name for op in spec.operators), digest)


@dataclass(frozen=True)
class ClusterShape:
    """The cluster's totals, which remembered replica counts are relative to."""

    cpus: float
    gpus: float

    @classmethod
    def of(cls, cluster: ClusterSpec) -> "ClusterShape":
        return cls(float(cluster.total_cpus), float(cluster.total_gpus))


@dataclass(frozen=True)
class OperatorEntry:
    samples: tuple[BatchSample, ...] = ()
    cold_start_s: Mapping[str, float] = field(default_factory=dict)  # device -> seconds from request to warm


@dataclass(frozen=True)
class RegimeEntry:
    signature: Mapping[str, float]  # mean features of one input item at the source
    allocation: Mapping[str, Allocation]  # operator -> the groups that served this regime
    predicted_items_per_s: float
    seen: int = 1
    operator_features: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # operator -> per-item features it measured
    items: float = 0.0  # input items the source read in this regime, over every run remembered


@dataclass(frozen=True)
class TridentMemory:
    pipeline: PipelineIdentity
    cluster: ClusterShape
    operators: Mapping[str, OperatorEntry] = field(default_factory=dict)
    regimes: tuple[RegimeEntry, ...] = ()
    runs: int = 1

    def to_data(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "version": VERSION, "runs": self.runs,
            "pipeline": {"name": self.pipeline.name, "operators": list(self.pipeline.operators), "fingerprint": self.pipeline.fingerprint},
            "cluster": {"cpus": self.cluster.cpus, "gpus": self.cluster.gpus},
            "operators": {name: {"samples": [s.to_dict() for s in e.samples], "cold_start_s": dict(e.cold_start_s)}
                          for name, e in self.operators.items()},
            "regimes": [{"signature": dict(r.signature), "predicted_items_per_s": r.predicted_items_per_s, "seen": r.seen, "items": r.items,
                         "operator_features": {op: dict(f) for op, f in r.operator_features.items()},
                         "allocation": {op: [[c.to_dict(), n] for c, n in groups] for op, groups in r.allocation.items()}}
                        for r in self.regimes],
        }

    @classmethod
    def from_data(cls, data: Any) -> "TridentMemory":
        """Read a document written by ``to_data``; ``MemoryFormatError`` names the first thing that is wrong."""
        if not isinstance(data, Mapping) or data.get("schema") != SCHEMA:
            raise MemoryFormatError(f"not a trident memory (no 'schema': {SCHEMA!r})")
        if data.get("version") != VERSION:
            raise MemoryFormatError(f"memory version {data.get('version')!r}, this trident reads version {VERSION}")
        try:
            p, c = data["pipeline"], data["cluster"]
            operators = {name: OperatorEntry(tuple(BatchSample.from_dict(s) for s in e["samples"]),
                                             {str(d): float(v) for d, v in e.get("cold_start_s", {}).items()})
                         for name, e in data["operators"].items()}
            regimes = tuple(RegimeEntry({str(k): float(v) for k, v in r["signature"].items()},
                                        {op: tuple((OpConfig.from_dict(cfg), int(n)) for cfg, n in groups)
                                         for op, groups in r["allocation"].items()},
                                        float(r["predicted_items_per_s"]), int(r.get("seen", 1)),
                                        {str(op): {str(k): float(v) for k, v in f.items()}
                                         for op, f in r.get("operator_features", {}).items()}, float(r.get("items", 0.0)))
                            for r in data["regimes"])
            return cls(PipelineIdentity(str(p["name"]), tuple(p["operators"]), str(p["fingerprint"])),
                       ClusterShape(float(c["cpus"]), float(c["gpus"])), operators, regimes, int(data.get("runs", 1)))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise MemoryFormatError(f"malformed memory ({type(exc).__name__}: {exc})") from None


@dataclass(frozen=True)
class Loaded:
    """What ``load`` found: a memory to start from (None: a cold start) and, where something was off, why, in one line."""

    memory: TridentMemory | None
    warning: str | None = None


def _filesystem(uri: str) -> tuple[Any, str]:
    from pyarrow import fs

    return fs.FileSystem.from_uri(uri)


def save(memory: TridentMemory, uri: str) -> None:
    """Write ``memory`` to ``uri`` atomically (see the module docstring)."""
    filesystem, path = _filesystem(uri)
    parent = path.rsplit("/", 1)[0] if "/" in path else ""
    if parent:
        filesystem.create_dir(parent, recursive=True)
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    with filesystem.open_output_stream(tmp) as out:
        out.write((json.dumps(memory.to_data(), sort_keys=True) + "\n").encode())
    filesystem.move(tmp, path)


def load(uri: str, pipeline: PipelineIdentity, cluster: ClusterSpec) -> Loaded:
    """The memory at ``uri`` for ``pipeline`` on ``cluster`` (see the module docstring)."""
    from pyarrow import fs

    try:
        filesystem, path = _filesystem(uri)
        if filesystem.get_file_info(path).type == fs.FileType.NotFound:
            return Loaded(None)
        with filesystem.open_input_stream(path) as stream:
            memory = TridentMemory.from_data(json.loads(stream.read().decode()))
    except MemoryFormatError as exc:
        return Loaded(None, f"trident memory {uri} ignored, starting cold: {exc}")
    except Exception as exc:  # noqa: BLE001 - whatever makes a memory unreadable is a cold start, never a failed run
        return Loaded(None, f"trident memory {uri} ignored, starting cold: unreadable ({type(exc).__name__}: {exc})")
    if memory.pipeline.fingerprint != pipeline.fingerprint:
        return Loaded(None, f"trident memory {uri} is of another pipeline ({memory.pipeline.name!r}, operators "
                            f"{list(memory.pipeline.operators)}), not {pipeline.name!r}: ignored, starting cold")
    shape = ClusterShape.of(cluster)
    if shape == memory.cluster:
        return Loaded(memory)
    return rescaled(memory, shape, uri)


def rescaled(memory: TridentMemory, shape: ClusterShape, uri: str) -> Loaded:
    """``memory`` for a cluster of another ``shape``: measurements kept, allocations scaled (module docstring)."""
    cpu_ratio = shape.cpus / memory.cluster.cpus if memory.cluster.cpus else 0.0
    gpu_ratio = shape.gpus / memory.cluster.gpus if memory.cluster.gpus else 0.0
    kept, dropped = [], 0
    for regime in memory.regimes:
        allocation = {op: _scaled(groups, cpu_ratio, gpu_ratio) for op, groups in regime.allocation.items()}
        if any(groups is None for groups in allocation.values()):
            dropped += 1
            continue
        kept.append(replace(regime, allocation=allocation, predicted_items_per_s=regime.predicted_items_per_s * cpu_ratio))
    note = (f"trident memory {uri} was learned on {memory.cluster.cpus:g} CPUs / {memory.cluster.gpus:g} GPUs, this cluster has "
            f"{shape.cpus:g} / {shape.gpus:g}: per-replica measurements kept, {len(kept)} remembered allocation(s) rescaled"
            + (f", {dropped} needing GPUs this cluster lacks dropped" if dropped else ""))
    return Loaded(replace(memory, cluster=shape, regimes=tuple(kept)), note)


def _scaled(groups: Allocation, cpu_ratio: float, gpu_ratio: float) -> Allocation | None:
    out = []
    for config, n in groups:
        ratio = gpu_ratio if config.gpus > 0 else cpu_ratio
        if ratio <= 0:
            return None
        out.append((config, max(1, int(math.floor(n * ratio + 0.5)))))
    return tuple(out)


def same_regime(a: Mapping[str, float], b: Mapping[str, float], rel: float = SAME_REGIME_REL) -> bool:
    """Whether two signatures describe one regime (every feature within ``rel`` of the larger, or both near zero)."""
    for key in set(a) | set(b):
        x, y = float(a.get(key, 0.0)), float(b.get(key, 0.0))
        top = max(abs(x), abs(y))
        if top > 1e-9 and abs(x - y) > rel * top:
            return False
    return True


def merged(memory: TridentMemory | None, newer: TridentMemory) -> TridentMemory:
    """What the next run keeps: ``newer``'s figures over ``memory``'s (module docstring)."""
    if memory is None or memory.pipeline != newer.pipeline:
        return newer
    operators = {}
    for name in dict.fromkeys([*memory.operators, *newer.operators]):
        old, new = memory.operators.get(name, OperatorEntry()), newer.operators.get(name, OperatorEntry())
        operators[name] = OperatorEntry((*old.samples, *new.samples)[-MAX_SAMPLES:], {**old.cold_start_s, **new.cold_start_s})
    regimes = list(memory.regimes)
    for regime in newer.regimes:
        k = next((i for i, r in enumerate(regimes) if same_regime(r.signature, regime.signature)), None)
        if k is None:
            regimes.append(regime)
        else:
            regimes[k] = replace(regime, seen=regimes[k].seen + regime.seen, items=regimes[k].items + regime.items)
    return TridentMemory(newer.pipeline, newer.cluster, operators, tuple(regimes), memory.runs + 1)


def memory_of(pipeline: PipelineIdentity, cluster: ClusterSpec, samples: Mapping[str, Sequence[BatchSample]],
              cold_start_s: Mapping[str, Mapping[str, float]], regimes: Sequence[RegimeEntry]) -> TridentMemory:
    """One run's memory (the newest ``MAX_SAMPLES`` batches per operator)."""
    operators = {name: OperatorEntry(tuple(batches)[-MAX_SAMPLES:], dict(cold_start_s.get(name, {}))) for name, batches in samples.items()}
    for name, starts in cold_start_s.items():
        operators.setdefault(name, OperatorEntry((), dict(starts)))
    return TridentMemory(pipeline, ClusterShape.of(cluster), operators, tuple(regimes))

