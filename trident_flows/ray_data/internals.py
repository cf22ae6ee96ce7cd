"""Every Ray Data internal that trident reads, in one place, pinned to one Ray version.

Contract:
- ``RAY_VERSION`` is the Ray release this module was written against; ``check_ray_version()``
  raises ``RayDataVersionError`` on any other, naming both versions and this module.
- ``plan_chain(ds)``: the logical plan as a list of operators, source first (not a single chain:
  ``ValueError`` naming the operator). ``is_source``, ``stage_view`` (a ``StageView`` of a
  ``map_batches`` / ``map`` / ``filter`` / ``flat_map`` operator, else None), ``is_all_to_all`` and
  ``op_name`` read one operator.
- ``source_dataset(ds, op)``: ``ds``'s plan cut after ``op``, read in a fixed order;
  ``in_memory_blocks(chain)``: the block references of an input already in the object store, in
  Ray Data's read order (None for a read).
- Block conversions are Ray Data's own (``batch_of``, ``rows_of``, ``block_of_batch``,
  ``block_of_rows``, ``arrow_of``, ``filter_mask``); ``import_conversions()`` imports the modules
  they use. Nothing else here needs Ray Data imported (``is_callable_class`` included).
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import numpy as np
import pyarrow as pa
import ray

RAY_VERSION = "2.60.0"


class RayDataVersionError(RuntimeError):
    """The installed Ray is not the release ``trident_flows.ray_data.internals`` reads."""


def check_ray_version() -> None:
    if ray.__version__ != RAY_VERSION:
        raise RayDataVersionError(
            f"trident_flows.ray_data reads Ray Data internals (the logical plan) of ray=={RAY_VERSION}, but ray=={ray.__version__} "
            f"is installed: install ray[data]=={RAY_VERSION} (the version pinned in pyproject.toml), or port "
            "trident_flows/ray_data/internals.py to this release and re-run tests/test_ray_data_internals.py")


def _ops() -> Any:
    from ray.data._internal.logical import operators

    return operators


def plan_chain(ds: Any) -> list[Any]:
    """The logical operators of ``ds``, source first (see the module docstring)."""
    check_ray_version()
    chain = []
    op = ds._logical_plan.dag
    while True:
        chain.append(op)
        deps = list(op.input_dependencies)
        if not deps:
            break
        if len(deps) > 1:
            raise ValueError(f"stage {op_name(op)!r} combines {len(deps)} datasets; only a single chain read -> stages can run under "
                             "trident: run the combination (union, zip, join) as its own Ray Data job and read its output")
        op = deps[0]
    return chain[::-1]


def op_name(op: Any) -> str:
    return str(getattr(op, "name", None) or type(op).__name__)


def is_source(op: Any) -> bool:
    """A read (``Read``, or ``ListFiles`` -> ``ReadFiles`` of the file-based readers) or ``from_*`` / cached input."""
    o = _ops()
    return isinstance(op, (o.Read, o.ReadFiles, o.ListFiles, o.InputData, o.AbstractFrom))


def is_all_to_all(op: Any) -> bool:
    from ray.data._internal.logical.operators.all_to_all_operator import AbstractAllToAll

    return isinstance(op, AbstractAllToAll) or type(op).__name__ in {"Join", "Aggregate", "StreamingRepartition"}


def is_callable_class(fn: Any) -> bool:
    # ray.data.block.CallableClass is ``type`` in this release (tests/test_ray_data_internals.py
    # checks it); reading it from there would import all of Ray Data in the caller
    return isinstance(fn, type)


# the modules the block conversions below import
_CONVERSION_MODULES = ("ray.data.block", "ray.data._internal.delegating_block_builder")


def import_conversions() -> None:
    """Import what the block conversions need (Ray Data, pandas included: 0.5-1 s of CPU per process)."""
    for name in _CONVERSION_MODULES:
        importlib.import_module(name)


@dataclass(frozen=True)
class StageView:
    """One Ray Data map stage as trident reads it from the logical plan.

    ``kind`` is ``map_batches``, ``map``, ``filter`` or ``flat_map``. ``fn`` is the user's UDF
    (a function or a callable class, then built with the constructor arguments). ``batch_size``
    is None when Ray Data would choose it (None or "auto"). ``initial_replicas`` /
    ``max_replicas`` come from the compute strategy (actor pool sizes, or task concurrency);
    ``actor_pool`` says whether it was an actor pool. ``ray_remote_args`` are the resources the
    user asked for (``num_cpus``, ``num_gpus``, ...). ``predicate`` is the expression of an
    expression-based ``filter`` (``fn`` is then None)."""

    kind: str
    name: str
    fn: Any
    fn_args: tuple = ()
    fn_kwargs: Mapping[str, Any] = field(default_factory=dict)
    fn_constructor_args: tuple = ()
    fn_constructor_kwargs: Mapping[str, Any] = field(default_factory=dict)
    batch_size: int | None = None
    batch_format: str = "numpy"
    zero_copy_batch: bool = True
    modifies_row_count: bool = True
    ray_remote_args: Mapping[str, Any] = field(default_factory=dict)
    has_remote_args_fn: bool = False
    initial_replicas: int | None = None
    max_replicas: int | None = None
    actor_pool: bool = False
    predicate: Any = None


_KINDS = {"MapBatches": "map_batches", "MapRows": "map", "Filter": "filter", "FlatMap": "flat_map"}


def stage_view(op: Any) -> StageView | None:
    """The map stage ``op`` as a ``StageView``; None for any other kind of operator."""
    o = _ops()
    kind = next((k for cls, k in _KINDS.items() if type(op) is getattr(o, cls)), None)
    if kind is None:
        return None
    from ray.data._internal.compute import ActorPoolStrategy, TaskPoolStrategy
    from ray.data.block import _apply_batch_format

    compute = op.compute
    initial = maximum = None
    if isinstance(compute, ActorPoolStrategy):
        initial = int(compute.initial_size)
        maximum = None if compute.max_size == float("inf") else int(compute.max_size)
    elif isinstance(compute, TaskPoolStrategy) and compute.size:
        initial = maximum = int(compute.size)
    batch_size = getattr(op, "batch_size", None)
    return StageView(
        kind=kind, name=op_name(op), fn=op.fn, fn_args=tuple(op.fn_args or ()), fn_kwargs=dict(op.fn_kwargs or {}),
        fn_constructor_args=tuple(op.fn_constructor_args or ()), fn_constructor_kwargs=dict(op.fn_constructor_kwargs or {}),
        batch_size=batch_size if isinstance(batch_size, int) else None,
        batch_format=_apply_batch_format(getattr(op, "batch_format", "default")) if kind == "map_batches" else "numpy",
        zero_copy_batch=bool(getattr(op, "zero_copy_batch", True)), modifies_row_count=bool(op.can_modify_num_rows),
        ray_remote_args=dict(op.ray_remote_args or {}), has_remote_args_fn=op.ray_remote_args_fn is not None,
        initial_replicas=initial, max_replicas=maximum, actor_pool=isinstance(compute, ActorPoolStrategy),
        predicate=getattr(op, "predicate_expr", None))


def source_dataset(ds: Any, op: Any) -> Any:
    """A Dataset of ``ds``'s plan ending at ``op`` (the stages after it left out), reading in a
    fixed order (``preserve_order``) so that a row's lineage id is the same on every read."""
    from ray.data._internal.logical.interfaces import LogicalPlan
    from ray.data.dataset import Dataset

    context = ds.context.copy()
    context.execution_options.preserve_order = True
    return Dataset(LogicalPlan(op, context), context, ds._in_stats)


