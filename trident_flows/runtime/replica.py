"""One replica of an operator: a Ray actor that cold-starts the operator and measures each batch.

Contract:
- ``ReplicaActor(operator, replica_id, cls, params, config, device_prefix, device_namespace)``
  cold-starts ``cls(config=config, **params)`` in ``__init__``; ``ready()`` returns once
  warm with the cold-start seconds. The pool creates it with ``num_cpus=config.cpus``,
  ``num_gpus=config.gpus``.
- ``process(inputs, inflight, epoch)`` takes a batch by value or a list of ``payload.Piece``
  (fetched here, node to node, never through the runner) and has two return values: a
  ``ReplicaResult`` and the output batch (``None`` when it failed), which stays in this node's
  object store, owned by the caller. It never raises for a failing batch: the result holds the
  output's ``payload.Outline`` (or ``None``; ``lost`` names input pieces whose object is gone),
  the error, and a ``BatchSample`` with busy
  seconds, items, workload features (the operator's optional ``workload_features(batch)``),
  peak host memory (RSS high-water during the batch: Linux ``clear_refs`` + ``VmHWM``, else
  psutil RSS), peak device memory (the operator's ``last_device_peak_bytes`` when it is
  emulated, ``torch.cuda.max_memory_allocated`` on real CUDA) and outcome ok/error/oom.
  Only the death of the process (crash, OOM kill, ``ray.kill``) surfaces as a Ray error.
- ``stop()`` lets the operator release what it holds (its ``close()``, e.g. emulated
  device memory) before the pool kills the actor.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Mapping

import ray

from trident_flows.runtime import devices
from trident_flows.runtime.payload import LostPieces, Outline, Piece, assemble, outline
from trident_flows.runtime.spec import Batch, batch_len
from trident_flows.core.types import BatchSample, OpConfig, Outcome


@dataclass(frozen=True)
class ReplicaResult:
    output: Outline | None
    sample: BatchSample
    error: str = ""
    lost: tuple[int, ...] = ()

    @property
    def ok(self) -> bool:
        return self.output is not None


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss(fallback_start: int) -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
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
    def process(self, inputs: Batch | list[Piece], inflight: int = 1, epoch: int = 0) -> tuple[ReplicaResult, Batch | None]:
        try:
            batch = assemble(inputs)
        except LostPieces as exc:
            sample = BatchSample(operator=self.operator, replica_id=self.replica_id, config=self.config, start=time.time(),
                                 end=time.time(), busy_s=0.0, items_in=0, items_out=0, outcome=Outcome.ERROR, config_epoch=epoch,
                                 inflight=inflight, error=str(exc))
            return ReplicaResult(None, sample, str(exc), exc.lost), None
        items = batch_len(batch)
        features: dict[str, float] = {}
        if callable(self.features_fn):
            try:
                features = {str(k): float(v) for k, v in self.features_fn(batch).items()}
            except Exception:  # noqa: BLE001 - features are best effort; the batch itself decides the outcome
                features = {}
        import psutil

        rss_start = psutil.Process().memory_info().rss if not _reset_peak_rss() else 0
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
        sample = BatchSample(operator=self.operator, replica_id=self.replica_id, config=self.config, start=start_wall,
                             end=start_wall + busy, busy_s=busy, items_in=items, items_out=batch_len(out) if out is not None else 0,
                             features=features, peak_host_mem_bytes=_peak_rss(rss_start), peak_device_mem_bytes=device_peak,
                             outcome=outcome, config_epoch=epoch, inflight=inflight, error=error)
        if outcome != Outcome.OK or out is None:
            return ReplicaResult(None, sample, error), None
        try:
            return ReplicaResult(outline(self.operator, out), sample), out
        except ValueError as exc:  # a malformed output batch fails like an operator error
            return ReplicaResult(None, sample, f"bad output batch: ValueError: {exc}"), None

    def stop(self) -> None:
        close = getattr(self.op, "close", None)
        if callable(close):
            close()


ReplicaActor = ray.remote(max_restarts=0, max_task_retries=0)(Replica)
