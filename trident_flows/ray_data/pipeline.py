"""A user's Ray Data pipeline as a trident ``PipelineSpec``: read it, refuse what cannot run, stage its input, publish its output.

Contract:
- ``read_dataset(ds, name=None) -> RayDataPipeline`` reads ``ds``'s logical plan (``internals``)
  without running anything: a read or ``from_*`` then ``map_batches`` / ``map`` / ``filter`` /
  ``flat_map`` stages. Anything else (all-to-all stages, other operators, async UDFs,
  ``ray_remote_args_fn``, other resources, unpicklable UDFs, no stage) raises ``RayDataPlanError``
  naming the stage and what to do.
- Each stage (or run of stages Ray Data would fuse, named ``a+b``) becomes one
  ``stage.RayDataStage`` operator named after its UDF in snake case; its initial config is what
  the user asked Ray Data for; trident may change replicas, batch size, and GPU -> CPU.
- ``stage_input(dir)`` keeps the read part's rows (``rows.ROW``) as Arrow IPC files, in read
  order; ``pipeline_spec(dir)`` streams them without Ray tasks (lineage ids ``row-000000000`` ...).
- ``publish(out_dir, dest=None)`` writes what ``ds.write_parquet(dest)`` would (default
  ``OUT/dataset``), one file per committed shard, atomically: re-running never duplicates rows.
"""

from __future__ import annotations

import functools
import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from trident_flows.core.types import CPU, GPU, ConfigSpace, OpConfig
from trident_flows.ray_data import internals
from trident_flows.ray_data.rows import ROW, decode_rows, encode_rows
from trident_flows.ray_data.stage import RayDataStage
from trident_flows.runtime.spec import DROP, ID, OperatorSpec, PipelineSpec

# Ray Data batches a stage without batch_size by whole blocks (up to 128 MiB); trident needs a
# row count to start from and tunes it. 32 is the GPU batch size of the project's own pipelines.
DEFAULT_BATCH_SIZE = 32
MAX_REPLICAS = 64
ALLOWED_REMOTE_ARGS = frozenset({"num_cpus", "num_gpus", "max_restarts", "max_task_retries", "retry_exceptions"})
_INPUT_GLOB = "block-*.arrow"


class RayDataPlanError(ValueError):
    """A Ray Data pipeline trident cannot take over; the message names the stage and what to do."""


@dataclass(frozen=True)
class RayDataStagePlan:
    """One stage of the user's pipeline and the trident operator it becomes."""

    operator: str
    views: tuple[internals.StageView, ...]
    config: OpConfig
    replicas: int
    space: ConfigSpace


