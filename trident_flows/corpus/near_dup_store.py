"""The near-duplicate index of a whole curated corpus, persisted beside its table (``sidecar`` kind
``near_dup``), so a run catches near-duplicates of documents curated on earlier runs.

Contract:
- ``IndexSnapshot`` holds every document that reached the dedup operator in the runs up to a table
  version: ``ids``, their MinHash ``values`` (one row of ``num_perm`` uint64 each) and
  ``duplicate_of`` (the original the table's row names; "" for a kept document), with the
  ``threshold`` and ``num_perm`` it was built with.
- ``save(location, version, snapshot)`` / ``load(location, version)`` (None for a table never
  curated). ``check_settings(threshold, num_perm)`` refuses a run whose dedup settings differ from
  the snapshot's (its signatures would not compare), saying what to set.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trident_flows.corpus import sidecar
from trident_flows.corpus.location import Location

KIND = "near_dup"


@dataclass(frozen=True)
class IndexSnapshot:
    ids: tuple[str, ...]
    values: np.ndarray  # shape (len(ids), num_perm), uint64
    duplicate_of: tuple[str, ...]
    threshold: float
    num_perm: int

    def check_settings(self, threshold: float, num_perm: int) -> None:
        if (threshold, num_perm) != (self.threshold, self.num_perm):
            raise ValueError(f"the table's near-duplicate index was built with dedup.threshold={self.threshold:g}, "
                             f"dedup.num_perm={self.num_perm}; this run has threshold={threshold:g}, num_perm={num_perm}: "
                             f"set --quality dedup.threshold={self.threshold:g} --quality dedup.num_perm={self.num_perm}, "
                             "or curate into a new --table")


def save(location: Location, version: int, snapshot: IndexSnapshot) -> None:
    values = np.ascontiguousarray(snapshot.values, dtype=np.uint64).reshape(-1)
    offsets = np.arange(0, len(snapshot.ids) * snapshot.num_perm + 1, snapshot.num_perm, dtype=np.int32)
    table = pa.table({"id": pa.array(snapshot.ids, pa.string()),
                      "minhash": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.uint64())),
                      "duplicate_of": pa.array(snapshot.duplicate_of, pa.string())})
    table = table.replace_schema_metadata({"threshold": repr(snapshot.threshold), "num_perm": str(snapshot.num_perm)})
    sidecar.write(location, KIND, version, table)


def load(location: Location, version: int | None) -> IndexSnapshot | None:
    table = sidecar.read(location, KIND, version)
    if table is None:
        return None
    meta = table.schema.metadata or {}
    num_perm = int(meta[b"num_perm"])
    values = pc.list_flatten(table["minhash"]).to_numpy(zero_copy_only=False).astype(np.uint64).reshape(table.num_rows, num_perm)
    return IndexSnapshot(tuple(table["id"].to_pylist()), values, tuple(table["duplicate_of"].to_pylist()), float(meta[b"threshold"]),
                         num_perm)
