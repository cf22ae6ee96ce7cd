"""The simulated runner: the live runner's streaming rules and interface on a simulated clock.

Contract:
- ``SimRunner(spec, cluster, settings=..., stream=..., node_loss=...)`` runs an emulated pipeline
  (operators with a cost model) on a simulated ``ClusterSpec``; ``start()`` runs the clock until
  the initial replicas are warm, ``run_until(t)`` advances it.
- It offers what ``PipelineRunner`` offers: ``state()``, ``samples(since)`` (simulated seconds),
  ``apply(Plan | Transition)`` (``sim.rollout``), ``summary()`` and ``replica_seconds()``.
- Streaming follows the live runner (in-flight limits, ``backpressure.items_bound``, linger;
  queue byte bounds are not simulated). A batch costs the cost model's seconds plus ``call_cost``;
  GPU kernels queue per device and an OOM splits and retries the batch, a single item dead-lettered
  after ``max_attempts``. A cold start is ``actor_start`` plus the model's ``cold_start_s``.
- ``node_loss=((t, node), ...)``: node dies at simulated second ``t``; its batches are re-queued
  and its replicas replaced wherever they fit. ``inputs_done`` counts finished input items.
"""

import collections
from typing import Sequence

import numpy as np

from trident_flows.core.state import ApplyReport, OperatorState, RunnerSettings, RunnerState, RuntimeConfigError, SamplePage
from trident_flows.core.types import CPU, BatchSample, ClusterSpec, OpConfig, Outcome, Plan, Transition
from trident_flows.runtime.backpressure import items_bound
from trident_flows.runtime.spec import PipelineSpec
from trident_flows.sim.actor_start import ActorStart, NodeStarts
from trident_flows.sim.call_cost import CallCost
from trident_flows.sim.clock import EventQueue
from trident_flows.sim.cluster import SimCluster
from trident_flows.sim.operator import SimOperator
from trident_flows.sim.pool import SimPool, SimReplica
from trident_flows.sim.queues import SimQueue
from trident_flows.sim.rollout import apply_change
from trident_flows.sim.workload import ATTEMPTS, FEATURES, SRC, Stream

# Peak RSS of a replica actor process (Python, numpy, Ray worker): the smallest peak host memory
# a CPU replica reported in a committed live trace, 126 MiB.
ACTOR_RSS_BYTES = 126 * 2**20
# An emulated operator holds at most this much of a CPU batch's working set (EmulatedOperator's
# host_memory_cap_bytes default), so a CPU sample's peak host memory is capped the same way.
HOST_WORKING_SET_CAP = 64 * 2**20
# A batch refused by the device (OOM) returns after one device round trip, not after its kernel.
OOM_RETURN_S = 0.002
_BUCKET_S = 0.1
_NONE: frozenset[int] = frozenset()
_add_reduce = np.add.reduce


class _Counters:
    __slots__ = ("items_in", "items_out", "items_forwarded", "errors", "ooms", "reserved_items", "growth_items")

    def __init__(self) -> None:
        self.items_in = self.items_out = self.items_forwarded = self.errors = self.ooms = self.reserved_items = 0
        self.growth_items = 2.0  # conservative until measured, as the live runner starts


def _track(estimate: float, observed: float) -> float:
    """The live runner's growth estimate: jumps up to a larger observation, decays slowly down."""
    return max(observed, 0.9 * estimate + 0.1 * observed, 0.05)


