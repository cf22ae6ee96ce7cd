"""Routing one operator's output batch: each row to the next queue, the sink or the dead-letter table.

Contract: ``route(unit, out, node, op, operator, ledger, next_queue)`` routes the outline ``out`` of
batch ``unit`` (run by operator ``op`` on node ``node``, rows stored at ``out.ref``):
- every row is traced to its input item (``lineage.parent_item``) first, so a malformed batch
  raises ``ValueError`` and changes nothing;
- ``_error`` rows are dead-lettered; ``_drop`` rows and the last operator's rows are written; the
  rest join ``next_queue`` by reference, pending in their shard;
- an input item that produced no row is dead-lettered; a re-run item (``Item.wanted``) routes only
  the rows it was run for. Then each input item is no longer pending (its shard may commit), every
  written or dead-lettered row naming its source item (``Item.origin``).
Returns what came out (``Routed``), for the operator's counters and growth estimates.
"""

from __future__ import annotations

from dataclasses import dataclass

from trident_flows.runtime.lineage import leads_to, parent_item
from trident_flows.runtime.payload import Outline
from trident_flows.runtime.shards import ShardLedger
from trident_flows.runtime.spec import ID, SOURCE_ID
from trident_flows.runtime.work_queue import Item, Queue, Unit


@dataclass(frozen=True)
class Routed:
    rows_out: int
    forwarded: int
    in_bytes: int
    forwarded_bytes: int


def route(unit: Unit, out: Outline, node: str, op: int, operator: str, ledger: ShardLedger, next_queue: Queue | None) -> Routed:
    """Route the output rows of one batch (see the module docstring)."""
    by_id = {it.row[ID]: it for it in unit.items}
    rows = [{ID: rid} if sid is None else {ID: rid, SOURCE_ID: sid} for rid, sid in zip(out.ids, out.source_ids)]
    parents = [parent_item(row, by_id) for row in rows]  # validates before anything is routed
    continuing, produced = _place_rows(rows, parents, out, node, op, operator, ledger, last=next_queue is None)
    seen = {p.row[ID] for p in parents}
    for item in unit.items:
        ledger[item.shard].pending -= 1
        if item.row[ID] not in seen:
            ledger.dead_letter(item, operator, "operator returned no row for this item (rows must be marked, never dropped)", pending_delta=0)
        elif item.wanted is not None:
            for w in sorted(item.wanted - produced.get(id(item), set())):
                origin = item.origin or item
                ledger.dead_letter(Item({ID: w, SOURCE_ID: origin.row[ID]}, item.shard, 0, item.attempts, origin=origin), operator,
                                   "its output was lost with a node, and running its source item again did not produce it "
                                   f"(operator {operator!r} must keep ids or derive them as '<parent>/<k>')", pending_delta=0)
    for item in continuing:
        next_queue.push(item)
    for shard_id in {it.shard for it in unit.items}:
        ledger.maybe_commit(ledger[shard_id])
    return Routed(len(out), len(continuing), sum(it.nbytes for it in unit.items), sum(it.nbytes for it in continuing))


def _place_rows(rows: list[dict], parents: list[Item], out: Outline, node: str, op: int, operator: str, ledger: ShardLedger,
                last: bool) -> tuple[list[Item], dict[int, set[str]]]:
    """Dead-letter, write or keep (to forward) each output row; returns the rows kept and, per
    re-run input item (by ``id``), the wanted rows that came out."""
    continuing: list[Item] = []
    produced: dict[int, set[str]] = {}
    for j, (row, parent) in enumerate(zip(rows, parents)):
        wanted, upto = parent.wanted, parent.upto
        if wanted is not None:
            covered = {w for w in wanted if leads_to(row[ID], w)}
            if not covered:
                continue  # a row of a re-run source item that was not lost: it was routed the first time
            produced.setdefault(id(parent), set()).update(covered)
            if op >= upto:
                wanted = None  # the lost row itself: routed as it was the first time
        shard = ledger[parent.shard]
        item = Item(row, parent.shard, out.nbytes[j], 0, out.ref, j, node, parent.origin or parent, wanted, upto, out.stored_bytes)
        if out.error[j]:
            ledger.dead_letter(Item(row, parent.shard, 0, parent.attempts, origin=parent.origin or parent), operator, out.error[j],
                               pending_delta=0)
        elif out.drop[j] or last:
            ledger.write(shard, item, op, dropped=out.drop[j])
        else:
            continuing.append(item)
            shard.pending += 1
    return continuing, produced
