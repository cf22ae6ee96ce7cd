"""What one call of an emulated operator costs beyond the seconds its cost model gives.

Contract: ``CallCost(cpu_call_s, fill_s_per_byte, device_call_s)``; ``cpu_extra_s(held_bytes)``
is what a CPU batch that holds ``held_bytes`` of working set adds, ``device_call_s`` what a GPU
batch adds after its kernel. ``CallCost.none()`` adds nothing (the hand-computed cases).

The live code this mirrors: ``pipelines.emulated.EmulatedOperator.__call__``. A CPU batch first
fills its working set in host memory (``np.ones`` of up to ``host_memory_cap_bytes``: fresh pages,
written once) and marks its rows, then sleeps its modelled seconds; a GPU batch runs as a kernel
on its emulated device, another actor, so it adds a round trip to that actor. Neither is scaled by
the time scale (real work, not modelled seconds). The replica measures all of it in ``busy_s``.
"""

from __future__ import annotations

from dataclasses import dataclass

# Measured in the committed live traces recorded at load < 3 (busy seconds - modelled seconds per
# batch, median per operator). CPU: documents operators holding no working set 0.16-0.40 ms (the
# call's own Python: ids, feature sums, marks); video operators 0.96 ms (embed, 6.3 MiB held),
# 1.26 (motion, 8.0), 1.76 (dedup_frames, 14.8), 3.11 (scenes, 21.4), 7.89 (decode, 32.3),
# 14.05 (safety, 64): about 0.2 ms + 0.2 ms per MiB held. GPU: 2.62-3.12 ms (documents embed in 3
# traces, video text_detect).
CPU_CALL_S = 0.0002
FILL_S_PER_BYTE = 0.0002 / 2**20
DEVICE_CALL_S = 0.0027


@dataclass(frozen=True)
class CallCost:
    """An emulated operator call's cost beyond its modelled seconds (see the module docstring)."""

    cpu_call_s: float = CPU_CALL_S
    fill_s_per_byte: float = FILL_S_PER_BYTE
    device_call_s: float = DEVICE_CALL_S

    def __post_init__(self) -> None:
        if min(self.cpu_call_s, self.fill_s_per_byte, self.device_call_s) < 0:
            raise ValueError(f"CallCost: every cost must be >= 0, got {self}")

    @classmethod
    def none(cls) -> "CallCost":
        return cls(0.0, 0.0, 0.0)

    def cpu_extra_s(self, held_bytes: int) -> float:
        return self.cpu_call_s + self.fill_s_per_byte * held_bytes
