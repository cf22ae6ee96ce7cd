"""Memory safety of the Trident policy (scheduler/trident/safety.py): which configs are unsafe and why."""

from __future__ import annotations

from collections import deque

from builders import batch_sample

from trident_flows.core.types import OpConfig, Outcome
from trident_flows.scheduler.trident.operators import Operator, Operators
from trident_flows.scheduler.trident.safety import MemorySafety

GIB = 2**30
G1, G8, G16 = (OpConfig.make("gpu", batch_size=b) for b in (1, 8, 16))


class Bounds:
    """A config search reduced to what safety reads: each config's memory upper bound, and an 8 GiB limit."""

    def __init__(self, bounds: dict[OpConfig, float]) -> None:
        self.bounds = bounds

    def memory_bound(self, name: str, config: OpConfig) -> float | None:
        return self.bounds.get(config)

    def limit(self, config: OpConfig) -> float:
        return 8 * GIB


def _safety(bounds: dict[OpConfig, float], ran: list[tuple[OpConfig, Outcome]]) -> MemorySafety:
    ops = Operators(window=64)
    op = ops.ensure("embed")
    assert isinstance(op, Operator)
    op.window = deque(((k, batch_sample(operator="embed", config=c, outcome=o)) for k, (c, o) in enumerate(ran)), maxlen=64)
    return MemorySafety(ops, Bounds(bounds))


def test_a_small_batch_whose_extrapolated_bound_is_wide_is_safe_below_a_batch_that_ran_within_the_limit():
    bounds = {G1: 10 * GIB, G8: 3 * GIB, G16: 12 * GIB}
    assert _safety(bounds, [])._below_a_safe_batch("embed", G1) is False
    assert "memory upper bound 10240 MiB > limit 8192 MiB" in _safety(bounds, []).unsafe("embed", G1)
    assert _safety(bounds, [(G8, Outcome.OK)]).unsafe("embed", G1) is None
    # a larger batch is no evidence: its bound is over the limit, and so is one that ran out of memory
    assert _safety(bounds, [(G16, Outcome.OK)]).unsafe("embed", G1) is not None
    assert _safety(bounds, [(G8, Outcome.OOM)]).unsafe("embed", G1) is not None
    # another device's batch says nothing about this one
    assert _safety(bounds, [(OpConfig.make("cpu", batch_size=8), Outcome.OK)]).unsafe("embed", G1) is not None
    # nor does a safe smaller batch make a larger one safe
    assert _safety(bounds, [(G8, Outcome.OK)]).unsafe("embed", G16) is not None
