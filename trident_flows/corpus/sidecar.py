"""Files kept beside a corpus table, one per table version: ``TABLE/_corpus/KIND/v<version>.parquet``.

Contract:
- ``write(location, kind, version, table)`` writes the file whole (``Location.write_bytes``) before
  the table commit of ``version``; ``read(location, kind, version)`` returns the file a committed
  version has. So the files of a version are those of the commit that made it: a run that dies
  after writing them but before its commit leaves files of a version the table never reached,
  which the next run ignores and overwrites.
- Version 0 is the table's creation (no run): ``read`` gives None for it, and for a table that does
  not exist (``version`` None). A committed version > 0 without its file is a damaged table:
  ``SidecarMissing`` names the file and what to do.
"""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq

from trident_flows.corpus.location import Location

FOLDER = "_corpus"


class SidecarMissing(RuntimeError):
    """A committed table version whose sidecar file is missing."""


def path(kind: str, version: int) -> str:
    return f"{FOLDER}/{kind}/v{version:020d}.parquet"


def write(location: Location, kind: str, version: int, table: pa.Table) -> None:
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    location.write_bytes(path(kind, version), buffer.getvalue())


def read(location: Location, kind: str, version: int | None) -> pa.Table | None:
    if not version:
        return None
    rel = path(kind, version)
    if not location.exists(rel):
        raise SidecarMissing(f"{location.uri_of(rel)} is missing although the table is at version {version}: it was deleted by hand; "
                             f"restore it, or curate into a new --table")
    return pq.read_table(io.BytesIO(location.read_bytes(rel)))