class SimRunner:
    def __init__(self, spec: PipelineSpec, cluster: ClusterSpec, *, settings: RunnerSettings | None = None,
                 stream: Stream | None = None, node_loss: Sequence[tuple[float, int]] = (), name: str = "sim",
                 actor_start: ActorStart = ActorStart(), call_cost: CallCost = CallCost()) -> None:
        self.spec = spec
        self.settings = settings or RunnerSettings()
        self.name = name
        self.actor_start = actor_start
        self.call_cost = call_cost
        self._starts: dict[int, NodeStarts] = {}  # node index -> its actor starts under way
        self.events = EventQueue()
        costs = [SimOperator.from_spec(o, ()) for o in spec.operators]
        needed = sorted({f for c in costs for d in c.cost.devices.values() for f in d.feature_names()}
                        | {f for c in costs for f in c.cost.features})
        self.stream = stream if stream is not None else Stream.from_rows(spec.source(), needed)
        missing = [f for f in needed if f not in self.stream.features]
        if missing:
            raise ValueError(f"the input stream lacks feature(s) {missing} that the pipeline's cost models use")
        self.ops = [SimOperator.from_spec(o, self.stream.features) for o in spec.operators]
        self.names = [o.name for o in spec.operators]
        # before the first splitter, a batch holds at most one row of each input item
        self._one_row_per_source = [all(o.selectivity <= 1.0 for o in self.ops[:i]) for i in range(len(self.ops))]
        self.cluster = SimCluster(cluster)
        self.cluster_spec = cluster
        width = FEATURES + len(self.stream.features)
        self.pools = [SimPool(n, name, self.settings.max_inflight_per_replica) for n in self.names]
        self.queues = [SimQueue(width) for _ in self.names]
        self.counters = [_Counters() for _ in self.names]
        self._pending = np.zeros(1024, dtype=np.int32)   # rows still in the pipeline, per input item
        self._dead_src = np.zeros(1024, dtype=bool)
        self.samples_buf: collections.deque = collections.deque(maxlen=self.settings.sample_buffer)
        self.sample_seq = 0
        self.completions: collections.deque = collections.deque()  # [bucket start, input items done]
        self.items_in = self.rows_written = self.rows_dropped = self.rows_dead = 0
        self.inputs_done = self.inputs_dead = 0
        self.first_output_at: float | None = None
        self.last_output_at: float | None = None
        self.ooms = self.reconfigurations = 0
        self.apply_reports: list[ApplyReport] = []
        self.waiting: list[tuple[int, SimReplica]] = []   # replicas with no room yet (pending placement)
        self.finished = False
        self.finished_at = 0.0
        self.error = ""
        self.started = False
        self.streaming = False  # as live: no batch is sent before every initial replica is warm
        self.streamed_from = 0.0  # when streaming began (the initial replicas warm)
        self._gone_replica_s = [0.0 for _ in self.names]  # replica-seconds of replicas that left, since streaming began
        self._linger_armed = False
        self.input_closed = self.stream.done  # the stream has no rows left to feed (updated by _feed)
        self._lingering: set[int] = set()  # operators whose last dispatch held a partial batch back
        for t, node in node_loss:
            if not 0 <= node < len(self.cluster.nodes):
                raise ValueError(f"node_loss names node {node}, but the cluster has nodes 0..{len(self.cluster.nodes) - 1}")
            self.events.at(float(t), self._lose_node, node)

    # ------------------------------------------------------------------ lifecycle
    @property
    def now(self) -> float:
        return self.events.now

    def start(self) -> None:
        """Place the initial replicas and run the clock until they are warm, then stream."""
        if self.started:
            raise RuntimeError("simulated runner already started")
        self.started = True
        initial = []
        # GPU replicas first: they need the scarcer resource (a packing scheduler sees them all at once)
        for i, op in sorted(enumerate(self.spec.operators), key=lambda e: -e[1].config.gpus):
            for _ in range(op.replicas):
                initial.append(self._start_replica(i, op.config, canary=False))
        if self.waiting:
            i, r = self.waiting[0]
            raise RuntimeConfigError(f"operator {self.names[i]!r}: no node of the cluster has room for a replica of {r.config.label()} "
                                     f"(cpus={r.config.cpus:g}, gpus={r.config.gpus:g}); use a smaller initial placement or more nodes")
        self.events.run_until(max(r.requested_at for r in initial) + 1e9, stop=lambda: all(r.warm for r in initial))
        self.streaming, self.streamed_from = True, self.now
        self._dispatch()

    def run_until(self, t: float) -> None:
        """Advance the simulated clock to ``t`` (or until the run finishes)."""
        self.events.run_until(t, stop=lambda: self.finished)
        if not self.finished:
            self.events.now = max(self.events.now, t)

    # ------------------------------------------------------------------ replicas
    def _start_replica(self, i: int, config: OpConfig, canary: bool) -> SimReplica:
        op = self.ops[i]
        op.device(config.device)  # refuse a device without a cost model, naming the operator
        record = self.pools[i].new(config, canary, self.now)
        if not self._place(i, record):
            # as live: pinned to one node (runtime.pool.OperatorPool.start, hard node affinity), where Ray queues it
            record.pinned = self.cluster.pin(config)
            self.waiting.append((i, record))
        return record

    def _place(self, i: int, record: SimReplica) -> bool:
        op = self.ops[i]
        resident = op.resident_bytes(record.config.device)
        host = ACTOR_RSS_BYTES + (resident if record.config.device == CPU else 0)
        if record.pinned is not None and not record.pinned.alive:  # its node was lost: pinned again (Ray fails the actor, the runtime replaces it)
            record.pinned = self.cluster.pin(record.config)
        placement = self.cluster.place(record.config, record.actor_name, resident if record.config.device != CPU else 0, host,
                                       only=record.pinned)
        if placement is None:
            return False
        # requested_at stays the request: the live pool measures a cold start from it, waiting included
        record.placement, record.host_bytes = placement, host
        node = placement.node
        starts = self._starts.get(node.index)
        if starts is None:
            starts = self._starts[node.index] = NodeStarts(self.events, self.actor_start.cores(node.node_class.cpus), self.actor_start.cpu_s)
        constructor = self.actor_start.latency_s + op.cold_start_s(record.config.device)
        starts.begin(record, lambda: self.events.after(constructor, self._warm, i, record))
        return True

    def _warm(self, i: int, record: SimReplica) -> None:
        if record.dead:
            return
        record.warm, record.warm_at, record.cold_start_s = True, self.now, self.now - record.requested_at
        self.pools[i].mark_warm(record)
        for fn in record.on_warm:
            fn(record)
        self._dispatch()

    def _release(self, i: int, record: SimReplica) -> None:
        """A retired or lost replica gives its resources back; waiting replicas may now fit."""
        if record.placement is not None and record.placement.node.alive:
            self.cluster.release(record.placement, record.actor_name, record.config, record.host_bytes)
        record.placement = None
        self._gone_replica_s[i] += max(0.0, self.now - max(record.requested_at, self.streamed_from))
        self.pools[i].forget(record)
        self.waiting = [(j, r) for j, r in self.waiting if not r.dead]
        for j, r in list(self.waiting):
            if self._place(j, r):
                self.waiting.remove((j, r))

    def _take_back(self, i: int, record: SimReplica) -> list[np.ndarray]:
        """The batches ``record`` holds (queued at it and the one it serves), taken from it: its in-flight count is 0 after."""
        units = [u for u, _, _, _ in record.assigned]
        for _, reserve, _, _ in record.assigned:
            self.counters[i].reserved_items -= reserve
        record.assigned.clear()
        record.inflight = 0
        if record.serving:
            units.append(record.serving_unit)
            self.counters[i].reserved_items -= record.serving_reserve
            record.serving, record.serving_unit = False, None
        return units

    def stop(self, i: int, record: SimReplica, why: str) -> None:
        """Stop a replica that still holds batches (a retire past its timeout): as live, where the killed actor's batches
        fail with it, each batch it held goes back to its operator's queue (no operator error) and its resources are freed."""
        units = self._take_back(i, record)
        self._release(i, record)
        for unit in units:
            self._retry(i, unit, why, oom=False, count_error=False)

    def _lose_node(self, index: int) -> None:
        node = self.cluster.fail_node(index)
        for i, pool in enumerate(self.pools):
            for r in [r for r in pool.replicas.values() if r.placement is not None and r.placement.node is node]:
                units = self._take_back(i, r)
                r.placement = None
                self._release(i, r)
                for unit in units:
                    self._retry(i, unit, f"replica lost with node {index}", oom=False, count_error=False)
                if not r.draining and not self.finished:
                    self._start_replica(i, r.config, r.canary)
                for fn in r.on_idle:
                    fn(r)
        self._dispatch()

    # ------------------------------------------------------------------ streaming
    def _feed(self) -> bool:
        """Fill the first queue from the stream; True when rows were added."""
        q = self.queues[0]
        room = self._bound(0) - q.n_items
        if room <= 0 or self.input_closed:
            return False
        rows = self.stream.take(room)
        self.input_closed = self.stream.done
        if len(rows) == 0:
            return False
        first, top = self.items_in, self.items_in + len(rows)  # a stream numbers its items 0, 1, 2, ... in order
        if top > len(self._pending):
            size = max(top, 2 * len(self._pending))
            self._pending = np.concatenate([self._pending, np.zeros(size - len(self._pending), dtype=np.int32)])
            self._dead_src = np.concatenate([self._dead_src, np.zeros(size - len(self._dead_src), dtype=bool)])
        self._pending[first:top] = 1
        self.items_in += len(rows)
        q.push(rows, self.now)
        return True

    def _bound(self, j: int) -> int:
        """Queue ``j``'s bound in items, as live (``backpressure.items_bound``)."""
        if j == 0:
            return items_bound(self.settings, self.pools[0].slot_items)
        return items_bound(self.settings, self.pools[j].slot_items, self.pools[j - 1].slot_items, self.counters[j - 1].growth_items)

    def _upstream_idle(self, i: int) -> bool:
        if not self.input_closed:
            return False
        return all(len(self.queues[j]) == 0 and all(r.inflight == 0 for r in self.pools[j].replicas.values()) for j in range(i))

    def _dispatch(self, changed: int | None = None) -> None:
        """Send every batch the streaming rules allow (the live runner's dispatch round).

        ``changed``: the operator whose batch just came back. Only it (a replica and its
        reservation freed), the next operator (its queue grew), an operator that held a partial
        batch back (its linger may have run out) and, as queues drain, the operators before can
        send then; the others are skipped, as a full round would find nothing for them to send
        (a round over every operator after every batch took a third of an 8-node run's time).
        ``None``, or once the input is closed (an idle upstream lets partial batches go): all.
        """
        if self.finished or not self.streaming:
            return
        fed = self.queues[0].n_items < self._bound(0) and self._feed()
        n = len(self.ops)
        everyone = changed is None or self.input_closed
        lingering = _NONE
        if self._lingering:
            lingering, self._lingering = self._lingering, set()
        if everyone:
            top, low = n - 1, 0
        else:
            top = max((min(changed + 1, n - 1), *lingering))
            low = 0 if fed else min((changed, *lingering))
        linger_needed = False
        now = self.events.now
        taken = False  # the operator after the current one took from its queue: the current one may have room now
        for i in range(top, -1, -1):
            if not (everyone or taken or i == changed or i == changed + 1 or i in lingering or (i == 0 and fed)):
                if i < low:
                    break  # below every operator named above, only a queue that drained can let one send
                continue
            taken = False
            q, pool, c = self.queues[i], self.pools[i], self.counters[i]
            after = self.queues[i + 1] if i + 1 < n else None
            max_items = self._bound(i)
            after_max = self._bound(i + 1) if after is not None else 0
            while q.n_items:
                replica = pool.pick()
                if replica is None:
                    break
                size = replica.config.batch_size
                if not q.units and q.n_items < size:
                    full = q.n_items >= max_items
                    if not (full or now - q.oldest >= self.settings.linger_s or self._upstream_idle(i)):
                        linger_needed = True
                        self._lingering.add(i)
                        break
                # backpressure: the next queue plus the expected output of batches in flight stays under the bound
                if after is not None and (after.n_items or c.reserved_items) and \
                        after.n_items + c.reserved_items + q.peek_size(size) * c.growth_items > after_max:
                    break
                rows = q.take(size, now)
                taken = True
                self._launch(i, replica, rows)
                if i == 0:
                    self._feed()
        if linger_needed and not self._linger_armed:
            self._linger_armed = True
            self.events.after(self.settings.linger_s, self._linger_fired)

    def _linger_fired(self) -> None:
        self._linger_armed = False
        self._dispatch()

    def _launch(self, i: int, replica: SimReplica, rows: np.ndarray) -> None:
        c = self.counters[i]
        reserve = int(len(rows) * c.growth_items + 0.999)
        c.reserved_items += reserve
        before = replica.inflight
        replica.inflight += 1
        replica.assigned.append((rows, reserve, before + 1, self.pools[i].config_epoch))
        self.pools[i].load_changed(replica, before)
        if not replica.serving:
            self._serve(i, replica)

    def _serve(self, i: int, replica: SimReplica) -> None:
        rows, reserve, inflight, epoch = replica.assigned.popleft()
        replica.serving, replica.serving_unit, replica.serving_reserve = True, rows, reserve
        op, device = self.ops[i], replica.config.device
        sums = _add_reduce(rows[:, FEATURES:], 0)  # ndarray.sum without its Python wrapper: 8% of a run was this line
        seconds, work = op.batch_cost(device, rows, sums, self.stream.uniform_memory)
        start = self.now
        if device == CPU:
            held = min(work, HOST_WORKING_SET_CAP)
            end, dev_peak, host_peak, result = start + seconds + self.call_cost.cpu_extra_s(held), 0, ACTOR_RSS_BYTES + held, Outcome.OK
        else:
            kernel = replica.placement.devices[0].kernel(start, seconds, work)
            if kernel is None:
                end, dev_peak, host_peak, result = start + OOM_RETURN_S, 0, ACTOR_RSS_BYTES, Outcome.OOM
            else:
                end, dev_peak, host_peak, result = kernel[1] + self.call_cost.device_call_s, kernel[2], ACTOR_RSS_BYTES, Outcome.OK
        # the batch's config is the replica's when it was served (a RESIZE meanwhile changes the next batches only)
        self.events.at(end, self._done, i, replica, rows, sums, reserve, inflight, epoch, start, result, dev_peak, host_peak, replica.config)

    def _done(self, i: int, replica: SimReplica, rows: np.ndarray, sums: np.ndarray, reserve: int, inflight: int, epoch: int,
              start: float, result: Outcome, dev_peak: int, host_peak: int, config: OpConfig) -> None:
        if replica.dead or replica.serving_unit is not rows:
            return  # its node was lost: the batch was re-queued already
        op, now = self.ops[i], self.events.now
        replica.serving, replica.serving_unit = False, None
        replica.inflight -= 1
        self.pools[i].load_changed(replica, replica.inflight + 1)
        self.counters[i].reserved_items -= reserve
        busy = now - start
        replica.batches += 1
        replica.busy_s += busy
        self.sample_seq += 1
        if result is Outcome.OK:
            passed, dropped = op.route(rows)
            # the BatchSample is built when samples() reads it: a run without a policy never reads most of them
            self.samples_buf.append((self.sample_seq, (i, replica.replica_id, config, start, now, busy, len(rows),
                                                       len(passed) + len(dropped), sums, host_peak, dev_peak, result, epoch, inflight, "")))
            self._route(i, rows, passed, dropped)
        else:
            self.samples_buf.append((self.sample_seq, (i, replica.replica_id, config, start, now, busy, len(rows), 0, sums,
                                                       host_peak, 0, result, epoch, inflight,
                                                       f"DeviceOOMError: {op.name} batch of {len(rows)} does not fit the device (simulated)")))
            self._retry(i, rows, "OOM", oom=True)
        if replica.assigned:
            self._serve(i, replica)
        elif replica.inflight == 0:
            for fn in replica.on_idle:
                fn(replica)
        self._dispatch(i)
        self._check_finished()

    def _sample(self, fields: tuple) -> BatchSample:
        i, rid, config, start, end, busy, n, n_out, sums, host_peak, dev_peak, result, epoch, inflight, error = fields
        return BatchSample(self.names[i], rid, config, start, end, busy, n, n_out, self.ops[i].features(sums), host_peak, dev_peak,
                           result, epoch, inflight, error)

    def _route(self, i: int, rows: np.ndarray, passed: np.ndarray, dropped: np.ndarray) -> None:
        c = self.counters[i]
        last = i == len(self.ops) - 1
        n_in, n_passed, n_dropped = len(rows), len(passed), len(dropped)
        c.items_in += n_in
        c.items_out += n_passed + n_dropped
        c.growth_items = _track(c.growth_items, (n_passed + n_dropped) / max(1, n_in))
        if not last:
            c.items_forwarded += n_passed
            self.queues[i + 1].push(passed, self.events.now)
        if n_dropped:
            self.rows_dropped += n_dropped
            self.rows_written += n_dropped
        elif not last and n_passed == n_in:
            return  # every row goes on: no input item can have finished
        pending = self._pending
        src_in = rows[:, SRC].astype(np.int64)
        unique = self._one_row_per_source[i] and n_passed == n_in - n_dropped
        if not unique:  # rows of one input item (a splitter's children) may repeat an index: np.*.at counts each
            if n_passed != n_in - n_dropped:  # a splitter: children replace their parent in the count
                np.add.at(pending, passed[:, SRC].astype(np.int64), 1)
                np.subtract.at(pending, src_in, 1)
            if n_dropped:
                np.subtract.at(pending, dropped[:, SRC].astype(np.int64), 1)
            if last:
                np.subtract.at(pending, passed[:, SRC].astype(np.int64), 1)
        elif last:
            pending[src_in] -= 1
        else:
            pending[dropped[:, SRC].astype(np.int64)] -= 1
        if last:
            self.rows_written += n_passed
        if last or n_dropped:  # only then can an input item have finished
            self._count_done(src_in, unique)

    def _count_done(self, sources: np.ndarray, unique: bool = False) -> None:
        done = sources[self._pending[sources] == 0]
        if not unique:
            done = np.unique(done)
        if not len(done):
            return
        now = self.events.now
        self.inputs_done += len(done)
        if self.rows_dead:
            self.inputs_dead += int(self._dead_src[done].sum())
        if self.first_output_at is None:
            self.first_output_at = now
        self.last_output_at = now
        bucket = int(now / _BUCKET_S) * _BUCKET_S
        if self.completions and self.completions[-1][0] == bucket:
            self.completions[-1][1] += len(done)
        else:
            self.completions.append([bucket, len(done)])
            horizon = now - max(600.0, 4 * self.settings.dip_window_s)
            while self.completions and self.completions[0][0] < horizon:
                self.completions.popleft()

    def _retry(self, i: int, rows: np.ndarray, error: str, oom: bool, count_error: bool = True) -> None:
        """The live runner's retry: a failed batch is split in halves; a single item retries until
        ``max_attempts``, then goes to the dead-letter table."""
        c = self.counters[i]
        if count_error:
            c.errors += 1
        if oom:
            c.ooms += 1
            self.ooms += 1
        if len(rows) > 1 and count_error:
            mid = len(rows) // 2
            for half in (rows[:mid], rows[mid:]):
                self.queues[i].push_unit(half, self.now)
            return
        if len(rows) > 1:
            self.queues[i].push_unit(rows, self.now)
            return
        rows = rows.copy()
        rows[:, ATTEMPTS] += 1
        if rows[0, ATTEMPTS] >= self.settings.max_attempts:
            src = rows[:, SRC].astype(np.int64)
            self.rows_dead += 1
            self._dead_src[src] = True
            np.subtract.at(self._pending, src, 1)
            self._count_done(src)
        else:
            self.queues[i].push_unit(rows, self.now)

    def _check_finished(self) -> None:
        if not self.finished and self.input_closed and self.inputs_done >= self.items_in:
            self.finished, self.finished_at = True, self.now

    # ------------------------------------------------------------------ observation
    def state(self) -> RunnerState:
        now = self.now
        ops = []
        for i, pool in enumerate(self.pools):
            replicas = pool.snapshot(now)
            warm = [r for r in replicas if r.warm and not r.draining]
            c = self.counters[i]
            ops.append(OperatorState(self.names[i], replicas, self.queues[i].n_items, 0, c.items_in, c.items_out, pool.config_epoch,
                                     sum(r.busy_fraction for r in warm) / len(warm) if warm else 0.0, c.errors, c.ooms,
                                     c.items_forwarded))
        wall = self.wall_s
        done = self.rows_written + self.rows_dead
        return RunnerState(self.spec.name, tuple(ops), self.items_in, self.rows_written, self.rows_dead, self.rows_dropped,
                           self.rows_written, self.input_closed, self.finished, wall, done / wall if wall > 0 else 0.0,
                           self.cluster.total_cpus, self.cluster.total_gpus, self.reconfigurations, self.ooms, self.error)

    @property
    def wall_s(self) -> float:
        return self.finished_at if self.finished else self.now

    def replica_seconds(self) -> dict[str, float]:
        """Per operator, replica-seconds since streaming began: every replica, starting, warm or draining,
        from its request (or the start of streaming) until it left (or now)."""
        return {name: gone + sum(max(0.0, self.now - max(r.requested_at, self.streamed_from)) for r in pool.replicas.values())
                for name, gone, pool in zip(self.names, self._gone_replica_s, self.pools)}

    def samples(self, since: int = 0) -> SamplePage:
        picked = tuple(self._sample(fields) for seq, fields in self.samples_buf if seq > since)
        return SamplePage(picked, self.sample_seq)

    def _rate(self, start: float, end: float) -> float:
        if end <= start:
            return 0.0
        return sum(n for t, n in self.completions if start <= t < end) / (end - start)

    # ------------------------------------------------------------------ control
    def apply(self, change: Plan | Transition) -> ApplyReport:
        """Apply a Plan or a Transition on the simulated clock (``sim.rollout``)."""
        return apply_change(self, change)
