"""Lineage: which input item of a batch an operator's output row came from.

Contract: ``parent_item(row, by_id)`` finds the input item by the row's id, by an id prefix (a
splitter's child ids are ``<parent>/<k>``), or by its ``source_id`` column, and refuses a row that
matches none with a message saying how to keep ids.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trident_flows.runtime.spec import ID, SOURCE_ID

if TYPE_CHECKING:
    from trident_flows.runtime.work_queue import Item


def parent_item(row: dict[str, Any], by_id: dict[str, "Item"]) -> "Item":
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
