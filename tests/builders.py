"""Builders of the runner's state values and batch samples for tests, by name: every argument keyword-only,
with a default for what a test does not care about (a warm, idle replica; an operator with no replicas and an
empty queue; an unfinished pipeline ``p`` one second in, on 8 CPUs and no GPU; a one-item batch of operator
``op`` on replica ``r0`` that took its one second busy). A test names only the fields it sets."""

from __future__ import annotations

from typing import Mapping

from trident_flows.core.state import NodeState, OperatorState, ReplicaState, RunnerState
from trident_flows.core.types import BatchSample, OpConfig, Outcome

DEFAULT_CONFIG = OpConfig()


def replica_state(*, replica_id: str = "r0", actor_name: str | None = None, config: OpConfig, warm: bool = True, draining: bool = False,
                  canary: bool = False, inflight: int = 0, busy_fraction: float = 0.0, batches: int = 0, config_epoch: int = 0,
                  cold_start_s: float = 0.0, node_id: str = "", node_class: str = "") -> ReplicaState:
    """A ``ReplicaState``; ``actor_name`` defaults to the replica id."""
    return ReplicaState(replica_id, replica_id if actor_name is None else actor_name, config, warm, draining, canary, inflight,
                        busy_fraction, batches, config_epoch, cold_start_s, node_id, node_class)


def operator_state(*, name: str = "op", replicas: tuple[ReplicaState, ...] = (), queue_items: int = 0, queue_bytes: int = 0,
                   items_in: int = 0, items_out: int = 0, config_epoch: int = 0, busy_fraction: float = 0.0, errors: int = 0,
                   ooms: int = 0, items_forwarded: int = 0) -> OperatorState:
    """An ``OperatorState``."""
    return OperatorState(name, tuple(replicas), queue_items, queue_bytes, items_in, items_out, config_epoch, busy_fraction, errors, ooms,
                         items_forwarded)


def runner_state(*, pipeline: str = "p", operators: tuple[OperatorState, ...] = (), items_in: int = 0, items_written: int = 0,
                 items_dead_lettered: int = 0, items_dropped: int = 0, rows_written: int = 0, input_closed: bool = False,
                 finished: bool = False, wall_s: float = 1.0, throughput: float = 0.0, cluster_cpus: float = 8.0,
                 cluster_gpus: float = 0.0, reconfigurations: int = 0, ooms: int = 0, error: str = "",
                 nodes: tuple[NodeState, ...] = ()) -> RunnerState:
    """A ``RunnerState``."""
    return RunnerState(pipeline, tuple(operators), items_in, items_written, items_dead_lettered, items_dropped, rows_written, input_closed,
                       finished, wall_s, throughput, cluster_cpus, cluster_gpus, reconfigurations, ooms, error, tuple(nodes))


def batch_sample(*, operator: str = "op", replica_id: str = "r0", config: OpConfig = DEFAULT_CONFIG, start: float = 0.0,
                 end: float | None = None, busy_s: float = 1.0, items_in: int = 1, items_out: int | None = None,
                 features: Mapping[str, float] | None = None, peak_host_mem_bytes: int = 0, peak_device_mem_bytes: int = 0,
                 outcome: Outcome = Outcome.OK, config_epoch: int = 0, inflight: int = 1, error: str = "",
                 bytes_from_other_nodes: int = 0, runner_bytes: int = 0, bytes_read: int = 0) -> BatchSample:
    """A ``BatchSample``; ``end`` defaults to ``start + busy_s``, ``items_out`` to ``items_in`` (nothing dropped),
    ``features`` to none."""
    return BatchSample(operator, replica_id, config, start, start + busy_s if end is None else end, busy_s, items_in,
                       items_in if items_out is None else items_out, {} if features is None else features, peak_host_mem_bytes,
                       peak_device_mem_bytes, outcome, config_epoch, inflight, error, bytes_from_other_nodes, runner_bytes, bytes_read)
