"""Emulated operators and pipelines built from a cost model.

Contract:
- ``EmulatedOperator(config, *, name, cost, ...)`` has the operator shape of ``runtime.spec``
  (runs under this runtime and plain Ray Data). Its cold start sleeps ``cold_start_s``; a batch
  costs what ``config.device``'s ``DeviceCost`` says for its rows' features: CPU work sleeps
  holding the CPU (a fractional CPU on one of the node's shared cores), accelerator work runs on
  an emulated device (``runtime.devices``), raising ``DeviceOOMError`` over its capacity; its
  working set counts a reused working set (``reused_unit_bytes``) once, for its largest row.
  ``time_scale`` multiplies all seconds.
- Selectivity < 1 marks rows ``_drop`` (deterministic by id); > 1 splits rows into ``{id}/{k}``.
  ``fail_ids`` raise, ``error_ids`` mark ``_error`` (exactly-once tests).
- ``synthetic_rows(workloads, n, regimes, seed)``: a deterministic input stream following a regime
  schedule such as ``"short:500,long:200,scans:300"`` (features Gamma-distributed around each
  regime's mean); ``memory_spikes`` scale chosen items' working-set bytes, not their seconds.
- ``emulated_pipeline(profile, stages, ...)`` builds a whole ``PipelineSpec``.
"""

from __future__ import annotations

import functools
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

import numpy as np

from trident_flows.core.types import CPU, GPU, ConfigSpace, OpConfig
from trident_flows.runtime.costmodel import DeviceCost, OperatorCost, PipelineProfile
from trident_flows.runtime.spec import DROP, ERROR, ID, SOURCE_ID, Batch, OperatorSpec, PipelineSpec

MEMORY_SCALE = "memory_scale"


def _unit(name: str, key: str) -> float:
    """A stable number in [0, 1) for (operator, id)."""
    return zlib.crc32(f"{name}:{key}".encode()) / 2**32


def _marked(batch: Batch) -> np.ndarray:
    n = len(batch[ID])
    marked = np.zeros(n, dtype=bool)
    for col in (DROP, ERROR):
        if col in batch:
            marked |= np.array([bool(v) for v in batch[col]], dtype=bool)
    return marked


