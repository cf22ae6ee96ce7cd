"""Static configurations of an emulated pipeline, searched on its cost model (imports only
``runtime.costmodel``, the emulated stages and ``core``).

Contract:
- ``StaticConfig``: one config and a replica count per operator (what a hand-tuned static
  deployment would run), with the throughput the cost model predicts on the workload it was tuned
  on. The simulator starts runs from one (``sim.setup.initial_config``), the planner reads
  ``reach`` from it, and the benchmarks' static baselines are its searches.
- ``predict_throughput(profile, assignment, features)``: input items/s, the minimum over operators
  of replicas x one replica's items/s (``DeviceCost.seconds``) / the share of items reaching it.
- ``search_static(profile, features, ...)``: the best predicted throughput for one workload;
  ``search_static_stream(profile, blocks, ...)``: the shortest predicted whole stream (hindsight).
- ``largest_batch(...)``: the largest candidate batch whose predicted peak memory fits the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

from trident_flows.core.types import CPU, GPU, OpConfig, OperatorPlan, Plan, ReplicaGroup
from trident_flows.pipelines.emulated import Stage
from trident_flows.runtime.costmodel import PipelineProfile


@dataclass(frozen=True)
class StaticConfig:
    """One config and replica count per operator, in pipeline order, and its predicted items/s."""

    assignment: tuple[tuple[str, OpConfig, int], ...]
    predicted_items_per_s: float

    def stages(self, max_replicas: int | None = None) -> list[Stage]:
        """The assignment as emulated stages; ``max_replicas``: each operator's replica cap (at least its replicas;
        None: the emulated default)."""
        if max_replicas is None:
            return [Stage(name, config, replicas) for name, config, replicas in self.assignment]
        return [Stage(name, config, replicas, max_replicas=max(max_replicas, replicas)) for name, config, replicas in self.assignment]

    def as_dict(self) -> dict[str, tuple[OpConfig, int]]:
        return {name: (config, replicas) for name, config, replicas in self.assignment}

    def label(self) -> str:
        return ", ".join(f"{n} {r}x{c.label()}" for n, c, r in self.assignment)

    def plan(self, reason: str) -> Plan:
        """This configuration as a Plan (what the oracle applies at a regime boundary)."""
        ops = tuple(OperatorPlan(n, (ReplicaGroup(c, r),), reason) for n, c, r in self.assignment)
        return Plan(ops, self.predicted_items_per_s, reason)

    def to_dict(self) -> dict[str, object]:
        return {"predicted_items_per_s": self.predicted_items_per_s,
                "operators": {n: {"config": c.to_dict(), "replicas": r} for n, c, r in self.assignment}}


def reach(profile: PipelineProfile) -> dict[str, float]:
    """Share of input items that reach each operator (product of upstream selectivities)."""
    out, share = {}, 1.0
    for op in profile.operators:
        out[op.name] = share
        share *= op.selectivity
    return out


def replica_rate(profile: PipelineProfile, name: str, config: OpConfig, features: Mapping[str, float]) -> float:
    """Items per second of one replica with ``config`` on items with these mean ``features``."""
    b = config.batch_size
    seconds = profile.operator(name).device(config.device).seconds(b, {f: v * b for f, v in features.items()})
    return b / seconds if seconds > 0 else float("inf")


def predict_throughput(profile: PipelineProfile, assignment: Mapping[str, tuple[OpConfig, int]], features: Mapping[str, float]) -> float:
    """Predicted input items/s of the pipeline (see the module docstring)."""
    shares = reach(profile)
    caps = []
    for name, (config, replicas) in assignment.items():
        rate = replica_rate(profile, name, config, features) * replicas
        caps.append(rate / shares[name] if shares[name] > 0 else float("inf"))
    return min(caps) if caps else 0.0


def peak_bytes(profile: PipelineProfile, name: str, config: OpConfig, features: Mapping[str, float]) -> int:
    b = config.batch_size
    return profile.operator(name).device(config.device).peak_bytes(b, {f: v * b for f, v in features.items()})


def largest_batch(profile: PipelineProfile, name: str, features: Mapping[str, float], device_memory_bytes: int,
                  batches: Sequence[int], device: str = GPU) -> int:
    """The largest of ``batches`` whose predicted peak memory fits the device (the smallest if none does)."""
    fitting = [b for b in sorted(batches) if peak_bytes(profile, name, OpConfig.make(device, batch_size=b), features) <= device_memory_bytes]
    return fitting[-1] if fitting else min(batches)


def _water_fill(profile: PipelineProfile, fixed: dict[str, tuple[OpConfig, int]], cpu_ops: Sequence[str], cpu_batch: int,
                cpus_left: float, features: Mapping[str, float]) -> dict[str, tuple[OpConfig, int]] | None:
    if cpus_left < len(cpu_ops):
        return None
    shares = reach(profile)
    config = OpConfig.make(CPU, batch_size=cpu_batch)
    rate = {o: replica_rate(profile, o, config, features) / shares[o] for o in cpu_ops}
    replicas = {o: 1 for o in cpu_ops}
    for _ in range(int(cpus_left) - len(cpu_ops)):
        worst = min(cpu_ops, key=lambda o: rate[o] * replicas[o])
        replicas[worst] += 1
    return {**fixed, **{o: (config, replicas[o]) for o in cpu_ops}}


def _accelerator_options(profile: PipelineProfile, names: Sequence[str], gpus: int, gpu_batches: Sequence[int], device_memory_bytes: int,
                         mem_features: Mapping[str, float]) -> tuple[list[str], list[list[tuple[OpConfig, int] | None]]]:
    """The accelerator-capable operators and, for each, its choices: (config, GPUs) or None = on CPU like the rest."""
    accel = [n for n in names if GPU in profile.operator(n).devices and gpus > 0]
    options: list[list[tuple[OpConfig, int] | None]] = []
    for n in accel:
        opts: list[tuple[OpConfig, int] | None] = [None] if CPU in profile.operator(n).devices else []
        for b in sorted(gpu_batches):
            config = OpConfig.make(GPU, batch_size=b)
            if peak_bytes(profile, n, config, mem_features) > device_memory_bytes:
                continue
            opts += [(config, g) for g in range(1, gpus + 1)]
        if not opts:
            raise ValueError(f"operator {n!r}: no batch size in {list(gpu_batches)} fits {device_memory_bytes} device bytes and it has "
                             "no CPU cost model; lower the batch sizes or raise device memory")
        options.append(opts)
    return accel, options


def _gpu_placements(accel: Sequence[str], options: Sequence[Sequence[tuple[OpConfig, int] | None]],
                    gpus: int) -> Iterator[dict[str, tuple[OpConfig, int]]]:
    """Every combination of the accelerator choices that fits ``gpus``."""
    def visit(k: int, fixed: dict[str, tuple[OpConfig, int]], used: int) -> Iterator[dict[str, tuple[OpConfig, int]]]:
        if k == len(accel):
            yield fixed
            return
        for opt in options[k]:
            if opt is None:
                yield from visit(k + 1, fixed, used)
            elif used + opt[1] <= gpus:
                yield from visit(k + 1, {**fixed, accel[k]: opt}, used + opt[1])

    return visit(0, {}, 0)


def search_static(profile: PipelineProfile, features: Mapping[str, float], *, cpus: int, gpus: int, device_memory_bytes: int,
                  gpu_batches: Sequence[int] = (8, 16, 32, 64), cpu_batch: int = 8,
                  memory_features: Mapping[str, float] | None = None) -> StaticConfig:
    """The static configuration with the best predicted throughput: every device / GPU replica count / batch size
    choice of the operators that have an accelerator cost model (a batch whose predicted peak memory, at
    ``memory_features``, exceeds the device is excluded), and for each the remaining CPUs given one at a time to the
    operator with the lowest capacity (water-filling, exact for this min-of-ratios objective with integer replicas).
    Ties go to the smaller batch."""
    names = [op.name for op in profile.operators]
    mem_features = memory_features if memory_features is not None else features
    accel, options = _accelerator_options(profile, names, gpus, gpu_batches, device_memory_bytes, mem_features)
    best: StaticConfig | None = None
    best_key: tuple[float, int] | None = None
    for fixed in _gpu_placements(accel, options, gpus):
        cpu_ops = [n for n in names if n not in fixed]
        cpus_left = cpus - sum(c.cpus * r for c, r in fixed.values())
        full = _water_fill(profile, fixed, cpu_ops, cpu_batch, cpus_left, features)
        if full is None:
            continue
        tp = predict_throughput(profile, full, features)
        key = (round(tp, 9), -sum(c.batch_size for c, _ in full.values()))
        if best_key is None or key > best_key:
            best_key = key
            best = StaticConfig(tuple((n, *full[n]) for n in names), tp)
    if best is None:
        raise ValueError(f"no static configuration of {names} fits {cpus} CPUs and {gpus} GPUs (each operator needs a replica)")
    return best


def stream_seconds(profile: PipelineProfile, assignment: Mapping[str, tuple[OpConfig, int]],
                   blocks: Sequence[tuple[Mapping[str, float], int]]) -> float:
    """Predicted seconds of a stream of ``blocks`` (mean features, items) under one static assignment."""
    return sum(items / max(predict_throughput(profile, assignment, features), 1e-12) for features, items in blocks)


def search_static_stream(profile: PipelineProfile, blocks: Sequence[tuple[Mapping[str, float], int]], *, cpus: int, gpus: int,
                         device_memory_bytes: int, gpu_batches: Sequence[int] = (8, 16, 32, 64), cpu_batch: int = 8,
                         memory_features: Mapping[str, float] | None = None,
                         candidates: Sequence[Mapping[str, tuple[OpConfig, int]]] = ()) -> StaticConfig:
    """The static configuration with the shortest predicted duration of a whole stream, ``blocks`` being (mean
    features, items) per block: over the same accelerator choices as ``search_static``, the CPUs given one at a
    time to the operator whose extra replica shortens the stream most (greedy), with the per-block
    ``search_static`` optima as candidates too; ``candidates``: other assignments known to fit the cluster,
    compared too. Its ``predicted_items_per_s`` is the stream's items over that duration. Knowing the blocks is
    knowledge of the future: the best static configuration in hindsight."""
    names = [op.name for op in profile.operators]
    total = sum(items for _, items in blocks)
    mem_features = memory_features if memory_features is not None else {
        f: max(float(features.get(f, 0.0)) for features, _ in blocks) for f in {f for features, _ in blocks for f in features}}
    kw = dict(cpus=cpus, gpus=gpus, device_memory_bytes=device_memory_bytes, gpu_batches=gpu_batches, cpu_batch=cpu_batch,
              memory_features=mem_features)
    candidates = [*candidates, *(search_static(profile, features, **kw).as_dict() for features, _ in blocks)]
    accel, options = _accelerator_options(profile, names, gpus, gpu_batches, device_memory_bytes, mem_features)
    config = OpConfig.make(CPU, batch_size=cpu_batch)
    for fixed in _gpu_placements(accel, options, gpus):
        cpu_ops = [n for n in names if n not in fixed]
        cpus_left = int(cpus - sum(c.cpus * r for c, r in fixed.values()))
        if cpus_left < len(cpu_ops):
            continue
        replicas = {o: 1 for o in cpu_ops}
        for _ in range(cpus_left - len(cpu_ops)):  # each spare CPU to the operator whose extra replica shortens the stream most
            def seconds_with(extra: str, fixed=fixed, cpu_ops=cpu_ops, replicas=replicas) -> float:  # this iteration's values
                trial = {**fixed, **{o: (config, replicas[o] + (o == extra)) for o in cpu_ops}}
                return stream_seconds(profile, trial, blocks)
            replicas[min(cpu_ops, key=seconds_with)] += 1
        candidates.append({**fixed, **{o: (config, replicas[o]) for o in cpu_ops}})
    if not candidates:
        raise ValueError(f"no static configuration of {names} fits {cpus} CPUs and {gpus} GPUs (each operator needs a replica)")
    best = min(candidates, key=lambda a: stream_seconds(profile, a, blocks))
    return StaticConfig(tuple((n, *best[n]) for n in names), total / stream_seconds(profile, best, blocks))
