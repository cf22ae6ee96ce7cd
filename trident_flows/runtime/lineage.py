"""Lineage: which input item an output row came from, and how a lost row is produced again.

Contract:
- ``parent_item(row, by_id)`` finds the input item by the row's id, by an id prefix (a
  splitter's child ids are ``<parent>/<k>``), or by its ``source_id`` column, and refuses a row that
  matches none with a message saying how to keep ids.
- ``leads_to(row_id, wanted)``: whether row ``row_id`` is the row ``wanted`` or one it descends from.
- ``reruns(items, outputs_of)``: rows of operator ``outputs_of`` whose stored object was lost with
  its node, grouped by their source item and the operator they must be produced up to; per
  group, the source item to run again from the first operator, keeping only the ``wanted`` rows
  (a row that is itself a re-run keeps its own ``wanted`` and ``upto``). Nothing is run here.
"""

from __future__ import annotations

from typing import Any

from trident_flows.runtime.spec import ID, SOURCE_ID
from trident_flows.runtime.work_queue import Item


def parent_item(row: dict[str, Any], by_id: dict[str, Item]) -> Item:
    """The input item an output row came from: same id, an id prefix (splitter), or ``source_id``."""
    rid = row[ID]
    if rid in by_id:
        return by_id[rid]
    prefix = rid
    while "/" in prefix:
        prefix = prefix.rsplit("/", 1)[0]
        if prefix in by_id:
            return by_id[prefix]
    source = row.get(SOURCE_ID)
    if source is not None and str(source) in by_id:
        return by_id[str(source)]
    raise ValueError(f"output row {rid!r} matches no input row of its batch: keep ids, or derive child ids as '<parent>/<k>'")


def leads_to(row_id: str, wanted: str) -> bool:
    """Whether the row ``row_id`` is the wanted row or one it was split from (child ids are ``<parent>/<k>``)."""
    return wanted == row_id or wanted.startswith(row_id + "/")


def reruns(items: list[Item], outputs_of: int) -> list[tuple[Item, list[Item]]]:
    """(source item to run again, the lost rows it stands for) per source item and depth (see the module docstring)."""
    groups: dict[tuple[int, int], list[Item]] = {}
    for item in items:
        upto = item.upto if item.wanted is not None else outputs_of
        groups.setdefault((id(item.origin), upto), []).append(item)
    out = []
    for group in groups.values():
        first = group[0]
        origin = first.origin
        assert origin is not None, "only rows an operator produced are held by reference"
        wanted = frozenset(w for it in group for w in (it.wanted if it.wanted is not None else {it.row[ID]}))
        upto = first.upto if first.wanted is not None else outputs_of
        out.append((Item(origin.row, origin.shard, origin.nbytes, origin.attempts, origin=origin, wanted=wanted, upto=upto), group))
    return out