class EmulatedOperator:
    """An operator whose cost and memory come from a cost model (see the module docstring)."""

    def __init__(self, config: OpConfig, *, name: str, cost: Mapping[str, Any], time_scale: float = 1.0,
                 fail_ids: tuple[str, ...] = (), error_ids: tuple[str, ...] = (), host_memory_cap_bytes: int = 64 * 2**20,
                 device: Any = None) -> None:
        self.config = config
        self.name = name
        self.op_cost = _operator_cost(name, cost)
        self.cost: DeviceCost = self.op_cost.device(config.device)
        self.time_scale = float(time_scale)
        self.fail_ids = frozenset(fail_ids)
        self.error_ids = frozenset(error_ids)
        self.host_memory_cap = int(host_memory_cap_bytes)
        self.feature_names = tuple(self.op_cost.features) or tuple(sorted({f for d in self.op_cost.devices.values()
                                                                           for f in d.feature_names()}))
        self.last_device_peak_bytes = 0
        self.last_host_bytes = 0
        self.device = None
        self.holder = ""
        self.cores = None
        time.sleep(self.cost.cold_start_s * self.time_scale)
        if config.device == CPU and config.cpus < 1:
            from trident_flows.runtime import devices

            self.cores = devices.node_cores()
        if config.device != CPU:
            import ray

            from trident_flows.runtime import devices

            # ``device``: an emulated-device handle for schedulers that place GPU work themselves
            # (cosmos-xenna does not use Ray's GPU assignment); by default the one Ray assigned
            self.device = device if device is not None else devices.current_device()
            self.holder = ray.get_runtime_context().get_actor_id() or f"pid-{id(self)}"
            self._device_call(self.device.hold.remote(self.holder, self.cost.resident_bytes))

    def _device_call(self, ref: Any) -> int:
        import ray

        from trident_flows.runtime.devices import DeviceOOMError, is_oom

        try:
            return int(ray.get(ref))
        except ray.exceptions.RayTaskError as exc:
            if is_oom(exc):
                raise DeviceOOMError(str(getattr(exc, "cause", exc))) from None
            raise

    def workload_features(self, batch: Batch) -> dict[str, float]:
        """Workload features of the batch's unmarked rows, summed."""
        keep = ~_marked(batch)
        return {f: float(np.asarray(batch[f], dtype=float)[keep].sum()) for f in self.feature_names if f in batch}

    def __call__(self, batch: Batch) -> Batch:
        ids = [str(x) for x in batch[ID]]
        bad = self.fail_ids.intersection(ids)
        if bad:
            raise RuntimeError(f"{self.name}: injected failure on {sorted(bad)}")
        keep = ~_marked(batch)
        items = int(keep.sum())
        features = self.workload_features(batch)
        seconds = self.cost.seconds(items, features) * self.time_scale if items else 0.0
        work_bytes = self._work_bytes(batch, keep, items, features)
        if self.device is not None:
            self.last_device_peak_bytes = self._device_call(self.device.run.remote(self.holder, work_bytes, seconds))
        else:
            # hold the batch's working set in host memory (capped) while the work runs
            working_set = np.ones(min(work_bytes, self.host_memory_cap), dtype=np.uint8) if work_bytes else None
            if self.cores is not None and seconds > 0:
                import ray

                ray.get(self.cores.run.remote(seconds))
            else:
                time.sleep(seconds)
            self.last_host_bytes = 0 if working_set is None else working_set.nbytes
        return self._mark(batch, ids, keep)

    def _work_bytes(self, batch: Batch, keep: np.ndarray, items: int, features: dict[str, float]) -> int:
        """Working-set bytes of the batch's unmarked rows, each scaled by its ``memory_scale``, with the reused working
        set (``reused_unit_bytes``) of its largest row once."""
        columns = {f: np.asarray(batch[f], dtype=float)[keep] for f in self.cost.reused_unit_bytes if f in batch}
        reused = sum((self.cost.reused_unit_bytes[f] * v for f, v in columns.items()), np.zeros(items))
        if MEMORY_SCALE not in batch:
            largest = int(reused.argmax()) if items else 0
            return self.cost.batch_bytes(items, features, {f: float(v[largest]) for f, v in columns.items()} if items else None)
        scale = np.asarray(batch[MEMORY_SCALE], dtype=float)[keep]
        per_row = np.full(len(scale), float(self.cost.per_item_bytes))
        for f, c in self.cost.per_unit_bytes.items():
            if f in batch:
                per_row += c * np.asarray(batch[f], dtype=float)[keep]
        return int((scale * per_row).sum() + (float((scale * reused).max()) if items else 0.0))

    def _mark(self, batch: Batch, ids: list[str], keep: np.ndarray) -> Batch:
        out = dict(batch)
        n = len(ids)
        # unmarked rows carry "" (not None) so the columns stay strings under Ray Data too
        drop = np.array(["" if v is None else str(v) for v in batch[DROP]] if DROP in batch else [""] * n, dtype=object)
        error = np.array(["" if v is None else str(v) for v in batch[ERROR]] if ERROR in batch else [""] * n, dtype=object)
        selectivity = self.op_cost.selectivity
        for k, rid in enumerate(ids):
            if not keep[k]:
                continue
            if rid in self.error_ids:
                error[k] = f"{self.name}: bad input (injected)"
            elif selectivity < 1.0 and _unit(self.name, rid) >= selectivity:
                drop[k] = f"{self.name}:filtered"
        out[DROP], out[ERROR] = drop, error
        if selectivity > 1.0:
            return _split(out, ids, keep, self.name, selectivity)
        return out

    def close(self) -> None:
        """Release this replica's resident memory on its emulated device."""
        if self.device is not None:
            self.device.release.remote(self.holder)
            self.device = None


def _split(batch: Batch, ids: list[str], keep: np.ndarray, name: str, selectivity: float) -> Batch:
    base = int(selectivity)
    index: list[int] = []
    child_ids: list[str] = []
    sources: list[str] = []
    src = batch.get(SOURCE_ID)
    for k, rid in enumerate(ids):
        count = 1 if not keep[k] else base + (1 if _unit(name, rid) < selectivity - base else 0)
        for c in range(count):
            index.append(k)
            child_ids.append(rid if not keep[k] else f"{rid}/{c}")
            sources.append(str(src[k]) if src is not None and src[k] is not None else rid)
    out = {key: np.asarray(values)[index] for key, values in batch.items()}
    out[ID] = np.array(child_ids, dtype=object)
    out[SOURCE_ID] = np.array(sources, dtype=object)
    return out


def _operator_cost(name: str, cost: Mapping[str, Any] | OperatorCost) -> OperatorCost:
    if isinstance(cost, OperatorCost):
        return cost
    return OperatorCost(name, {d: DeviceCost(**c) for d, c in cost["devices"].items()}, float(cost.get("selectivity", 1.0)),
                        tuple(cost.get("features", ())), cost.get("notes", ""))


def cost_params(op: OperatorCost) -> dict[str, Any]:
    """An OperatorCost as plain constructor params (cheap to ship to replicas)."""
    return {"devices": {d: {"per_batch_s": c.per_batch_s, "per_item_s": c.per_item_s, "per_unit_s": dict(c.per_unit_s),
                            "resident_bytes": c.resident_bytes, "per_item_bytes": c.per_item_bytes,
                            "per_unit_bytes": dict(c.per_unit_bytes), "cold_start_s": c.cold_start_s,
                            "reused_unit_bytes": dict(c.reused_unit_bytes)} for d, c in op.devices.items()},
            "selectivity": op.selectivity, "features": list(op.features), "notes": op.notes}


