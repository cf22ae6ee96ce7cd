"""One operator's replica pool, living inside the runner's event loop.

Contract:
- ``start(config, count, canary)`` creates replica actors with ``config``'s resources, named
  ``{runner}:{operator}:{replica_id}`` in the runner's namespace; each is warm once ``ready()``
  returns. With a ``node_placement.NodePlacer`` each is pinned to the node it chooses
  (``node_class=``, ``prefer=``).
- ``pick(near)``: the warm, non-draining replica with the fewest batches in flight below
  ``max_inflight``, preferring node ``near`` (where the rows are stored).
- ``resize(records, config)`` gives serving replicas another batch size in place (the runner sends
  them batches of that size; the actor is not restarted).
- ``retire(record)`` drains, lets the operator release what it holds, then kills;
  ``forget(record)`` removes a dead one and releases its emulated device memory.
- ``config_epoch`` increases whenever the set of active configs changes; ``held()`` and
  ``free_by_node()`` give CPUs/GPUs held per node and left on every live node (GPUs device by device:
  ``gpu_shares()``, each warm replica's GPU ids from its ``ready()``).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import ray

from trident_flows.core.state import ReplicaState
from trident_flows.core.types import OpConfig
from trident_flows.runtime.node_placement import GpuShare, NodePlacer
from trident_flows.runtime.replica import ReplicaActor
from trident_flows.runtime.spec import OperatorSpec


@dataclass(eq=False)
class ReplicaRecord:
    replica_id: str
    actor_name: str
    config: OpConfig
    handle: Any
    canary: bool
    epoch: int
    warm: bool = False
    draining: bool = False
    dead: bool = False
    inflight: int = 0
    batches: int = 0
    busy_s: float = 0.0
    warm_at: float = 0.0
    cold_start_s: float = 0.0
    ready: asyncio.Future | None = None
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    node_id: str = ""
    node_class: str = ""
    gpu_ids: tuple[str, ...] = ()  # the devices Ray gave it (known once warm)

    def snapshot(self, now: float) -> ReplicaState:
        alive = now - self.warm_at if self.warm else 0.0
        busy = min(1.0, self.busy_s / alive) if alive > 0 else 0.0
        return ReplicaState(self.replica_id, self.actor_name, self.config, self.warm, self.draining, self.canary, self.inflight,
                            busy, self.batches, self.epoch, self.cold_start_s, self.node_id, self.node_class)


class OperatorPool:
    """The replicas of one operator (see the module docstring)."""

    def __init__(self, spec: OperatorSpec, runner_name: str, namespace: str | None, device_prefix: str, max_inflight: int,
                 placer: NodePlacer | None = None, held: Callable[[], dict[str, tuple[float, float]]] | None = None,
                 shares: Callable[[], dict[str, list[GpuShare]]] | None = None) -> None:
        self.spec = spec
        self.name = spec.name
        self.runner_name = runner_name
        self.namespace = namespace
        self.device_prefix = device_prefix
        self.max_inflight = max_inflight
        self.replicas: dict[str, ReplicaRecord] = {}
        self.devices: list[Any] = []  # emulated devices, to release a dead replica's resident memory
        self.config_epoch = 0
        self._ids = itertools.count()
        self.placer = placer
        self._held = held or self.held  # what the runner's replicas hold per node (all pools), for choosing a node
        self._shares = shares or self.gpu_shares  # and their GPUs device by device

    def slot_items(self) -> int:
        """Items the active (not draining) replicas take in flight: batch size x ``max_inflight`` each."""
        return self.max_inflight * sum(r.config.batch_size for r in self.replicas.values() if not r.draining and not r.dead)

    def _configs(self) -> frozenset[tuple[OpConfig, bool]]:
        return frozenset((r.config, r.canary) for r in self.replicas.values() if not r.draining and not r.dead)

    def _bump_epoch_if_changed(self, before: frozenset[tuple[OpConfig, bool]]) -> None:
        if self._configs() != before:
            self.config_epoch += 1

    def start(self, config: OpConfig, count: int = 1, canary: bool = False, node_class: str | None = None,
              prefer: str | None = None) -> list[ReplicaRecord]:
        """Create ``count`` replicas with ``config``; each record's ``ready`` future resolves when warm.
        ``node_class``: pin them to nodes of that class (``RuntimeError`` when it has no live node)."""
        placing = self.placer is not None and bool(self.placer.nodes)
        if placing and node_class is not None and self.placer.choose(config.cpus, config.gpus, {}, node_class) is None:
            raise RuntimeError(f"operator {self.name!r}: no live node of class {node_class!r} can hold {config.label()}")
        before = self._configs()
        records = []
        for _ in range(count):
            rid = f"{self.name}-{next(self._ids)}"
            actor_name = f"{self.runner_name}:{self.name}:{rid}"
            options: dict[str, Any] = {}
            node_id = ""
            if placing:  # no node large enough: left to Ray, which queues it until one joins
                node_id = self.placer.choose(config.cpus, config.gpus, self._held(), node_class, prefer, self._shares()) or ""
                if node_id:
                    options["scheduling_strategy"] = self.placer.strategy(node_id)
            handle = ReplicaActor.options(name=actor_name, namespace=self.namespace, num_cpus=config.cpus, num_gpus=config.gpus,
                                          **options).remote(
                self.name, rid, self.spec.cls, dict(self.spec.params), config, self.device_prefix, self.namespace)
            record = ReplicaRecord(rid, actor_name, config, handle, canary, self.config_epoch + (1 if (config, canary) not in before else 0),
                                   node_id=node_id, node_class=self.placer.class_of(node_id) if self.placer and node_id else "")
            record.idle.set()
            record.ready = asyncio.ensure_future(self._warm(record))
            self.replicas[rid] = record
            records.append(record)
        self._bump_epoch_if_changed(before)
        return records

    async def _warm(self, record: ReplicaRecord) -> ReplicaRecord:
        requested = time.perf_counter()
        info = await record.handle.ready.remote()
        # what starting a replica really costs: scheduling and the actor's process start as well
        # as the operator's own constructor (which is all ``info`` measures)
        record.cold_start_s = max(float(info["cold_start_s"]), time.perf_counter() - requested)
        record.warm = True
        record.warm_at = time.time()
        record.node_id = str(info.get("node_id") or record.node_id)
        record.gpu_ids = tuple(str(g) for g in info.get("gpu_ids") or ())
        if self.placer is not None:
            record.node_class = self.placer.class_of(record.node_id) or record.node_class
            self.placer.ran(self.name, record.replica_id, record.node_id)
        return record

    def pick(self, near: str = "") -> ReplicaRecord | None:
        best = None
        for r in self.replicas.values():
            if r.warm and not r.draining and not r.dead and r.inflight < self.max_inflight:
                if best is None or (r.inflight, r.node_id != near) < (best.inflight, best.node_id != near):
                    best = r
        return best

    def active(self, canary: bool | None = None) -> list[ReplicaRecord]:
        """Non-draining live replicas (warm or starting); ``canary`` filters canaries in or out."""
        return [r for r in self.replicas.values() if not r.draining and not r.dead and (canary is None or r.canary == canary)]

    def choose_retire(self, config: OpConfig, count: int, canary: bool, node_class: str | None = None) -> list[ReplicaRecord]:
        """The ``count`` replicas with ``config`` (on nodes of ``node_class`` when given) to retire,
        least loaded (and not yet warm) first."""
        candidates = [r for r in self.active(canary) if r.config == config and (node_class is None or r.node_class == node_class)]
        candidates.sort(key=lambda r: (r.warm, r.inflight))
        return candidates[:count]

    def resize(self, records: list[ReplicaRecord], config: OpConfig) -> None:
        """Give ``records`` (serving, not draining) ``config``, which differs from theirs only in batch size."""
        before = self._configs()
        for r in records:
            r.config = config
        self._bump_epoch_if_changed(before)
        for r in records:
            r.epoch = self.config_epoch

    def begin_drain(self, records: list[ReplicaRecord]) -> None:
        before = self._configs()
        for r in records:
            r.draining = True
        self._bump_epoch_if_changed(before)

    async def retire(self, record: ReplicaRecord, timeout_s: float = 600.0) -> None:
        """Drain ``record`` (no new batches; wait for in-flight ones), release, kill."""
        if not record.draining:
            self.begin_drain([record])
        try:
            await asyncio.wait_for(record.idle.wait(), timeout_s)
            if record.warm and not record.dead:
                await asyncio.wait_for(record.handle.stop.remote(), 30)
        except (asyncio.TimeoutError, ray.exceptions.RayError):
            pass
        self.forget(record)

    def forget(self, record: ReplicaRecord) -> None:
        """Remove a replica (dead or retired) and make sure its actor is gone."""
        before = self._configs()
        record.dead = True
        if record.ready is not None and not record.ready.done():
            record.ready.cancel()
        self.replicas.pop(record.replica_id, None)
        try:
            ray.kill(record.handle, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
        for device in self.devices:
            device.release.remote(record.handle._actor_id.hex())
        self._bump_epoch_if_changed(before)

    async def shutdown(self) -> None:
        for r in list(self.replicas.values()):
            self.forget(r)

    def held(self) -> dict[str, tuple[float, float]]:
        """(CPUs, GPUs) this pool's live replicas hold per node id."""
        out: dict[str, tuple[float, float]] = {}
        for r in self.replicas.values():
            if not r.dead and r.node_id:
                c, g = out.get(r.node_id, (0.0, 0.0))
                out[r.node_id] = (c + r.config.cpus, g + r.config.gpus)
        return out

    def gpu_shares(self) -> dict[str, list[GpuShare]]:
        """Each GPU replica of this pool that is not dead, per node id: its GPUs and the devices it holds."""
        out: dict[str, list[GpuShare]] = {}
        for r in self.replicas.values():
            if not r.dead and r.node_id and r.config.gpus > 0:
                out.setdefault(r.node_id, []).append(GpuShare(r.config.gpus, r.gpu_ids))
        return out

    def free_by_node(self) -> dict[str, tuple[float, float]]:
        """(CPUs, GPUs) free per live node after what the runner's replicas hold there, GPUs device by device (empty
        without a placer)."""
        return {} if self.placer is None else self.placer.free(self._held(), self._shares())

    def snapshot(self, now: float) -> tuple[ReplicaState, ...]:
        return tuple(r.snapshot(now) for r in self.replicas.values())
