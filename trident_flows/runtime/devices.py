"""Emulated accelerators: one emulated device per logical GPU.

Contract:
- ``create_devices(prefix, namespace, capacity_bytes)`` creates one ``EmulatedDevice`` Ray actor
  per logical GPU of every alive node, named ``{prefix}:{node_id}:{gpu_id}``, owned by the caller
  and pinned to its node. The runner does this at start; a plain Ray Data run in the driver.
- In a replica, ``bind(prefix, namespace)`` says which devices to use and ``current_device()``
  returns the device of the GPU Ray gave it; replicas sharing a GPU share its device.
- A device runs one kernel at a time and holds its replicas' resident memory; a kernel whose
  resident + batch bytes exceed the capacity raises ``DeviceOOMError`` (``is_oom`` recognises it
  and ``torch.cuda.OutOfMemoryError``).
- ``node_cores()``: the caller node's core pool; emulated replicas holding a fraction of a CPU run
  their CPU work through it, so sharing replicas get no more CPU time than the cores give.
"""

from __future__ import annotations

import time
from typing import Any

import ray

DEFAULT_PREFIX = "trident-device"


class DeviceOOMError(RuntimeError):
    """The (emulated or real) accelerator ran out of memory for this batch."""


def is_oom(exc: BaseException) -> bool:
    """True for a device or host out-of-memory error, also when wrapped by Ray."""
    cause = getattr(exc, "cause", None)
    if cause is not None and cause is not exc and is_oom(cause):
        return True
    if isinstance(exc, (DeviceOOMError, MemoryError)):
        return True
    import sys

    torch = sys.modules.get("torch")
    oom_type = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None) if torch else None
    return bool(oom_type and isinstance(exc, oom_type))


@ray.remote(num_cpus=0, max_concurrency=1)
class EmulatedDevice:
    """One logical GPU: a memory capacity and one kernel at a time."""

    def __init__(self, key: str, capacity_bytes: int) -> None:
        self.key = key
        self.capacity = int(capacity_bytes)
        self.resident: dict[str, int] = {}
        self.kernels = 0
        self.busy_s = 0.0

    def hold(self, holder: str, resident_bytes: int) -> int:
        """Place a replica's resident memory (weights) on the device; OOM when it does not fit."""
        others = sum(v for k, v in self.resident.items() if k != holder)
        if others + resident_bytes > self.capacity:
            raise DeviceOOMError(f"{self.key}: cannot place {resident_bytes} resident bytes for {holder}: "
                                 f"{others} of {self.capacity} bytes already held")
        self.resident[holder] = int(resident_bytes)
        return others + int(resident_bytes)

    def release(self, holder: str) -> None:
        self.resident.pop(holder, None)

    def run(self, holder: str, batch_bytes: int, seconds: float) -> int:
        """Run one kernel: sleep ``seconds`` if resident + ``batch_bytes`` fit, else raise
        ``DeviceOOMError``. Returns the device memory in use during the kernel."""
        in_use = sum(self.resident.values()) + int(batch_bytes)
        if in_use > self.capacity:
            raise DeviceOOMError(f"{self.key}: batch needs {batch_bytes} bytes, {sum(self.resident.values())} resident, "
                                 f"capacity {self.capacity} bytes (CUDA out of memory, emulated)")
        start = time.perf_counter()
        time.sleep(max(0.0, seconds))
        self.kernels += 1
        self.busy_s += time.perf_counter() - start
        return in_use

    def info(self) -> dict[str, Any]:
        return {"key": self.key, "capacity": self.capacity, "resident": dict(self.resident), "kernels": self.kernels, "busy_s": self.busy_s}


@ray.remote(num_cpus=0)
class EmulatedCores:
    """The logical CPUs of one node: ``cores`` emulated CPU kernels at a time (the actor's
    ``max_concurrency``); more wait in Ray's queue."""

    def __init__(self, key: str, cores: int) -> None:
        self.key = key
        self.cores = int(cores)
        self.kernels = 0
        self.busy_s = 0.0

    def run(self, seconds: float) -> None:
        """Hold one core for ``seconds``."""
        start = time.perf_counter()
        time.sleep(max(0.0, seconds))
        self.kernels += 1
        self.busy_s += time.perf_counter() - start

    def info(self) -> dict[str, Any]:
        return {"key": self.key, "cores": self.cores, "kernels": self.kernels, "busy_s": self.busy_s}


CORES_NAMESPACE = "trident-cores"


def node_cores() -> Any:
    """The core pool of the node the caller runs on: an ``EmulatedCores`` actor running as many emulated CPU
    kernels at once as the node has logical CPUs (more queue). Created on first use, named per node, detached
    (replicas come and go; the pool outlives them and ends with the cluster) and shared by every pipeline on the
    node."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node_id = ray.get_runtime_context().get_node_id()
    cores = next((int(n.get("Resources", {}).get("CPU", 0)) for n in ray.nodes() if n.get("NodeID") == node_id), 0)
    name = f"cores:{node_id}"
    return EmulatedCores.options(name=name, namespace=CORES_NAMESPACE, lifetime="detached", get_if_exists=True,
                                 max_concurrency=max(1, cores),
                                 scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote(name, max(1, cores))


def device_name(prefix: str, node_id: str, gpu_id: int | str) -> str:
    return f"{prefix}:{node_id}:{gpu_id}"


def create_devices(prefix: str = DEFAULT_PREFIX, namespace: str | None = None, capacity_bytes: int = 16 * 2**30,
                   wait: bool = True) -> list[Any]:
    """Create one emulated device per logical GPU of every alive node (owned by the caller);
    ``wait=False`` returns at once (await ``h.info.remote()`` to know they are up).

    Each is pinned to its node with hard node affinity: with soft affinity Ray may put a node's device on
    another node, whose loss then fails every batch of the GPU node's replicas."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    handles = []
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        for gpu_id in range(int(node.get("Resources", {}).get("GPU", 0))):
            name = device_name(prefix, node["NodeID"], gpu_id)
            handles.append(EmulatedDevice.options(name=name, namespace=namespace, get_if_exists=True,
                                                  scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False))
                           .remote(name, capacity_bytes))
    if wait:
        ray.get([h.info.remote() for h in handles])
    return handles


_binding: dict[str, str | None] = {"prefix": DEFAULT_PREFIX, "namespace": None}


def bind(prefix: str, namespace: str | None) -> None:
    """Say which emulated devices this process (a replica) uses."""
    _binding["prefix"] = prefix
    _binding["namespace"] = namespace


def current_device() -> Any:
    """The emulated device of the GPU Ray assigned to the calling actor."""
    gpu_ids = ray.get_gpu_ids()
    if not gpu_ids:
        raise RuntimeError("this replica holds no GPU: give its OpConfig device='gpu' and gpus > 0")
    name = device_name(str(_binding["prefix"]), ray.get_runtime_context().get_node_id(), int(gpu_ids[0]))
    try:
        return ray.get_actor(name, namespace=_binding["namespace"])
    except ValueError as exc:
        raise RuntimeError(f"no emulated device {name!r}: create them first with "
                           "trident_flows.runtime.devices.create_devices()") from exc