# ---------------------------------------------------------------------------- workload stream
def parse_regimes(schedule: str) -> list[tuple[str, int]]:
    """``"short:500,long:200"`` -> ``[("short", 500), ("long", 200)]``."""
    out = []
    for part in schedule.split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, count = part.partition(":")
        if not sep or not name.strip() or not count.strip().isdigit() or int(count) < 1:
            raise ValueError(f"bad regime {part!r} in schedule {schedule!r}: write NAME:COUNT, e.g. 'short:500,long:200'")
        out.append((name.strip(), int(count)))
    if not out:
        raise ValueError(f"empty regime schedule {schedule!r}: write e.g. 'short:500,long:200'")
    return out


def regime_plan(workloads: Mapping[str, Mapping[str, float]], n: int | None, regimes: str | None) -> list[tuple[str, int]]:
    """The (regime, count) blocks of a stream of ``n`` items: the schedule repeated (and cut) to
    ``n`` items, or, without a schedule, ``n`` split evenly over the known regimes."""
    if regimes:
        schedule = parse_regimes(regimes)
        unknown = [r for r, _ in schedule if workloads and r not in workloads]
        if unknown:
            raise ValueError(f"unknown regime(s) {unknown}; this profile has {sorted(workloads)}")
    else:
        names = list(workloads) or ["default"]
        total = n if n is not None else 1000
        schedule = [(r, total // len(names) + (1 if k < total % len(names) else 0)) for k, r in enumerate(names)]
        schedule = [(r, c) for r, c in schedule if c > 0]
    if n is None:
        return schedule
    blocks, left = [], n
    while left > 0:
        for r, c in schedule:
            take = min(c, left)
            blocks.append((r, take))
            left -= take
            if left == 0:
                break
    return blocks


def synthetic_rows(workloads: Mapping[str, Mapping[str, float]], n: int | None = None, regimes: str | None = None,
                   seed: int = 0, shape: float = 4.0,
                   memory_spikes: tuple[tuple[int, int, float], ...] = ()) -> Iterator[dict[str, Any]]:
    """Deterministic input rows ``{id, regime, <features>}`` following the regime schedule
    (plus ``memory_scale`` when ``memory_spikes`` are given, see the module docstring)."""
    for start, count, factor in memory_spikes:
        if start < 0 or count < 1 or not factor > 0:
            raise ValueError(f"bad memory spike {(start, count, factor)!r}: write (start >= 0, count >= 1, factor > 0)")
    rng = np.random.default_rng(seed)
    k = 0
    for regime, count in regime_plan(workloads, n, regimes):
        means = workloads.get(regime, {})
        for _ in range(count):
            row: dict[str, Any] = {ID: f"item-{k:07d}", "regime": regime}
            for f, mean in means.items():
                row[f] = round(float(rng.gamma(shape, mean / shape)), 3) if mean > 0 else 0.0
            if memory_spikes:
                row[MEMORY_SCALE] = next((float(x) for s, c, x in memory_spikes if s <= k < s + c), 1.0)
            yield row
            k += 1


# ---------------------------------------------------------------------------- pipelines
@dataclass(frozen=True)
class Stage:
    """One emulated stage: which profile operator, its initial config and replicas, extra params."""

    operator: str
    config: OpConfig
    replicas: int = 1
    params: Mapping[str, Any] = field(default_factory=dict)
    max_replicas: int = 64


def config_space(op: OperatorCost, batch_size_max: int = 64) -> ConfigSpace:
    devices = tuple(d for d in (CPU, GPU) if d in op.devices) + tuple(d for d in op.devices if d not in (CPU, GPU))
    return ConfigSpace(devices=devices, batch_size_min=1, batch_size_max=batch_size_max)


def emulated_pipeline(profile: PipelineProfile, stages: list[Stage] | tuple[Stage, ...], *, name: str | None = None,
                      items: int | None = None, regimes: str | None = None, seed: int = 0, time_scale: float = 1.0,
                      memory_spikes: tuple[tuple[int, int, float], ...] = ()) -> PipelineSpec:
    """A PipelineSpec of emulated operators fed by ``synthetic_rows`` (see the module docstring)."""
    specs = []
    for st in stages:
        op = profile.operator(st.operator)
        op.device(st.config.device)  # refuse a device without a cost model, naming the operator
        params = {"name": st.operator, "cost": cost_params(op), "time_scale": time_scale, **dict(st.params)}
        specs.append(OperatorSpec(st.operator, EmulatedOperator, st.config, st.replicas, params, config_space(op),
                                  min_replicas=1, max_replicas=max(st.max_replicas, st.replicas)))
    workloads = {k: dict(v) for k, v in profile.workloads.items()}
    total = items if items is not None else sum(c for _, c in regime_plan(workloads, None, regimes))
    source = functools.partial(synthetic_rows, workloads, total, regimes, seed, memory_spikes=tuple(memory_spikes))
    return PipelineSpec(name or f"emulated-{profile.name}", tuple(specs), source, total)