@dataclass(frozen=True)
class RayDataPipeline:
    """A Ray Data pipeline read for trident (see the module docstring)."""

    name: str
    source: Any  # the Dataset of the read part alone
    source_name: str
    stages: tuple[RayDataStagePlan, ...]
    source_blocks: tuple[Any, ...] | None = None  # the input's block references when it is already in the object store

    def stage_input(self, directory: Path | str) -> int:
        """Run the read part with Ray Data and keep its rows in ``directory``, each already encoded
        as the runtime carries it (so the runner only reads bytes); returns the row count."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob(_INPUT_GLOB):
            old.unlink()
        rows = 0
        schema = pa.schema([(ROW, pa.binary())])
        for k, block in enumerate(self._input_blocks()):
            table = internals.arrow_of(block)
            if table.num_rows == 0:
                continue
            tmp = out / f".block-{k:06d}.{uuid.uuid4().hex}.tmp"
            with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
                writer.write_table(pa.table({ROW: pa.array(encode_rows(table), pa.binary())}))
            os.replace(tmp, out / f"block-{k:06d}.arrow")
            rows += table.num_rows
        return rows

    def _input_blocks(self) -> Iterator[Any]:
        """The input's blocks in Ray Data's read order. An input already in the object store (``from_items``,
        ``from_pandas``, ...: ``source_blocks``) is fetched as it is, giving the same rows and types without
        Ray Data's executor, whose start-up and the two actors it starts on a cluster's first run cost
        up to a second and two worker processes on a small machine."""
        if self.source_blocks is None:
            yield from self.source.iter_batches(batch_size=None, batch_format="pyarrow")
            return
        import ray

        for ref in self.source_blocks:  # one at a time: the driver holds one block beyond the object store's copy
            yield ray.get(ref)

    def pipeline_spec(self, directory: Path | str, items: int | None = None) -> PipelineSpec:
        """The ``PipelineSpec`` of this pipeline reading the input staged in ``directory``."""
        operators = tuple(OperatorSpec(s.operator, RayDataStage, s.config, s.replicas, {"stages": s.views}, s.space,
                                       min_replicas=1, max_replicas=max(MAX_REPLICAS, s.replicas)) for s in self.stages)
        return PipelineSpec(self.name, operators, functools.partial(staged_rows, str(Path(directory).resolve())), items)


def staged_rows(directory: str) -> Iterator[dict[str, Any]]:
    """The staged input rows in read order: ``{"id": "row-000000000", ROW: <the row>}``."""
    k = 0
    for path in sorted(Path(directory).glob(_INPUT_GLOB)):
        with pa.memory_map(str(path)) as source:
            reader = pa.ipc.open_file(source)
            for i in range(reader.num_record_batches):
                for blob in reader.get_batch(i).column(0).to_pylist():
                    yield {ID: f"row-{k:09d}", ROW: blob}
                    k += 1


# ---------------------------------------------------------------------------- reading the plan
def _snake(name: str) -> str:
    name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name)
    return re.sub(r"[^a-z0-9_]+", "_", name.lower()).strip("_")


def _udf_name(view: internals.StageView) -> str:
    fn = view.fn
    if fn is None:
        return view.kind
    base = getattr(fn, "func", fn)  # functools.partial
    name = getattr(base, "__name__", None) or type(base).__name__
    return view.kind if name == "<lambda>" else (_snake(name) or view.kind)


def _refuse(stage: str, problem: str, fix: str) -> RayDataPlanError:
    return RayDataPlanError(f"stage {stage!r}: {problem}; {fix}")


def _check_view(view: internals.StageView) -> None:
    if view.fn is not None and internals.is_async_udf(view.fn):
        raise _refuse(view.name, "its UDF is async (Ray Data runs it on an event loop with concurrent calls)",
                      "give it a synchronous __call__ to run it under trident, or run this stage in Ray Data")
    if view.has_remote_args_fn:
        raise _refuse(view.name, "it sets ray_remote_args_fn (resources chosen per worker at run time)",
                      "remove it: trident chooses each replica's resources; give num_cpus/num_gpus instead")
    other = sorted(set(view.ray_remote_args) - ALLOWED_REMOTE_ARGS)
    if other:
        raise _refuse(view.name, f"it asks Ray for {other}, which trident does not place replicas by (only num_cpus and num_gpus)",
                      "remove those arguments from the stage, or run it in Ray Data")
    from ray import cloudpickle

    try:
        cloudpickle.dumps((view.fn, view.fn_args, view.fn_kwargs, view.fn_constructor_args, view.fn_constructor_kwargs,
                           view.predicate))
    except Exception as exc:  # noqa: BLE001 - any pickling failure means the UDF cannot be rebuilt in a replica
        raise _refuse(view.name, f"its UDF or arguments cannot be pickled ({type(exc).__name__}: {exc})",
                      "pass what the UDF needs as constructor arguments it can rebuild from (paths, names), not live objects") from None


def _fusable(a: internals.StageView, b: internals.StageView) -> bool:
    """Ray Data fuses a task-pool stage into the next stage (task or actor pool) that asks for the
    same resources; trident runs such stages as one operator too (one replica set, no queue between)."""
    return not a.actor_pool and dict(a.ray_remote_args) == dict(b.ray_remote_args)


def _stage_plan(operator: str, views: tuple[internals.StageView, ...]) -> RayDataStagePlan:
    first = views[0]
    args = first.ray_remote_args
    gpus = float(args.get("num_gpus") or 0.0)
    cpus = float(args["num_cpus"]) if args.get("num_cpus") is not None else 1.0
    batch = next((v.batch_size for v in views if v.kind == "map_batches" and v.batch_size), DEFAULT_BATCH_SIZE)
    config = OpConfig(device=GPU if gpus > 0 else CPU, batch_size=batch, cpus=cpus, gpus=gpus)
    devices = (CPU, GPU) if gpus > 0 else (CPU,)
    resources = ((CPU, (cpus if cpus > 0 else 1.0, 0.0)), (GPU, (cpus, gpus if gpus > 0 else 1.0)))
    space = ConfigSpace(devices=devices, batch_size_min=1, batch_size_max=max(64, batch), resources=resources)
    sized = next((v for v in views if v.actor_pool), first)  # a fused run ends in at most one actor pool
    replicas = max(1, sized.initial_replicas or 1)
    return RayDataStagePlan(operator, views, config, replicas, space)


def read_dataset(ds: Any, name: str | None = None) -> RayDataPipeline:
    """Read ``ds``'s plan into a ``RayDataPipeline`` or refuse it (see the module docstring)."""
    from ray.data import Dataset

    if not isinstance(ds, Dataset):
        raise RayDataPlanError(f"expected a ray.data.Dataset, got {type(ds).__name__}: return the Dataset before its write "
                               "(ds.write_parquet(...) runs the pipeline at once and returns None)")
    chain = internals.plan_chain(ds)
    last_source = max((i for i, op in enumerate(chain) if internals.is_source(op)), default=-1)
    if last_source < 0:
        raise RayDataPlanError(f"the Dataset has no read or from_* operator ({[internals.op_name(o) for o in chain]})")
    for op in chain[:last_source + 1]:
        if not internals.is_source(op):
            raise _refuse(internals.op_name(op), "it comes before the read ends", "apply it after the read")
    groups: list[list[internals.StageView]] = []
    for op in chain[last_source + 1:]:
        view = internals.stage_view(op)
        if view is None:
            stage = internals.op_name(op)
            if internals.is_all_to_all(op):
                raise _refuse(stage, "it is an all-to-all operation (it needs the whole dataset at once) and cannot be streamed by trident",
                              "run the stages before it under trident with its output written to Parquet, then this operation "
                              "and what follows as a separate Ray Data job reading that output")
            raise _refuse(stage, f"trident takes over map_batches, map, filter and flat_map stages only, not {type(op).__name__}",
                          "express it as one of those (e.g. select_columns as a map_batches that returns the columns), "
                          "or run it in Ray Data before or after the trident run")
        _check_view(view)
        if groups and _fusable(groups[-1][-1], view):
            groups[-1].append(view)
        else:
            groups.append([view])
    stages: list[RayDataStagePlan] = []
    used: dict[str, int] = {}
    for group in groups:
        base = "+".join(_udf_name(v) for v in group)
        used[base] = used.get(base, 0) + 1
        stages.append(_stage_plan(base if used[base] == 1 else f"{base}_{used[base]}", tuple(group)))
    if not stages:
        raise RayDataPlanError("the Dataset has no map_batches/map/filter/flat_map stage after its read: there is nothing for trident to schedule")
    return RayDataPipeline(name or f"ray-data-{stages[0].operator}", internals.source_dataset(ds, chain[last_source]),
                           internals.op_name(chain[last_source]), tuple(stages), internals.in_memory_blocks(chain[:last_source + 1]))


