"""Bytes an operator reads per item, and the share of them that crossed nodes, from its batch samples.

Contract:
- ``transfer_estimate(samples)`` is a ``Transfer`` over the samples that read stored batches
  (``BatchSample.bytes_read > 0``), whatever their outcome (a failed batch moved its bytes too):
  ``bytes_per_item`` = their bytes read / their input items, ``cross_node_share`` = their
  ``bytes_from_other_nodes`` / their bytes read, ``samples`` how many counted. ``None`` when no
  sample read a stored batch: the first operator (the runner sends its source rows by value),
  the simulator and traces recorded before samples counted bytes.
- Totals, not a mean of per-batch ratios: the network carries bytes, so a batch of many items
  weighs as much as its bytes.
- ``bytes_per_item`` is what the placement MILP's network rows take
  (``OperatorDemand.input_bytes_per_item``): which part crosses nodes depends on where the
  placement puts the operator and its upstream operator, so the MILP derives it per plan;
  ``cross_node_share`` is what the running placement measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from trident_flows.core.types import BatchSample


@dataclass(frozen=True)
class Transfer:
    """Stored-batch bytes an operator read per input item, and the share that came from another node."""

    bytes_per_item: float
    cross_node_share: float
    samples: int

    @property
    def cross_node_bytes_per_item(self) -> float:
        return self.bytes_per_item * self.cross_node_share


def transfer_estimate(samples: Iterable[BatchSample]) -> Transfer | None:
    """The operator's ``Transfer`` over ``samples`` (see the module docstring)."""
    read = remote = items = n = 0
    for s in samples:
        if s.bytes_read > 0 and s.items_in > 0:
            read += s.bytes_read
            remote += min(s.bytes_from_other_nodes, s.bytes_read)
            items += s.items_in
            n += 1
    if not n:
        return None
    return Transfer(read / items, remote / read, n)
