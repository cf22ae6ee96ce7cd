"""The pipeline runner: a named async Ray actor that streams items through operator pools.

Contract:
- ``PipelineRunner(spec, out_dir, settings, name, namespace, external_input)`` is created by
  ``control.launch.start_runner`` as a named actor (findable with ``control.launch.find_runner``). ``start()``
  begins streaming on the actor's event loop, so ``state()``, ``samples(since)``,
  ``apply(plan_or_transition)``, ``add_shard``/``close_input``/``shard_status`` and ``wait``
  are served while it runs, from this driver or any other in the cluster.
- Streaming: each operator has an input queue bounded by ``settings.queue_max_items`` and
  ``settings.queue_max_bytes``: a batch is sent to operator *i* only while the queue of
  operator *i+1* plus the expected output of *i*'s in-flight batches stays under the bound
  (backpressure up to the source); at most ``max_inflight_per_replica`` batches per replica;
  results are routed in completion order (the queues: ``work_queue``; an output row's input
  item: ``lineage``). ``_drop`` rows go to the sink, ``_error`` rows to the dead-letter table;
  neither reaches later operators.
- Data plane: the runner holds the source's rows and, for every row an operator produced, only
  its outline (``payload``: reference, id, lineage, marks, size). A replica's output stays in the
  object store on its node (owned by this actor, so it outlives the replica); the next
  operator's replica and the sink's writer (``sink_writer``, on this node) fetch it from there;
  among equally loaded replicas, one on the node that stores the batch's rows gets it.
  A row whose object was lost with its node is produced again from its source item, keeping only
  that row's lineage (``Item.wanted``), so nothing is lost or written twice.
  Per batch the runner sends a replica the source's rows or ``(reference, rows)`` pieces and gets
  back one compact reply (``wire``). ``summary()`` reports the bytes this process serialised
  (those messages as Ray writes them), the bytes replicas fetched from other
  nodes, and its CPU seconds and its peak RSS since it started (``peak_memory``: Ray may start it in
  a worker process that ran other work first); each ``BatchSample`` carries its share.
- Exactly once: a failing batch (error or OOM) is split in halves and retried, isolating bad
  items; a single item failing ``max_attempts`` times goes to the dead-letter table. A replica
  that dies has its in-flight batches re-queued (a batch that was in flight at two deaths is
  split) and is replaced by a new replica with the same config.
- Input comes from ``spec.source`` (implicit shards of ``settings.shard_items`` items) or,
  with ``external_input=True``, from ``add_shard(shard_id, rows)`` until ``close_input()``.
  A shard's output is committed atomically when its last item is done (see ``sink``).
- ``apply(Plan)`` derives rolling steps with ``transition.rolling_steps``; ``apply(Transition)``
  runs the given steps in order (a START waits until the new replicas are warm). Applies
  are serialised; each returns an ``ApplyReport`` with the throughput dip.
- Nodes: the runner reads the live nodes (``ray.nodes()``) every ``node_placement.REFRESH_S``
  seconds into ``RunnerState.nodes`` and the cluster's CPUs/GPUs; every replica is pinned to a
  node (``node_placement.NodePlacer``), on the node class a plan names. When a node leaves, its
  replicas are dropped and replaced on the nodes left, and their in-flight batches re-queued
  (as for any replica that dies); a node that joins gets emulated devices for its GPUs.
  ``summary()["replicas_by_node"]`` is node id -> operator -> replicas that ran there.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import os
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from trident_flows.runtime import devices, peak_memory, sink_writer
from trident_flows.runtime.node_placement import REFRESH_S, NodePlacer
from trident_flows.runtime.pool import OperatorPool, ReplicaRecord
from trident_flows.runtime.payload import Outline, Piece, row_bytes
from trident_flows.runtime.sink import check_shard_id
from trident_flows.runtime.sink_writer import SinkWriterActor
from trident_flows.runtime.spec import ID, SOURCE_ID, PipelineSpec
from trident_flows.runtime.wire import ReplicaResult, decode_reply, piece_message, serialised_size, source_message
from trident_flows.core.state import (ApplyReport, ApplyStatus, OperatorState, RunnerSettings, RunnerState, RuntimeConfigError,
                                      SamplePage, ShardStatus)
from trident_flows.runtime.lineage import parent_item
from trident_flows.runtime.transition import check_plan, rolling_steps
from trident_flows.runtime.work_queue import Item, Queue, Unit, split_in_halves
from trident_flows.core.types import Decision, OpConfig, Outcome, Plan, StepKind, Transition, TransitionStep

__all__ = ["PipelineRunner", "RunnerSettings", "RunnerState", "ApplyReport", "ShardStatus", "SamplePage", "RuntimeConfigError"]

_PART_ROWS = 512
# A staging part is also written once its rows reach this many bytes: the rows' objects stay in
# the object store until written, so large rows (video frames, page images) are written sooner.
_PART_BYTES = 64 * 2**20


@dataclass
class Shard:
    shard_id: str
    items_in: int = 0
    pending: int = 0
    written: int = 0
    dropped: int = 0
    dead: int = 0
    closed: bool = False
    done: bool = False
    committing: bool = False
    rows: list = field(default_factory=list)  # (item, operator index, dropped) of rows to write
    rows_bytes: int = 0
    dead_rows: list = field(default_factory=list)
    writes: list = field(default_factory=list)


@dataclass
class OpCounters:
    items_in: int = 0
    items_out: int = 0
    items_forwarded: int = 0
    errors: int = 0
    ooms: int = 0
    reserved_items: int = 0
    reserved_bytes: int = 0
    growth_items: float = 2.0  # conservative until measured
    growth_bytes: float = 2.0
    start_failures: int = 0


class PipelineRunner:
    """The runner actor body (see the module docstring). Created via ``launch.start_runner``."""

    def __init__(self, spec: PipelineSpec, out_dir: str, settings: RunnerSettings, name: str, namespace: str | None,
                 external_input: bool = False) -> None:
        self.peak_since_start = peak_memory.reset_peak()  # the worker process may have run other work before
        self.spec = spec
        self.settings = settings
        self.name = name
        self.namespace = namespace
        self.external_input = external_input
        self.out_dir = Path(out_dir)
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.writer = SinkWriterActor.options(scheduling_strategy=here).remote(str(self.out_dir))
        self.runner_bytes = 0  # bytes this process serialised for replicas and the writer (sent and received)
        self.bytes_from_other_nodes = 0
        self.rows_lost = 0  # rows whose stored object was lost with its node (each produced again)
        self.device_prefix = f"{name}-device"
        self.ops = [o.name for o in spec.operators]
        self.placer = NodePlacer(settings.device_memory_bytes)
        self.placer.update(ray.nodes())
        self.pools = [OperatorPool(o, name, namespace, self.device_prefix, settings.max_inflight_per_replica, self.placer, self._held)
                      for o in spec.operators]
        self.queues = [Queue() for _ in spec.operators]
        self.counters = [OpCounters() for _ in spec.operators]
        self.shards: dict[str, Shard] = {}
        self.samples_buf: collections.deque = collections.deque(maxlen=settings.sample_buffer)
        self.sample_seq = 0
        self.completions: collections.deque = collections.deque()  # [bucket start, rows done] in 0.1 s buckets
        self.items_in = self.rows_written = self.rows_dropped = self.rows_dead = 0
        self.ooms = 0
        self.reconfigurations = 0
        self.apply_reports: list[ApplyReport] = []
        self.input_closed = False
        self.finished = False
        self.error = ""
        self.started_at = 0.0
        self.finished_at = 0.0
        self.cluster_cpus = float(ray.cluster_resources().get("CPU", 0.0))
        self.cluster_gpus = float(ray.cluster_resources().get("GPU", 0.0))
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._done = asyncio.Event()
        self._apply_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()
        self._devices: list[Any] = []
        self._linger_armed = False
        self._row_bytes = 256.0  # running estimate of input row bytes, to size source reads

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> dict[str, Any]:
        """Create devices and the initial replicas, wait until they are warm (a replica that
        fails its cold start is replaced), then stream. Returns the replica ids per operator."""
        if self.started_at:
            raise RuntimeError("runner already started")
        self.started_at = time.time()
        if self.cluster_gpus > 0:
            self._devices = devices.create_devices(self.device_prefix, self.namespace, self.settings.device_memory_bytes, wait=False)
            await asyncio.gather(*[d.info.remote() for d in self._devices])
            for pool in self.pools:
                pool.devices = self._devices
        initial = []
        # GPU replicas first: they fit fewer nodes (CPU replicas go to nodes without GPUs first)
        for i, op in sorted(enumerate(self.spec.operators), key=lambda io: -io[1].config.gpus):
            for record in self.pools[i].start(op.config, op.replicas):
                self._watch_start(i, record)
                initial.append(record)
        try:
            await asyncio.wait_for(asyncio.gather(*[r.ready for r in initial], return_exceptions=True), self.settings.warm_timeout_s)
        except asyncio.TimeoutError:
            self._fail(f"replicas not warm after {self.settings.warm_timeout_s:g}s (not enough free resources in the cluster?)")
            await self._shutdown()
            raise RuntimeConfigError(self.error) from None
        self._spawn(self._pump())
        self._spawn(self._meter())
        self._spawn(self._watch_nodes())
        if not self.external_input:
            self._spawn(self._feed())
        return {self.ops[i]: list(p.replicas) for i, p in enumerate(self.pools)}

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None and not self.error:
            self._fail(f"internal error: {type(task.exception()).__name__}: {task.exception()}")

    def _fail(self, message: str) -> None:
        self.error = message
        self.finished = True
        self.finished_at = time.time()
        self._done.set()

    def _watch_start(self, i: int, record: ReplicaRecord, replace: bool = True) -> None:
        async def watch() -> None:
            try:
                await record.ready
                self.counters[i].start_failures = 0
                self._wake.set()
            except asyncio.CancelledError:
                return
            except ray.exceptions.RayError as exc:
                self.pools[i].forget(record)
                self.counters[i].start_failures += 1
                if self.counters[i].start_failures >= self.settings.max_attempts and not self.pools[i].active():
                    self._fail(f"operator {self.ops[i]!r}: replicas fail to start ({self.counters[i].start_failures} times): {exc}")
                elif replace and not record.draining and not self.finished:
                    self._replace(i, record)
        self._spawn(watch())

    def _replace(self, i: int, record: ReplicaRecord) -> None:
        for new in self.pools[i].start(record.config, 1, canary=record.canary, prefer=record.node_class or None):
            self._watch_start(i, new)

    # ------------------------------------------------------------------ nodes
    def _held(self) -> dict[str, tuple[float, float]]:
        """(CPUs, GPUs) the replicas of every operator hold per node id."""
        out: dict[str, tuple[float, float]] = {}
        for pool in self.pools:
            for node_id, (c, g) in pool.held().items():
                oc, og = out.get(node_id, (0.0, 0.0))
                out[node_id] = (oc + c, og + g)
        return out

    async def _watch_nodes(self) -> None:
        """Read the live nodes every ``REFRESH_S`` s (see the module docstring)."""
        while not self.finished:
            await asyncio.sleep(REFRESH_S)
            joined, left = self.placer.update(await asyncio.to_thread(ray.nodes))
            if self.placer.nodes:
                self.cluster_cpus = sum(n.cpus for n in self.placer.nodes)
                self.cluster_gpus = sum(n.gpus for n in self.placer.nodes)
            if joined and any(self.placer.node(n).gpus for n in joined):
                self._devices = devices.create_devices(self.device_prefix, self.namespace, self.settings.device_memory_bytes, wait=False)
                for pool in self.pools:
                    pool.devices = self._devices
            for i, pool in enumerate(self.pools):
                for record in [r for r in pool.replicas.values() if r.node_id in left and not r.dead]:
                    # in-flight batches come back as actor errors and are re-queued by _on_replica_death
                    pool.forget(record)
                    if not record.draining and not self.finished:
                        self._replace(i, record)
            if left:
                self._wake.set()

    async def wait(self, timeout_s: float | None = None) -> dict[str, Any]:
        """Wait until the run finished (or ``timeout_s``); returns ``summary()``."""
        try:
            await asyncio.wait_for(self._done.wait(), timeout_s)
        except asyncio.TimeoutError:
            pass
        return self.summary()

    async def stop(self) -> None:
        """Stop streaming and kill all replicas (outputs of committed shards stay)."""
        if not self.finished:
            self._fail(self.error or "stopped")
        await self._shutdown()

    async def _shutdown(self) -> None:
        for task in list(self._tasks):
            if task is not asyncio.current_task():
                task.cancel()
        for pool in self.pools:
            await pool.shutdown()
        for d in self._devices:
            ray.kill(d)
        self._devices = []
        try:
            await asyncio.wait_for(sink_writer.call(self.writer.close), 30)
        except (asyncio.TimeoutError, ray.exceptions.RayError):
            pass
        ray.kill(self.writer)

    # ------------------------------------------------------------------ input
    async def _feed(self) -> None:
        source: Iterator[dict[str, Any]] = iter(self.spec.source())
        index = 0
        shard: Shard | None = None
        while True:
            room = await self._wait_room()
            rows = await asyncio.to_thread(_take, source, min(room, 256))
            for row in rows:
                if shard is None or shard.items_in >= self.settings.shard_items:
                    if shard is not None:
                        self._close_shard(shard)
                    shard = self._new_shard(f"part-{index // self.settings.shard_items:06d}")
                self._admit(row, shard)
                index += 1
            self._wake.set()
            if not rows:
                break
        if shard is not None:
            self._close_shard(shard)
        self.input_closed = True
        self._wake.set()

    async def _wait_room(self) -> int:
        q = self.queues[0]
        while True:
            room = min(self.settings.queue_max_items - q.n_items,
                       int((self.settings.queue_max_bytes - q.n_bytes) / max(1.0, self._row_bytes)))
            if room > 0 or q.n_items == 0:
                return max(1, room)
            self._room.clear()
            await self._room.wait()

    def _new_shard(self, shard_id: str) -> Shard:
        shard = Shard(shard_id)
        self.shards[shard_id] = shard
        return shard

    def _admit(self, row: dict[str, Any], shard: Shard) -> None:
        if ID not in row or row[ID] is None:
            raise ValueError(f"input row without an {ID!r} column: {sorted(row)}")
        row = dict(row)
        row[ID] = str(row[ID])
        shard.items_in += 1
        shard.pending += 1
        self.items_in += 1
        item = Item(row, shard.shard_id, row_bytes(row))
        self._row_bytes = _track(self._row_bytes, item.nbytes)
        self.queues[0].push(item)

    def _close_shard(self, shard: Shard) -> None:
        shard.closed = True
        self._maybe_commit(shard)

    async def add_shard(self, shard_id: str, rows: list[dict[str, Any]]) -> ShardStatus:
        """Feed one shard of input rows (waits while the first queue is full). A shard id that
        is already done is re-run: its committed partition is replaced, never duplicated."""
        check_shard_id(shard_id)
        if not self.external_input:
            raise RuntimeError("this runner reads its PipelineSpec source; start it with external_input=True to feed shards")
        if self.input_closed:
            raise RuntimeError("input is closed: no more shards can be added")
        missing = [k for k, row in enumerate(rows) if row.get(ID) is None]
        if missing:
            raise ValueError(f"shard {shard_id!r}: rows {missing[:5]} have no {ID!r}; every input row needs a unique id")
        old = self.shards.get(shard_id)
        if old is not None and not old.done:
            raise RuntimeError(f"shard {shard_id!r} is still running; wait for it before re-running it")
        shard = self._new_shard(shard_id)
        await sink_writer.call(self.writer.discard, shard_id)
        start = 0
        while start < len(rows):
            room = min(await self._wait_room(), 256)
            for row in rows[start:start + room]:
                self._admit(row, shard)
            start += room
            self._wake.set()
        self._close_shard(shard)
        self._wake.set()
        return self._shard_status(shard)

    async def close_input(self) -> None:
        """No more shards will come; the run finishes once the added ones are done."""
        self.input_closed = True
        self._wake.set()

    async def shard_status(self, shard_id: str) -> ShardStatus:
        if shard_id not in self.shards:
            raise KeyError(f"unknown shard {shard_id!r}")
        return self._shard_status(self.shards[shard_id])

    def _shard_status(self, s: Shard) -> ShardStatus:
        return ShardStatus(s.shard_id, s.items_in, s.written, s.dead, s.dropped, s.pending, s.closed, s.done)

    # ------------------------------------------------------------------ streaming
    async def _pump(self) -> None:
        while not self.finished:
            await self._wake.wait()
            self._wake.clear()
            self._dispatch()
            self._check_finished()

    async def _meter(self) -> None:
        """Trim the completion history used for throughput windows."""
        while not self.finished:
            horizon = time.time() - max(600.0, 4 * self.settings.dip_window_s)
            while self.completions and self.completions[0][0] < horizon:
                self.completions.popleft()
            await asyncio.sleep(1.0)

    def _upstream_idle(self, i: int) -> bool:
        if not self.input_closed:
            return False
        return all(len(self.queues[j]) == 0 and all(r.inflight == 0 for r in self.pools[j].replicas.values()) for j in range(i))

    def _downstream_has_room(self, i: int, n_items: int, n_bytes: int) -> bool:
        if i == len(self.ops) - 1:
            return True
        q, c = self.queues[i + 1], self.counters[i]
        if len(q) == 0 and c.reserved_items == 0:
            return True
        items = q.n_items + c.reserved_items + n_items * c.growth_items
        nbytes = q.n_bytes + c.reserved_bytes + n_bytes * c.growth_bytes
        return items <= self.settings.queue_max_items and nbytes <= self.settings.queue_max_bytes

    def _dispatch(self) -> None:
        linger_needed = False
        for i in reversed(range(len(self.ops))):
            q, pool = self.queues[i], self.pools[i]
            while len(q):
                # prefer a replica on the node that stores the next batch's rows (its first row's, as a rule all of them)
                replica = pool.pick(near=(q.units[0].items[0] if q.units else q.items[0]).node)
                if replica is None:
                    break
                size = replica.config.batch_size
                if not q.units and len(q) < size:
                    full = q.n_items >= self.settings.queue_max_items or q.n_bytes >= self.settings.queue_max_bytes
                    if not (full or self._upstream_idle(i) or time.monotonic() - q.oldest >= self.settings.linger_s):
                        linger_needed = True
                        break
                peek = q.units[0].items if q.units else list(itertools.islice(q.items, size))
                if not self._downstream_has_room(i, len(peek), sum(it.nbytes for it in peek)):
                    break
                unit = q.take(size)
                if i == 0:
                    self._room.set()
                self._launch(i, replica, unit)
        if linger_needed and not self._linger_armed:
            self._linger_armed = True

            def fire() -> None:
                self._linger_armed = False
                self._wake.set()
            asyncio.get_running_loop().call_later(self.settings.linger_s, fire)

    def _launch(self, i: int, replica: ReplicaRecord, unit: Unit) -> None:
        """Account the batch on the replica and the downstream reservation *now* (before the task
        runs), so the next ``pick()`` in the same dispatch round sees it."""
        c = self.counters[i]
        reserve_items = int(len(unit.items) * c.growth_items + 0.999)
        reserve_bytes = int(sum(it.nbytes for it in unit.items) * c.growth_bytes)
        c.reserved_items += reserve_items
        c.reserved_bytes += reserve_bytes
        replica.inflight += 1
        replica.idle.clear()
        self._spawn(self._run_batch(i, replica, unit, reserve_items, reserve_bytes))

    async def _run_batch(self, i: int, replica: ReplicaRecord, unit: Unit, reserve_items: int, reserve_bytes: int) -> None:
        c, pool = self.counters[i], self.pools[i]
        try:
            inputs, groups, sent = _batch_inputs(unit)
            # Ray moves whole objects: each stored batch this one reads, and the part from another node, counted once
            stored = {id(it.ref): it for it in unit.items if it.ref is not None}
            read = sum(it.ref_bytes for it in stored.values())
            remote = sum(it.ref_bytes for it in stored.values() if it.node and replica.node_id and it.node != replica.node_id)
            epoch, inflight = pool.config_epoch, replica.inflight
            try:
                reply_ref, payload_ref = replica.handle.process.remote(inputs)
                reply: bytes = await reply_ref
            except ray.exceptions.RayActorError as exc:
                self._on_replica_death(i, replica, unit, exc)
                return
            except ray.exceptions.RayError as exc:
                self._on_batch_failure(i, unit, f"{type(exc).__name__}: {str(exc)[:1000]}", oom=devices.is_oom(exc))
                return
            result = decode_reply(reply, [it.row[ID] for it in unit.items], self.ops[i], replica.replica_id, replica.config, epoch,
                                  inflight)
            if result.lost:  # input rows gone with their node: not the operator's failure, so no sample
                lost = [it for k in result.lost for it in groups[k]]
                gone = {id(it) for it in lost}
                rest = [it for it in unit.items if id(it) not in gone]
                if rest:
                    self.queues[i].push_unit(Unit(rest, unit.deaths))
                self._reproduce(lost, held=True, outputs_of=i - 1)
                return
            received = len(reply)
            self.runner_bytes += sent + received
            self.bytes_from_other_nodes += remote
            self._record_sample(dataclasses.replace(result, sample=dataclasses.replace(
                result.sample, bytes_read=read, bytes_from_other_nodes=remote, runner_bytes=sent + received)))
            replica.batches += 1
            replica.busy_s += result.sample.busy_s
            if result.ok:
                try:
                    self._route(i, unit, dataclasses.replace(result.output, ref=payload_ref), replica.node_id)
                except Exception as exc:  # noqa: BLE001 - a malformed output batch fails like an operator error
                    self._on_batch_failure(i, unit, f"bad output batch: {type(exc).__name__}: {exc}", oom=False)
            else:
                self._on_batch_failure(i, unit, result.error, oom=result.sample.outcome == Outcome.OOM)
        finally:
            c.reserved_items -= reserve_items
            c.reserved_bytes -= reserve_bytes
            replica.inflight -= 1
            if replica.inflight == 0:
                replica.idle.set()
            self._wake.set()

    def _record_sample(self, result: ReplicaResult) -> None:
        self.sample_seq += 1
        self.samples_buf.append((self.sample_seq, result.sample))

    def _on_replica_death(self, i: int, replica: ReplicaRecord, unit: Unit, exc: BaseException) -> None:
        unit.deaths += 1
        self.placer.suspect(replica.node_id)
        if not replica.dead:
            self.pools[i].forget(replica)
            if not replica.draining and not self.finished:
                self._replace(i, replica)
        if devices.is_oom(exc) or isinstance(exc, ray.exceptions.OutOfMemoryError):  # Ray's memory monitor killed it
            self.counters[i].ooms += 1
            self.ooms += 1
        if len(unit.items) == 1:
            item = unit.items[0]
            item.attempts += 1
            if item.attempts >= self.settings.max_attempts:
                self._dead_letter(item, self.ops[i], f"replica died: {type(exc).__name__}: {str(exc)[:500]}")
                return
            self.queues[i].push_unit(unit)
        elif unit.deaths >= 2:
            for half in split_in_halves(unit):
                self.queues[i].push_unit(half)
        else:
            self.queues[i].push_unit(unit)

    def _on_batch_failure(self, i: int, unit: Unit, error: str, oom: bool) -> None:
        c = self.counters[i]
        c.errors += 1
        if oom:
            c.ooms += 1
            self.ooms += 1
        if len(unit.items) > 1:
            for half in split_in_halves(unit):
                self.queues[i].push_unit(half)
            return
        item = unit.items[0]
        item.attempts += 1
        if item.attempts >= self.settings.max_attempts:
            self._dead_letter(item, self.ops[i], ("OOM: " if oom else "") + error)
        else:
            self.queues[i].push_unit(unit)

    def _route(self, i: int, unit: Unit, out: Outline, node: str) -> None:
        by_id = {it.row[ID]: it for it in unit.items}
        rows = [{ID: rid} if sid is None else {ID: rid, SOURCE_ID: sid} for rid, sid in zip(out.ids, out.source_ids)]
        parents = [parent_item(row, by_id) for row in rows]  # validates before anything is routed
        seen = {p.row[ID] for p in parents}
        last = i == len(self.ops) - 1
        c = self.counters[i]
        in_bytes = sum(it.nbytes for it in unit.items)
        out_bytes = 0
        continuing: list[Item] = []
        produced: dict[int, set[str]] = {}  # re-run items: the rows they were run for that came out
        for j, (row, parent) in enumerate(zip(rows, parents)):
            wanted, upto = parent.wanted, parent.upto
            if wanted is not None:
                covered = {w for w in wanted if _leads_to(row[ID], w)}
                if not covered:
                    continue  # a row of a re-run source item that was not lost: it was routed the first time
                produced.setdefault(id(parent), set()).update(covered)
                if i >= upto:
                    wanted = None  # the lost row itself: routed as it was the first time
            shard = self.shards[parent.shard]
            item = Item(row, parent.shard, out.nbytes[j], 0, out.ref, j, node, parent.origin or parent, wanted, upto, out.stored_bytes)
            if out.error[j]:
                self._dead_letter(Item(row, parent.shard, 0, parent.attempts), self.ops[i], out.error[j], pending_delta=0)
            elif out.drop[j] or last:
                self._write(shard, item, i, dropped=out.drop[j])
            else:
                out_bytes += item.nbytes
                continuing.append(item)
                shard.pending += 1
        for item in unit.items:
            self.shards[item.shard].pending -= 1
            if item.row[ID] not in seen:
                self._dead_letter(item, self.ops[i], "operator returned no row for this item (rows must be marked, never dropped)",
                                  pending_delta=0)
            elif item.wanted is not None:
                for w in sorted(item.wanted - produced.get(id(item), set())):
                    origin = item.origin or item
                    self._dead_letter(Item({ID: w, SOURCE_ID: origin.row[ID]}, item.shard, 0, item.attempts), self.ops[i],
                                      "its output was lost with a node, and running its source item again did not produce it "
                                      f"(operator {self.ops[i]!r} must keep ids or derive them as '<parent>/<k>')", pending_delta=0)
        for item in continuing:
            self.queues[i + 1].push(item)
        c.items_in += len(unit.items)
        c.items_out += len(out)
        c.items_forwarded += len(continuing)
        c.growth_items = _track(c.growth_items, len(out) / max(1, len(unit.items)))
        if continuing:
            c.growth_bytes = _track(c.growth_bytes, out_bytes / max(1, in_bytes))
        for shard_id in {it.shard for it in unit.items}:
            self._maybe_commit(self.shards[shard_id])

    def _reproduce(self, items: list[Item], held: bool, outputs_of: int) -> None:
        """Rows of operator ``outputs_of`` whose stored object is gone: run each one's source item again
        from the first operator, keeping only those rows. ``held``: the rows are still pending (queued or
        in flight); else they were routed to the sink and become pending again."""
        self.rows_lost += len(items)
        runs: dict[tuple[int, int], list[Item]] = {}
        for item in items:
            upto = item.upto if item.wanted is not None else outputs_of
            runs.setdefault((id(item.origin), upto), []).append(item)
        for group in runs.values():
            first = group[0]
            origin = first.origin
            assert origin is not None, "only rows an operator produced are held by reference"
            wanted = frozenset(w for it in group for w in (it.wanted if it.wanted is not None else {it.row[ID]}))
            upto = first.upto if first.wanted is not None else outputs_of
            shard = self.shards[first.shard]
            shard.pending += 1 - (len(group) if held else 0)
            self.queues[0].push(Item(origin.row, origin.shard, origin.nbytes, origin.attempts, origin=origin, wanted=wanted, upto=upto))
        self._wake.set()

    def _write(self, shard: Shard, item: Item, op: int, dropped: bool) -> None:
        shard.rows.append((item, op, dropped))
        shard.rows_bytes += item.nbytes
        if dropped:
            shard.dropped += 1
            self.rows_dropped += 1
        shard.written += 1
        self.rows_written += 1
        self._completed()
        if len(shard.rows) >= _PART_ROWS or shard.rows_bytes >= _PART_BYTES:
            self._flush(shard)

    def _dead_letter(self, item: Item, operator: str, error: str, pending_delta: int = -1) -> None:
        shard = self.shards[item.shard]
        source = item.row.get(SOURCE_ID)
        shard.dead_rows.append({"id": item.row[ID], "source_id": None if source is None else str(source), "shard": item.shard,
                                "operator": operator, "error": error[:2000], "attempts": max(1, item.attempts)})
        shard.dead += 1
        shard.pending += pending_delta
        self.rows_dead += 1
        self._completed()
        if pending_delta:
            self._maybe_commit(shard)

    def _completed(self) -> None:
        bucket = int(time.time() * 10) / 10
        if self.completions and self.completions[-1][0] == bucket:
            self.completions[-1][1] += 1
        else:
            self.completions.append([bucket, 1])

    def _flush(self, shard: Shard) -> None:
        rows, dead = shard.rows, shard.dead_rows
        shard.rows, shard.dead_rows, shard.rows_bytes = [], [], 0
        if rows or dead:
            shard.writes.append(self._spawn(self._write_part(shard, rows, dead)))

    async def _write_part(self, shard: Shard, rows: list[tuple[Item, int, bool]], dead: list[dict[str, Any]]) -> None:
        """Have the writer fetch and write rows (by reference) and dead letters; rows whose object is gone
        are un-counted and produced again."""
        pieces, groups, sent = _batch_inputs(Unit([item for item, _, _ in rows])) if rows else ([], [], 0)
        lost = await sink_writer.call(self.writer.write_part, shard.shard_id, pieces, dead)
        self.runner_bytes += serialised_size(shard.shard_id) + sent + serialised_size(dead) + serialised_size(lost)
        if not lost:
            return
        gone = {id(it) for k in lost for it in groups[k]}
        by_op: dict[int, list[Item]] = {}
        for item, op, dropped in rows:
            if id(item) in gone:
                shard.written -= 1
                self.rows_written -= 1
                if dropped:
                    shard.dropped -= 1
                    self.rows_dropped -= 1
                by_op.setdefault(op, []).append(item)
        for op, items in by_op.items():
            self._reproduce(items, held=False, outputs_of=op)

    def _maybe_commit(self, shard: Shard) -> None:
        if shard.closed and shard.pending == 0 and not shard.done and not shard.committing:
            shard.committing = True
            self._flush(shard)
            self._spawn(self._commit(shard))

    async def _commit(self, shard: Shard) -> None:
        writes, shard.writes = shard.writes, []
        await asyncio.gather(*writes)
        if shard.pending:  # a part lost rows with a node: they are being produced again, then it commits
            shard.committing = False
            return
        await sink_writer.call(self.writer.commit, shard.shard_id)
        shard.done = True
        shard.committing = False
        self._wake.set()

    def _check_finished(self) -> None:
        if self.finished or not self.input_closed:
            return
        if all(s.done for s in self.shards.values()) and all(len(q) == 0 for q in self.queues):
            self.finished = True
            self.finished_at = time.time()
            self._done.set()

    # ------------------------------------------------------------------ observation
    async def state(self) -> RunnerState:
        """A snapshot of the pipeline (see ``state.RunnerState``)."""
        return self._state()

    def _state(self) -> RunnerState:
        now = time.time()
        ops = []
        for i, pool in enumerate(self.pools):
            replicas = pool.snapshot(now)
            warm = [r for r in replicas if r.warm and not r.draining]
            c = self.counters[i]
            ops.append(OperatorState(self.ops[i], replicas, self.queues[i].n_items, self.queues[i].n_bytes, c.items_in, c.items_out,
                                     pool.config_epoch, sum(r.busy_fraction for r in warm) / len(warm) if warm else 0.0, c.errors, c.ooms,
                                     c.items_forwarded))
        wall = self._wall()
        done = self.rows_written + self.rows_dead
        return RunnerState(self.spec.name, tuple(ops), self.items_in, self.rows_written, self.rows_dead, self.rows_dropped,
                           self.rows_written, self.input_closed, self.finished, wall, done / wall if wall > 0 else 0.0,
                           self.cluster_cpus, self.cluster_gpus, self.reconfigurations, self.ooms, self.error, self.placer.nodes)

    def _wall(self) -> float:
        if not self.started_at:
            return 0.0
        return (self.finished_at or time.time()) - self.started_at

    async def pipeline_spec(self) -> PipelineSpec:
        """The PipelineSpec this runner runs (operators, config spaces), e.g. for a policy in another process."""
        return self.spec

    async def samples(self, since: int = 0) -> SamplePage:
        """BatchSamples with sequence number > ``since`` (oldest first, up to ``sample_buffer`` kept)."""
        picked = tuple(s for seq, s in self.samples_buf if seq > since)
        return SamplePage(picked, self.sample_seq)

    def _rate(self, start: float, end: float) -> float:
        if end <= start:
            return 0.0
        return sum(n for t, n in self.completions if start <= t < end) / (end - start)

    def summary(self) -> dict[str, Any]:
        """The state plus apply reports and rolling-update dips (JSON-ready)."""
        state = self._state().to_dict()
        state["apply_reports"] = [r.to_dict() for r in self.apply_reports]
        rolling = [r.dip for r in self.apply_reports if any(s["kind"] == StepKind.RETIRE.value for s in r.steps_done)
                   and any(s["kind"] == StepKind.START.value for s in r.steps_done)]
        state["rolling_update_dip"] = max(rolling) if rolling else 0.0
        state["applies_refused"] = [{"error": r.error, **r.outcome.to_dict()} for r in self.apply_reports
                                    if r.outcome.status != ApplyStatus.LANDED]
        state["out_dir"] = str(self.out_dir)
        state["replicas_by_node"] = self.placer.replicas_by_node()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        state["runner"] = {"pid": os.getpid(), "bytes_serialised": self.runner_bytes, "bytes_from_other_nodes": self.bytes_from_other_nodes,
                           "rows_lost": self.rows_lost,
                           "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_bytes": peak_memory.peak_rss_bytes(),
                           "peak_rss_since_start": self.peak_since_start}
        return state

    # ------------------------------------------------------------------ control
    async def apply(self, change: Plan | Transition) -> ApplyReport:
        """Apply a Plan (rolling steps derived by ``rolling_steps``) or a Transition (steps in order)."""
        async with self._apply_lock:
            if self.finished:
                return ApplyReport((), 0.0, 0.0, 0.0, 0.0, ok=False, error="the run has finished")
            if not isinstance(change, (Plan, Transition)):
                raise TypeError(f"apply takes a Plan or a Transition, got {type(change).__name__}")
            try:
                if isinstance(change, Plan):
                    transition = rolling_steps(self._state(), change)
                else:
                    transition = change
                    self._check_transition(transition)
            except RuntimeConfigError as exc:  # refused before any step: recorded with its reason, then raised to the caller
                self.apply_reports.append(ApplyReport((), 0.0, 0.0, 0.0, 0.0, ok=False, error=str(exc), reason=change.reason or ""))
                raise
            if transition.decision == Decision.WAIT or not transition.steps:
                return ApplyReport((), 0.0, 0.0, 0.0, 0.0, reason=transition.reason or "nothing to do")
            t0 = time.time()
            window = min(self.settings.dip_window_s, max(t0 - self.started_at, 1e-6))
            before = self._rate(t0 - window, t0)
            done: list[dict[str, Any]] = []
            error = ""
            steps = transition.steps
            for k, step in enumerate(steps):
                s0 = time.time()
                # a RETIRE followed by a START of the same operator is a swap in place: its last replica may go
                replaced = any(s.kind == StepKind.START and s.operator == step.operator for s in steps[k + 1:])
                try:
                    ids = await self._do_step(step, replaced=replaced)
                except Exception as exc:  # noqa: BLE001 - reported, and later steps are skipped
                    error = f"step {step.kind.value} {step.operator} {step.config.label()} failed: {type(exc).__name__}: {exc}"
                    error += self._restore_emptied(done)
                    break
                done.append({**step.to_dict(), "replicas": ids, "seconds": time.time() - s0})
            t1 = time.time()
            during = self._rate(t0, t1) if t1 - t0 >= 0.5 else self._rate(t1 - 0.5, t1)
            dip = max(0.0, 1.0 - during / before) if before > 0 else 0.0
            report = ApplyReport(tuple(done), t1 - t0, before, during, dip, ok=not error, error=error, reason=transition.reason,
                                 steps_total=len(steps))
            if report.outcome.status == ApplyStatus.LANDED:
                self.reconfigurations += 1  # only changes that landed count; the others are in apply_reports
            self.apply_reports.append(report)
            self._wake.set()
            return report

    def _restore_emptied(self, done: list[dict[str, Any]]) -> str:
        """After a failed step: an operator left without replicas by a swap in place gets one of the
        configs it retired back, so the pipeline never stalls on a failed apply. Returns a note."""
        notes = []
        for i, pool in enumerate(self.pools):
            if pool.active(canary=False):
                continue
            retired = [d for d in done if d["operator"] == self.ops[i] and d["kind"] == StepKind.RETIRE.value]
            if not retired:
                continue
            config = OpConfig.from_dict(retired[-1]["config"])
            for r in pool.start(config, 1, canary=False):
                self._watch_start(i, r, replace=True)
            notes.append(f"{self.ops[i]}: restarted {config.label()}")
        return ("; restored after the failed swap: " + ", ".join(notes)) if notes else ""

    def _check_transition(self, transition: Transition) -> None:
        for step in transition.steps:
            if step.operator not in self.ops:
                raise RuntimeConfigError(f"transition step names unknown operator {step.operator!r}; operators are {self.ops}")
            if step.count < 1:
                raise RuntimeConfigError(f"transition step for {step.operator!r} has count {step.count}; use count >= 1")
            if step.config.gpus > self.cluster_gpus:
                raise RuntimeConfigError(f"operator {step.operator!r}: gpus={step.config.gpus} exceeds the cluster's {self.cluster_gpus:g} GPUs")
        if transition.plan is not None:
            check_plan(transition.plan, self._state())

    async def _do_step(self, step: TransitionStep, replaced: bool = False) -> list[str]:
        i = self.ops.index(step.operator)
        pool = self.pools[i]
        if step.kind in (StepKind.START, StepKind.CANARY):
            records = pool.start(step.config, step.count, canary=step.kind == StepKind.CANARY, node_class=step.node_class)
            for r in records:
                self._watch_start(i, r, replace=False)
            try:
                await asyncio.wait_for(asyncio.gather(*[r.ready for r in records]), self.settings.warm_timeout_s)
            except (asyncio.TimeoutError, ray.exceptions.RayError) as exc:
                for r in records:
                    if not r.warm:
                        pool.forget(r)
                raise RuntimeError(f"new replicas did not become warm within {self.settings.warm_timeout_s:g}s "
                                   f"(not enough free resources?): {exc}") from exc
            self._wake.set()
            return [r.replica_id for r in records]
        canary = step.kind == StepKind.END_CANARY
        victims = pool.choose_retire(step.config, step.count, canary=canary, node_class=step.node_class)
        if canary and not victims:
            victims = pool.active(canary=True)[: step.count]
        if len(victims) < step.count:
            raise RuntimeConfigError(f"operator {step.operator!r}: asked to retire {step.count} replica(s) of {step.config.label()} "
                                     f"but only {len(victims)} run with that config")
        if not canary and not replaced and len(pool.active(canary=False)) - len(victims) < 1:
            raise RuntimeConfigError(f"operator {step.operator!r}: retiring {len(victims)} would leave no replica and no later step "
                                     "starts a replacement; start new ones first")
        pool.begin_drain(victims)
        await asyncio.gather(*[pool.retire(v) for v in victims])
        return [v.replica_id for v in victims]


def _take(source: Iterator[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    rows = []
    for row in source:
        rows.append(row)
        if len(rows) >= n:
            break
    return rows


def _track(estimate: float, observed: float) -> float:
    """A conservative growth estimate: jumps up to a larger observation, decays slowly down."""
    return max(observed, 0.9 * estimate + 0.1 * observed, 0.05)


def _batch_inputs(unit: Unit) -> tuple[list[Any], list[list[Item]], int]:
    """What a replica is sent for ``unit`` (``wire``): source rows by value, produced rows as pieces (one
    per run of rows from the same stored batch); the items behind each piece; and the bytes this serialises."""
    if all(it.ref is None for it in unit.items):
        rows, size = source_message([it.row for it in unit.items])
        return rows, [unit.items], size
    groups: list[list[Item]] = []
    for it in unit.items:
        if groups and groups[-1][0].ref is it.ref:
            groups[-1].append(it)
        else:
            groups.append([it])
    pairs, size = piece_message([Piece(g[0].ref, tuple(it.index for it in g)) for g in groups])
    return pairs, groups, size


def _leads_to(row_id: str, wanted: str) -> bool:
    """Whether the row ``row_id`` is the wanted row or one it was split from (child ids are ``<parent>/<k>``)."""
    return wanted == row_id or wanted.startswith(row_id + "/")


RunnerActor = ray.remote(num_cpus=0, max_restarts=0)(PipelineRunner)
