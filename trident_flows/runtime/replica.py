"""One replica of an operator: a Ray actor that cold-starts the operator and measures each batch.

Contract:
- ``ReplicaActor(operator, replica_id, cls, params, config, device_prefix, device_namespace)``
  cold-starts ``cls(config=config, **params)``; ``ready()`` returns once warm with the cold-start
  seconds. The pool creates it with ``num_cpus=config.cpus``, ``num_gpus=config.gpus``.
- ``process(inputs)`` takes rows by value or ``payload.Piece``s (fetched here, never through the
  runner) and returns the reply (``wire.encode_reply``) and the output batch (``payload.stored``;
  None on failure). It never raises for a failing batch: the reply holds the outline, lost pieces,
  the error, and the measurements (busy seconds, items, workload features, peak host memory, peak
  device memory, outcome ok/error/oom). Only the process's death surfaces as a Ray error.
- ``stop()`` lets the operator release what it holds before the pool kills the actor.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Any, Mapping

import ray

from trident_flows.core.types import OpConfig, Outcome
from trident_flows.runtime import devices, peak_memory
from trident_flows.runtime.payload import LostPieces, Piece, Stored, assemble, outline, stored
from trident_flows.runtime.spec import ID, Batch, batch_len
from trident_flows.runtime.wire import Measured, encode_reply


def _peak_rss(fallback_start: int) -> int:
    """The batch's peak resident memory: the high-water mark reset before it, else the larger of the
    resident memory before and after it."""
    mark = peak_memory.high_water_bytes()
    if mark is not None:
        return mark
    import psutil

    return max(fallback_start, psutil.Process().memory_info().rss)


def _cuda() -> Any:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return torch.cuda
    return None


class Replica:
    """The body of a replica actor (see the module docstring)."""

    def __init__(self, operator: str, replica_id: str, cls: type, params: Mapping[str, Any], config: OpConfig,
                 device_prefix: str = devices.DEFAULT_PREFIX, device_namespace: str | None = None) -> None:
        devices.bind(device_prefix, device_namespace)
        self.operator = operator
        self.replica_id = replica_id
        self.config = config
        start = time.perf_counter()
        self.op = cls(config=config, **dict(params))
        self.cold_start_s = time.perf_counter() - start
        self.features_fn = getattr(self.op, "workload_features", None)

    def ready(self) -> dict[str, Any]:
        return {"replica_id": self.replica_id, "cold_start_s": self.cold_start_s, "pid": os.getpid(),
                "node_id": ray.get_runtime_context().get_node_id(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}

    @ray.method(num_returns=2)
    def process(self, inputs: list[dict[str, Any]] | list[Piece]) -> tuple[bytes, Stored | None]:
        try:
            batch = assemble(inputs)
        except LostPieces as exc:
            measured = Measured(time.time(), 0.0, 0, 0, {}, 0, 0, Outcome.ERROR, str(exc))
            return encode_reply(None, (), measured, str(exc), exc.lost), None
        items = batch_len(batch)
        input_ids = [str(i) for i in batch[ID]]
        features: dict[str, float] = {}
        if callable(self.features_fn):
            try:
                features = {str(k): float(v) for k, v in self.features_fn(batch).items()}
            except Exception:  # noqa: BLE001 - features are best effort; the batch itself decides the outcome
                features = {}
        import psutil

        rss_start = psutil.Process().memory_info().rss if not peak_memory.reset_peak() else 0
        cuda = _cuda()
        if cuda is not None:
            cuda.reset_peak_memory_stats()
        if hasattr(self.op, "last_device_peak_bytes"):
            self.op.last_device_peak_bytes = 0
        start_wall, start = time.time(), time.perf_counter()
        out: Batch | None = None
        outcome, error = Outcome.OK, ""
        try:
            out = self.op(batch)
        except Exception as exc:  # noqa: BLE001 - a failing batch is reported, not raised
            outcome = Outcome.OOM if devices.is_oom(exc) else Outcome.ERROR
            error = f"{type(exc).__name__}: {exc}"[:2000]
        busy = time.perf_counter() - start
        device_peak = int(getattr(self.op, "last_device_peak_bytes", 0) or 0)
        if cuda is not None:
            device_peak = max(device_peak, int(cuda.max_memory_allocated()))
        measured = Measured(start_wall, busy, items, batch_len(out) if out is not None else 0, features, _peak_rss(rss_start),
                            device_peak, outcome, error)
        if outcome != Outcome.OK or out is None:
            return encode_reply(None, input_ids, measured, error), None
        try:
            output = outline(self.operator, out)
        except ValueError as exc:  # a malformed output batch fails like an operator error
            return encode_reply(None, input_ids, measured, f"bad output batch: ValueError: {exc}"), None
        rows_bytes = sum(output.nbytes)
        value = stored(out, rows_bytes)
        return encode_reply(dataclasses.replace(output, stored_bytes=rows_bytes + value.filler_bytes), input_ids, measured), value

    def stop(self) -> None:
        close = getattr(self.op, "close", None)
        if callable(close):
            close()


ReplicaActor = ray.remote(max_restarts=0, max_task_retries=0)(Replica)
