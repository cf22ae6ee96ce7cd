"""Simulated accelerators: memory capacity, resident memory per replica, one kernel at a time.

Contract (the simulated twin of ``runtime.devices.EmulatedDevice``):
- ``hold(holder, bytes)`` places a replica's resident memory (its weights); it returns False,
  placing nothing, when the others' resident bytes plus these exceed the capacity (a replica
  that cannot hold its weights fails its cold start, as the emulated device's OOM does).
- ``kernel(now, seconds, batch_bytes)`` runs one batch's kernel after the kernels already
  queued on the device (kernels never overlap). When resident + ``batch_bytes`` exceed the
  capacity it returns ``None`` (an OOM: the batch fails at once, nothing runs); otherwise
  ``(start, end, bytes in use)``.
- ``gpu_share`` is the fraction of the device that replicas have claimed (fractional GPUs).
"""

from __future__ import annotations


class SimDevice:
    def __init__(self, key: str, capacity_bytes: int) -> None:
        self.key = key
        self.capacity = int(capacity_bytes)
        self.resident: dict[str, int] = {}
        self.gpu_share = 0.0
        self.busy_until = 0.0
        self.busy_s = 0.0
        self.kernels = 0
        self.ooms = 0

    @property
    def resident_bytes(self) -> int:
        return sum(self.resident.values())

    def hold(self, holder: str, resident_bytes: int) -> bool:
        others = sum(v for k, v in self.resident.items() if k != holder)
        if others + resident_bytes > self.capacity:
            return False
        self.resident[holder] = int(resident_bytes)
        return True

    def release(self, holder: str) -> None:
        self.resident.pop(holder, None)

    def kernel(self, now: float, seconds: float, batch_bytes: int) -> tuple[float, float, int] | None:
        in_use = self.resident_bytes + int(batch_bytes)
        if in_use > self.capacity:
            self.ooms += 1
            return None
        start = max(now, self.busy_until)
        end = start + max(0.0, seconds)
        self.busy_until = end
        self.busy_s += end - start
        self.kernels += 1
        return start, end, in_use