# ---------------------------------------------------------------------------- output
def publish(out_dir: Path | str, dest: Path | str | None = None) -> dict[str, int]:
    """Write the kept rows of a finished run as Ray Data's Parquet output (see the module docstring)."""
    out = Path(out_dir)
    target = Path(dest) if dest is not None else out / "dataset"
    target.mkdir(parents=True, exist_ok=True)
    shards = sorted((out / "data").glob("shard=*.parquet"))
    names = {p.name for p in shards}
    for stale in target.glob("shard=*.parquet"):
        if stale.name not in names:
            stale.unlink()
    rows = files = 0
    for path in shards:
        columns = [c for c in (ROW, DROP) if c in pq.ParquetFile(path).schema_arrow.names]
        if ROW not in columns:
            continue
        data = pq.read_table(path, columns=columns)
        blobs = data.column(ROW).to_pylist()
        drops = data.column(DROP).to_pylist() if DROP in columns else [None] * len(blobs)
        kept = [b for b, d in zip(blobs, drops) if not d]
        final = target / path.name
        if not kept:
            final.unlink(missing_ok=True)
            continue
        table = decode_rows(kept)
        tmp = target / f".{path.name}.{uuid.uuid4().hex}.tmp"
        pq.write_table(table, tmp)
        os.replace(tmp, final)
        rows += table.num_rows
        files += 1
    return {"rows": rows, "files": files}
