"""The pipeline runner: a named async Ray actor that streams items through operator pools.

Contract:
- ``PipelineRunner(spec, out_dir, settings, name, namespace, external_input)`` is created by
  ``control.launch.start_runner`` (found with ``find_runner``). ``start()`` warms the replicas and
  streams on the actor's event loop, so ``state()``, ``samples(since)``, ``apply(plan)``,
  ``add_shard``/``close_input``/``shard_status``, ``wait``, ``summary`` and ``stop`` are served
  while it runs, from any driver in the cluster.
- It composes one part per concept (``feed``, ``work_queue``, ``dispatch``, ``backpressure``,
  ``routing``, ``lineage``, ``retry``, ``shards``, ``sink_writer``, ``sink``, ``metrics``, ``rollout``,
  ``pool``), runs each batch on a replica (``wire``, ``payload``), re-produces rows lost with their
  node and replaces dead replicas; an operator failing ``max_attempts`` times in a row with no
  replica running fails the run. Replicas are pinned to live nodes (``node_placement``).
- ``latencies()``: every input item's read, done and commit times (``latency``); ``summary()``: the
  state, apply reports, ``replicas_by_node`` and the runner process's own cost.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any, Coroutine

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from trident_flows.core.state import ApplyReport, OperatorState, RunnerSettings, RunnerState, RuntimeConfigError, SamplePage, ShardStatus
from trident_flows.core.types import Outcome, Plan, Transition
from trident_flows.runtime import devices, peak_memory, sink_writer
from trident_flows.runtime.dispatch import Dispatcher
from trident_flows.runtime.feed import Feed
from trident_flows.runtime.latency import Latencies
from trident_flows.runtime.lineage import reruns
from trident_flows.runtime.metrics import OpCounters, RunMetrics
from trident_flows.runtime.node_placement import REFRESH_S, GpuShare, NodePlacer
from trident_flows.runtime.payload import Outline
from trident_flows.runtime.pool import OperatorPool, ReplicaRecord
from trident_flows.runtime.retry import Retry, after_death, after_failure
from trident_flows.runtime.rollout import Rollout
from trident_flows.runtime.routing import route
from trident_flows.runtime.shards import ShardLedger
from trident_flows.runtime.sink import check_shard_id
from trident_flows.runtime.sink_writer import SinkWriterActor
from trident_flows.runtime.spec import ID, PipelineSpec
from trident_flows.runtime.wire import decode_reply, items_message
from trident_flows.runtime.work_queue import Item, Queue, Unit

__all__ = ["PipelineRunner", "RunnerActor"]


class PipelineRunner:
    """The runner actor body (see the module docstring). Created via ``launch.start_runner``."""

    def __init__(self, spec: PipelineSpec, out_dir: str, settings: RunnerSettings, name: str, namespace: str | None,
                 external_input: bool = False) -> None:
        peak_since_start = peak_memory.reset_peak()  # the worker process may have run other work before
        self.spec = spec
        self.settings = settings
        self.name = name
        self.namespace = namespace
        self.external_input = external_input
        self.out_dir = Path(out_dir)
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.writer = SinkWriterActor.options(scheduling_strategy=here).remote(str(self.out_dir))
        self.device_prefix = f"{name}-device"
        self.ops = [o.name for o in spec.operators]
        self.placer = NodePlacer(settings.device_memory_bytes)
        self.placer.update(ray.nodes())
        self.pools = [OperatorPool(o, name, namespace, self.device_prefix, settings.max_inflight_per_replica, self.placer, self._held,
                                   self._gpu_shares) for o in spec.operators]
        self.queues = [Queue() for _ in spec.operators]
        self.counters = [OpCounters() for _ in spec.operators]
        self.start_failures = [0 for _ in spec.operators]  # failed cold starts in a row, per operator
        self.metrics = RunMetrics(settings.sample_buffer, peak_since_start)
        self.ledger = ShardLedger(self.writer, self.metrics, self._spawn, self._wake_pump,
                                  lambda items, op: self._reproduce(items, held=False, outputs_of=op))
        self.feed = Feed(self.queues[0], self.ledger, settings, self._wake_pump, self.pools[0].slot_items)
        self.dispatcher = Dispatcher(self.queues, self.pools, settings, lambda: self.input_closed, self._launch, self.feed.notify_room,
                                     self._wake_pump)
        self.rollout = Rollout(self.ops, self.pools, settings, self._state, self.metrics.rate, lambda: self.started_at,
                               lambda: self.finished, self._watch_start, self._wake_pump)
        self.ooms = 0
        self.input_closed = False
        self.finished = False
        self.error = ""
        self.started_at = 0.0
        self.finished_at = 0.0
        self.cluster_cpus = float(ray.cluster_resources().get("CPU", 0.0))
        self.cluster_gpus = float(ray.cluster_resources().get("GPU", 0.0))
        self._wake = asyncio.Event()
        self._done = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._devices: list[Any] = []

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

    def _spawn(self, coro: Coroutine) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None and not self.error:
            self._fail(f"internal error: {type(task.exception()).__name__}: {task.exception()}")

    def _wake_pump(self) -> None:
        self._wake.set()

    def _fail(self, message: str) -> None:
        self.error = message
        self.finished = True
        self.finished_at = time.time()
        self._done.set()

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

    # ------------------------------------------------------------------ replicas and nodes
    def _watch_start(self, i: int, record: ReplicaRecord, replace: bool = True) -> None:
        """Until ``record`` is warm; one that fails its cold start is replaced (when ``replace``), and
        an operator whose replicas fail to start ``max_attempts`` times in a row with none left fails the run."""
        async def watch() -> None:
            try:
                await record.ready
                self.start_failures[i] = 0
                self._wake.set()
            except asyncio.CancelledError:
                return
            except ray.exceptions.RayError as exc:
                self.pools[i].forget(record)
                self.start_failures[i] += 1
                if self.start_failures[i] >= self.settings.max_attempts and not self.pools[i].active():
                    self._fail(f"operator {self.ops[i]!r}: replicas fail to start ({self.start_failures[i]} times): {exc}")
                elif replace and not record.draining and not self.finished:
                    self._replace(i, record)
        self._spawn(watch())

    def _replace(self, i: int, record: ReplicaRecord) -> None:
        for new in self.pools[i].start(record.config, 1, canary=record.canary, prefer=record.node_class or None):
            self._watch_start(i, new)

    def _held(self) -> dict[str, tuple[float, float]]:
        """(CPUs, GPUs) the replicas of every operator hold per node id."""
        out: dict[str, tuple[float, float]] = {}
        for pool in self.pools:
            for node_id, (c, g) in pool.held().items():
                oc, og = out.get(node_id, (0.0, 0.0))
                out[node_id] = (oc + c, og + g)
        return out

    def _gpu_shares(self) -> dict[str, list[GpuShare]]:
        """The GPU replicas of every operator per node id, each with the devices it holds (``GpuShare``)."""
        out: dict[str, list[GpuShare]] = {}
        for pool in self.pools:
            for node_id, shares in pool.gpu_shares().items():
                out.setdefault(node_id, []).extend(shares)
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

    # ------------------------------------------------------------------ input
    async def _feed(self) -> None:
        await self.feed.read_source(iter(self.spec.source()), self.settings.shard_items)
        self.input_closed = True
        self._wake.set()

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
        old = self.ledger.shards.get(shard_id)
        if old is not None and not old.done:
            raise RuntimeError(f"shard {shard_id!r} is still running; wait for it before re-running it")
        shard = self.ledger.open(shard_id)
        await sink_writer.call(self.writer.discard, shard_id)
        await self.feed.add_rows(shard, rows)
        self._wake.set()
        return shard.status()

    async def close_input(self) -> None:
        """No more shards will come; the run finishes once the added ones are done."""
        self.input_closed = True
        self._wake.set()

    async def shard_status(self, shard_id: str) -> ShardStatus:
        if shard_id not in self.ledger.shards:
            raise KeyError(f"unknown shard {shard_id!r}")
        return self.ledger[shard_id].status()

    # ------------------------------------------------------------------ streaming
    async def _pump(self) -> None:
        while not self.finished:
            await self._wake.wait()
            self._wake.clear()
            self.dispatcher.dispatch()
            self._check_finished()

    async def _meter(self) -> None:
        """Trim the completion history used for throughput windows."""
        while not self.finished:
            self.metrics.trim(time.time() - max(600.0, 4 * self.settings.dip_window_s))
            await asyncio.sleep(1.0)

    def _check_finished(self) -> None:
        if self.finished or not self.input_closed:
            return
        if self.ledger.all_done() and all(len(q) == 0 for q in self.queues):
            self.finished = True
            self.finished_at = time.time()
            self._done.set()

    def _launch(self, i: int, replica: ReplicaRecord, unit: Unit, reserved: tuple[int, int]) -> None:
        self._spawn(self._run_batch(i, replica, unit, reserved))

    async def _run_batch(self, i: int, replica: ReplicaRecord, unit: Unit, reserved: tuple[int, int]) -> None:
        """Send ``unit`` to ``replica``, then route its output, retry it, or produce lost input rows again."""
        try:
            inputs, groups, sent = items_message(unit.items)
            # Ray moves whole objects: each stored batch this one reads, and the part from another node, counted once
            stored = {id(it.ref): it for it in unit.items if it.ref is not None}
            read = sum(it.ref_bytes for it in stored.values())
            remote = sum(it.ref_bytes for it in stored.values() if it.node and replica.node_id and it.node != replica.node_id)
            epoch, inflight, config = self.pools[i].config_epoch, replica.inflight, replica.config  # a RESIZE meanwhile: the next batches
            try:
                reply_ref, payload_ref = replica.handle.process.remote(inputs)
                reply: bytes = await reply_ref
            except ray.exceptions.RayActorError as exc:
                self._on_replica_death(i, replica, unit, exc)
                return
            except ray.exceptions.RayError as exc:
                self._on_batch_failure(i, unit, f"{type(exc).__name__}: {str(exc)[:1000]}", oom=devices.is_oom(exc))
                return
            result = decode_reply(reply, [it.row[ID] for it in unit.items], self.ops[i], replica.replica_id, config, epoch, inflight)
            if result.lost:  # input rows gone with their node: not the operator's failure, so no sample
                self._on_lost_inputs(i, unit, [it for k in result.lost for it in groups[k]])
                return
            received = len(reply)
            self.metrics.runner_bytes += sent + received
            self.metrics.bytes_from_other_nodes += remote
            self.metrics.record(dataclasses.replace(result.sample, bytes_read=read, bytes_from_other_nodes=remote,
                                                    runner_bytes=sent + received))
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
            self.dispatcher.release(i, reserved)
            replica.inflight -= 1
            if replica.inflight == 0:
                replica.idle.set()
            self._wake.set()

    def _on_lost_inputs(self, i: int, unit: Unit, lost: list[Item]) -> None:
        """Some input rows of ``unit`` were gone with their node: the rest go again, the lost ones are produced again."""
        gone = {id(it) for it in lost}
        rest = [it for it in unit.items if id(it) not in gone]
        if rest:
            self.queues[i].push_unit(Unit(rest, unit.deaths))
        self._reproduce(lost, held=True, outputs_of=i - 1)

    def _route(self, i: int, unit: Unit, out: Outline, node: str) -> None:
        routed = route(unit, out, node, i, self.ops[i], self.ledger, self.queues[i + 1] if i + 1 < len(self.queues) else None)
        c = self.counters[i]
        c.items_in += len(unit.items)
        c.items_out += routed.rows_out
        c.items_forwarded += routed.forwarded
        self.dispatcher.reservations[i].observe(len(unit.items), routed.rows_out, routed.in_bytes, routed.forwarded, routed.forwarded_bytes)

    def _on_replica_death(self, i: int, replica: ReplicaRecord, unit: Unit, exc: BaseException) -> None:
        self.placer.suspect(replica.node_id)
        if not replica.dead:
            self.pools[i].forget(replica)
            if not replica.draining and not self.finished:
                self._replace(i, replica)
        if devices.is_oom(exc) or isinstance(exc, ray.exceptions.OutOfMemoryError):  # Ray's memory monitor killed it
            self.counters[i].ooms += 1
            self.ooms += 1
        self._retry(i, after_death(unit, self.settings.max_attempts), f"replica died: {type(exc).__name__}: {str(exc)[:500]}")

    def _on_batch_failure(self, i: int, unit: Unit, error: str, oom: bool) -> None:
        self.counters[i].errors += 1
        if oom:
            self.counters[i].ooms += 1
            self.ooms += 1
        self._retry(i, after_failure(unit, self.settings.max_attempts), ("OOM: " if oom else "") + error)

    def _retry(self, i: int, retry: Retry, error: str) -> None:
        for unit in retry.requeue:
            self.queues[i].push_unit(unit)
        if retry.give_up is not None:
            self.ledger.dead_letter(retry.give_up, self.ops[i], error)

    def _reproduce(self, items: list[Item], held: bool, outputs_of: int) -> None:
        """Rows of operator ``outputs_of`` whose stored object is gone: run each one's source item again
        from the first operator, keeping only those rows (``lineage.reruns``). ``held``: the rows are still
        pending (queued or in flight); else they were routed to the sink and become pending again."""
        self.metrics.rows_lost += len(items)
        for item, group in reruns(items, outputs_of):
            self.ledger[item.shard].pending += 1 - (len(group) if held else 0)
            self.queues[0].push(item)
        self._wake.set()

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
        ledger = self.ledger
        done = ledger.rows_written + ledger.rows_dead
        return RunnerState(self.spec.name, tuple(ops), ledger.items_in, ledger.rows_written, ledger.rows_dead, ledger.rows_dropped,
                           ledger.rows_written, self.input_closed, self.finished, wall, done / wall if wall > 0 else 0.0,
                           self.cluster_cpus, self.cluster_gpus, self.rollout.landed, self.ooms, self.error, self.placer.nodes)

    def _wall(self) -> float:
        if not self.started_at:
            return 0.0
        return (self.finished_at or time.time()) - self.started_at

    async def pipeline_spec(self) -> PipelineSpec:
        """The PipelineSpec this runner runs (operators, config spaces), e.g. for a policy in another process."""
        return self.spec

    async def latencies(self) -> Latencies:
        """Every input item's read, done and shard-commit times so far (see ``latency``)."""
        return self.ledger.latency.snapshot()

    async def samples(self, since: int = 0) -> SamplePage:
        """BatchSamples with sequence number > ``since`` (oldest first, up to ``sample_buffer`` kept)."""
        return self.metrics.page(since)

    def summary(self) -> dict[str, Any]:
        """The state plus apply reports and rolling-update dips (JSON-ready)."""
        state = self._state().to_dict()
        state.update(self.rollout.summary())
        state["out_dir"] = str(self.out_dir)
        state["replicas_by_node"] = self.placer.replicas_by_node()
        state["runner"] = self.metrics.process()
        return state

    # ------------------------------------------------------------------ control
    async def apply(self, change: Plan | Transition) -> ApplyReport:
        """Apply a Plan (rolling steps derived by ``rolling_steps``) or a Transition (steps in order); see ``rollout``."""
        return await self.rollout.apply(change)


RunnerActor = ray.remote(num_cpus=0, max_restarts=0)(PipelineRunner)