def in_memory_blocks(chain: list[Any]) -> tuple[Any, ...] | None:
    """The block references of an input already in the object store, in read order (see the module docstring)."""
    o = _ops()
    if len(chain) == 0 or not isinstance(chain[0], (o.InputData, o.AbstractFrom)) or any(is_source(op) for op in chain[1:]):
        return None
    refs = []
    for bundle in chain[0].output_data() or ():
        if any(piece is not None for piece in bundle.slices):
            return None
        refs.extend(entry.ref for entry in bundle.blocks)
    return tuple(refs)


# ---------------------------------------------------------------------------- block conversions
def arrow_of(block: Any) -> pa.Table:
    """A Ray Data block (Arrow or pandas) as an Arrow table, converted as Ray Data converts it."""
    if isinstance(block, pa.Table):
        return block
    from ray.data.block import BlockAccessor

    return BlockAccessor.for_block(block).to_arrow()


def batch_of(table: pa.Table, batch_format: str, copy: bool) -> Any:
    """The batch a ``map_batches`` UDF gets for these rows (``copy``: ``zero_copy_batch=False``)."""
    from ray.data.block import BlockAccessor

    batch = BlockAccessor.for_block(table).to_batch_format(batch_format)
    if copy:
        if isinstance(batch, dict):
            batch = {k: np.array(v, copy=True) for k, v in batch.items()}
        elif hasattr(batch, "copy") and not isinstance(batch, pa.Table):
            batch = batch.copy()
    return batch


def rows_of(table: pa.Table) -> Iterable[dict[str, Any]]:
    """The rows a ``map`` / ``filter`` / ``flat_map`` UDF gets for these rows."""
    from ray.data.block import BlockAccessor

    return BlockAccessor.for_block(table).iter_rows(public_row_format=True)


def block_of_batch(batch: Any) -> pa.Table:
    """A ``map_batches`` UDF's output batch as the Arrow block Ray Data makes of it."""
    from ray.data.block import BlockAccessor

    return arrow_of(BlockAccessor.batch_to_block(batch))


def block_of_rows(rows: list[Mapping[str, Any]]) -> pa.Table:
    """A ``map`` / ``flat_map`` UDF's output rows as the Arrow block Ray Data makes of them."""
    from ray.data._internal.delegating_block_builder import DelegatingBlockBuilder

    builder = DelegatingBlockBuilder()
    for row in rows:
        builder.add(row)
    return arrow_of(builder.build())


def filter_mask(table: pa.Table, predicate: Any) -> np.ndarray:
    """Which rows of ``table`` an expression-based ``filter`` keeps (Ray Data evaluates the expression)."""
    from ray.data.block import BlockAccessor

    marker = "__trident_row_index"
    indexed = table.append_column(marker, pa.array(np.arange(table.num_rows), pa.int64()))
    kept = arrow_of(BlockAccessor.for_block(indexed).filter(predicate)).column(marker).to_numpy()
    mask = np.zeros(table.num_rows, dtype=bool)
    mask[kept] = True
    return mask


def is_async_udf(fn: Any) -> bool:
    call = fn.__call__ if is_callable_class(fn) else fn
    return inspect.iscoroutinefunction(call) or inspect.isasyncgenfunction(call)
