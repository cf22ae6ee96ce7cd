"""What a pipeline is: operators, their initial configuration and search space, and a source.

Contract:
- A batch is a ``dict[str, numpy.ndarray]`` of equal-length columns (Ray Data's "numpy" format);
  column ``id`` (str) is mandatory and unique per input item.
- An operator is a callable class: ``cls(config: OpConfig, **params)`` is the cold start,
  ``instance(batch) -> batch`` processes one batch; it runs unchanged as a Ray Data
  ``map_batches`` UDF.
- Rows are never silently dropped: a filtered row gets ``_drop`` = reason (reaches the sink as
  filtered), a row failing on bad input ``_error`` = reason (dead-letter table); marked rows skip
  later operators. An exception fails the whole batch (retried, then isolated item by item).
- A splitter derives child ids ``f"{parent_id}/{k}"`` and keeps the input id in ``source_id``.
- ``workload_features(batch) -> dict[str, float]`` (optional): the batch's summed workload features.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Protocol, runtime_checkable

import numpy as np

from trident_flows.core.types import ConfigSpace, OpConfig

Batch = dict[str, np.ndarray]

ID = "id"
SOURCE_ID = "source_id"
DROP = "_drop"
ERROR = "_error"


@runtime_checkable
class Operator(Protocol):
    def __call__(self, batch: Batch) -> Batch: ...


@dataclass(frozen=True)
class OperatorSpec:
    """One stage of a pipeline: the operator class, its constructor params, where it starts
    (initial config and replica count), what the scheduler may change (``space``,
    ``min_replicas`` / ``max_replicas``), and its limits. ``run_params`` names the params that
    only name this run's resources (e.g. a shared index), not what the operator computes."""

    name: str
    cls: type
    config: OpConfig
    replicas: int = 1
    params: Mapping[str, Any] = field(default_factory=dict)
    space: ConfigSpace = field(default_factory=ConfigSpace)
    min_replicas: int = 1
    max_replicas: int = 64
    run_params: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise ValueError(f"operator name {self.name!r} must be non-empty and contain no '/'")
        if not (self.min_replicas <= self.replicas <= self.max_replicas):
            raise ValueError(f"operator {self.name!r}: replicas={self.replicas} must lie in [{self.min_replicas}, {self.max_replicas}]")

    def build(self, config: OpConfig | None = None) -> Operator:
        """Cold-start one instance in this process (what a replica actor does in ``__init__``)."""
        return self.cls(config=config or self.config, **dict(self.params))


@dataclass(frozen=True)
class PipelineSpec:
    """A named chain of operators fed by a source of input rows.

    ``source`` is a zero-argument callable returning an iterator of row dicts (each with a
    unique ``id``); it is re-callable so a pipeline can be run again from the start.
    ``items`` is the number of input rows when known (for progress bars).
    """

    name: str
    operators: tuple[OperatorSpec, ...]
    source: Callable[[], Iterator[dict[str, Any]]]
    items: int | None = None

    def __post_init__(self) -> None:
        if not self.operators:
            raise ValueError(f"pipeline {self.name!r} has no operators")
        names = [o.name for o in self.operators]
        if len(set(names)) != len(names):
            raise ValueError(f"pipeline {self.name!r} has duplicate operator names: {names}")

    def operator(self, name: str) -> OperatorSpec:
        for op in self.operators:
            if op.name == name:
                return op
        raise ValueError(f"unknown operator {name!r} in pipeline {self.name!r}; operators are {[o.name for o in self.operators]}")


def rows_to_batch(rows: Iterable[Mapping[str, Any]]) -> Batch:
    """Column-stack row dicts into a batch (object arrays for str / nested values)."""
    rows = list(rows)
    columns: dict[str, list[Any]] = {}
    for row in rows:
        for key in row:
            columns.setdefault(key, [])
    for row in rows:
        for key, values in columns.items():
            values.append(row.get(key))
    out: Batch = {}
    for key, values in columns.items():
        arr = np.empty(len(values), dtype=object)
        arr[:] = values
        if all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) for v in values):
            arr = np.asarray(values)
        out[key] = arr
    return out


def batch_len(batch: Batch) -> int:
    return len(batch[ID]) if ID in batch else (len(next(iter(batch.values()))) if batch else 0)
