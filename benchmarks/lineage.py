"""Which input items a run lost: lineage from output and dead-letter ids back to input ids.

Contract: ``source_ids(ids)`` maps output ids to the input ids they came from (an emulated split
names a child ``{input id}/{k}``); ``items_lost(input_ids, output_ids, dead_ids)`` is the sorted
input ids that reached neither the output nor the dead-letter table. A scheduler may change how
fast items are curated, never which: the closed-loop benchmarks count these per run, target none.
"""

from __future__ import annotations

from typing import Iterable


def source_ids(ids: Iterable[str]) -> set[str]:
    """Input ids of output rows: an emulated split names a child ``{input id}/{k}``."""
    return {str(x).split("/", 1)[0] for x in ids}


def items_lost(input_ids: Iterable[str], output_ids: Iterable[str], dead_ids: Iterable[str]) -> list[str]:
    """Input ids that are neither in the output nor in the dead-letter table (by input id), sorted."""
    return sorted(set(map(str, input_ids)) - source_ids(output_ids) - source_ids(dead_ids))

