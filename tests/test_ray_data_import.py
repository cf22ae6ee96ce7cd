"""Ray Data pipelines under trident (trident_flows/ray_data): reading the plan, refusals, lineage, end-to-end output."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ray = pytest.importorskip("ray")

from ray import cloudpickle  # noqa: E402
from ray.data import ActorPoolStrategy  # noqa: E402

from trident_flows.core.types import CPU, GPU  # noqa: E402
from trident_flows.ray_data import RayDataPlanError, read_dataset, run_dataset  # noqa: E402
from trident_flows.ray_data.rows import ROW, decode_rows, encode_rows  # noqa: E402
from trident_flows.ray_data.stage import RayDataStage  # noqa: E402
from trident_flows.runtime.spec import DROP, ID, SOURCE_ID  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# the UDFs below travel to Ray workers by value (workers cannot import this test module)
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Score:
    def __init__(self, scale: float) -> None:
        self.scale = scale

    def __call__(self, batch):
        batch["score"] = (batch["x"] * self.scale).astype(np.float32)
        batch["vec"] = np.stack([batch["x"], -batch["x"]], axis=1).astype(np.float32)
        return batch


def big_enough(row) -> bool:
    return row["score"] > 2


def label(row):
    if row["id"] == 13:
        raise ValueError("row 13 is bad input")
    row["label"] = f"n{row['id']}"
    return row


def split(row):
    return [dict(row, part=k) for k in range(row["id"] % 3)]


def items(n: int = 40):
    return ray.data.from_items([{"id": i, "x": float(i)} for i in range(n)])


def pipeline(ds):
    return (ds.map_batches(Score, fn_constructor_args=(0.5,), batch_size=8, compute=ActorPoolStrategy(size=2))
            .filter(big_enough).map(label).flat_map(split))


def _batch(table: pa.Table, ids: list[str]) -> dict[str, np.ndarray]:
    blobs = np.empty(len(ids), dtype=object)
    blobs[:] = encode_rows(table)
    return {ID: np.array(ids, dtype=object), ROW: blobs}


def _stage(ds, **config):
    plan = read_dataset(ds)
    return plan, RayDataStage(plan.stages[-1].config, stages=plan.stages[-1].views)


# ---------------------------------------------------------------------------- plan and config
def test_each_stage_becomes_an_operator_configured_as_the_user_asked(ray_cluster):
    ds = (items().map_batches(Score, fn_constructor_args=(1.0,), batch_size=16, compute=ActorPoolStrategy(size=3), num_gpus=0.5)
          .filter(big_enough).map(label).map_batches(Score, fn_constructor_args=(2.0,), compute=ActorPoolStrategy(size=2), num_cpus=2)
          .map(label))
    plan = read_dataset(ds)
    assert [s.operator for s in plan.stages] == ["score", "big_enough+label", "score_2", "label"]
    first, fused, last, _ = plan.stages
    assert (first.config.device, first.config.gpus, first.config.cpus, first.config.batch_size, first.replicas) == (GPU, 0.5, 1.0, 16, 3)
    assert first.space.devices == (CPU, GPU) and dict(first.space.resources)[GPU] == (1.0, 0.5)
    assert (fused.config.device, fused.config.batch_size, fused.replicas, len(fused.views)) == (CPU, 32, 1, 2)
    assert (last.space.devices, last.config.batch_size, last.config.cpus, last.replicas) == ((CPU,), 32, 2.0, 2)
    spec = plan.pipeline_spec("/nonexistent")
    assert [o.name for o in spec.operators] == ["score", "big_enough+label", "score_2", "label"]
    # a task-pool stage fuses into the actor-pool stage after it, as Ray Data fuses them
    fused_into_actor = read_dataset(items().filter(big_enough).map_batches(Score, fn_constructor_args=(1.0,), compute=ActorPoolStrategy(size=3)))
    assert [(s.operator, s.replicas) for s in fused_into_actor.stages] == [("big_enough+score", 3)]


@pytest.mark.parametrize("make, stage, hint", [
    (lambda ds: ds.sort("id"), "Sort", "all-to-all"),
    (lambda ds: ds.repartition(4), "Repartition", "all-to-all"),
    (lambda ds: ds.groupby("id").count(), "Aggregate", "all-to-all"),
    (lambda ds: ds.random_shuffle(), "RandomShuffle", "all-to-all"),
    (lambda ds: ds.limit(5), "limit", "map_batches, map, filter and flat_map stages only"),
])
def test_stages_trident_cannot_stream_are_refused_naming_the_stage(ray_cluster, make, stage, hint):
    ds = make(items().map(label))
    with pytest.raises(RayDataPlanError, match=stage) as err:
        read_dataset(ds)
    assert hint in str(err.value) and ("separate Ray Data job" in str(err.value) or "run it in Ray Data" in str(err.value))


def test_udfs_trident_cannot_rebuild_and_unplaceable_resources_are_refused(ray_cluster):
    lock = threading.Lock()

    class Async:
        async def __call__(self, batch):
            return batch

    with pytest.raises(RayDataPlanError, match=r"Map\(<lambda>\).*cannot be pickled"):
        read_dataset(items().map(lambda r: (lock, r)[1]))
    with pytest.raises(RayDataPlanError, match=r"MapBatches\(Async\).*async"):
        read_dataset(items().map_batches(Async, compute=ActorPoolStrategy(size=1)))
    with pytest.raises(RayDataPlanError, match=r"\['resources'\].*only num_cpus and num_gpus"):
        read_dataset(items().map(label, resources={"tpu": 1}))
    with pytest.raises(RayDataPlanError, match="ray_remote_args_fn"):
        read_dataset(items().map_batches(lambda b: b, ray_remote_args_fn=lambda: {"num_cpus": 1}))
    with pytest.raises(RayDataPlanError, match="nothing for trident to schedule"):
        read_dataset(items())
    with pytest.raises(RayDataPlanError, match="return the Dataset before its write"):
        read_dataset(None)


def _staged(plan, directory: Path) -> list[bytes]:
    from trident_flows.ray_data.pipeline import staged_rows

    count = plan.stage_input(directory)
    blobs = [row[ROW] for row in staged_rows(str(directory))]
    assert count == len(blobs)
    return blobs


@pytest.mark.parametrize("make", [
    lambda: items(),
    lambda: ray.data.from_items([{"id": i, "v": [i, i + 1], "s": None if i % 3 else f"s{i}", "m": {"k": i}} for i in range(25)],
                                override_num_blocks=4),
    lambda: ray.data.from_pandas([__import__("pandas").DataFrame({"id": [1, 2], "f": np.array([1.5, 2.5], np.float32)}),
                                  __import__("pandas").DataFrame({"id": [3], "f": np.array([3.5], np.float32)})]),
    lambda: ray.data.from_arrow(pa.Table.from_batches([pa.record_batch({"id": [1, 2]}), pa.record_batch({"id": [3]})])),
    lambda: ray.data.from_numpy(np.arange(12, dtype=np.float32).reshape(4, 3)),
    lambda: items(30).materialize(),
], ids=["from_items", "from_items-nested", "from_pandas", "from_arrow", "from_numpy", "materialized"])
def test_an_input_already_in_the_object_store_is_staged_as_ray_data_reads_it_without_running_it(ray_cluster, tmp_path, make):
    import dataclasses

    plan = read_dataset(make().map(label))
    assert plan.source_blocks is not None
    reference = _staged(dataclasses.replace(plan, source_blocks=None), tmp_path / "through-ray-data")  # Ray Data's executor reads it

    def not_run(*args, **kwargs):
        raise AssertionError("the in-memory input was run through Ray Data's executor")

    plan.source.iter_batches = not_run
    assert _staged(plan, tmp_path / "fetched") == reference  # the same rows, in the same order, with the same Arrow types


def test_a_read_is_staged_through_ray_data(ray_cluster, tmp_path):
    pq.write_table(pa.table({"id": [1, 2, 3], "x": [1.0, 2.0, 3.0]}), tmp_path / "a.parquet")
    plan = read_dataset(ray.data.read_parquet(str(tmp_path / "a.parquet")).map(label))
    assert plan.source_blocks is None
    assert decode_rows(_staged(plan, tmp_path / "staged")).column("id").to_pylist() == [1, 2, 3]


# ---------------------------------------------------------------------------- lineage in one replica
def test_map_filter_and_flat_map_keep_every_rows_lineage(ray_cluster):
    table = pa.table({"id": [1, 2, 3], "x": [1.0, 5.0, 9.0]})
    _, flat = _stage(items().flat_map(split))
    out = flat(_batch(table, ["r1", "r2", "r3"]))
    assert list(out[ID]) == ["r1/0", "r2/0", "r2/1", "r3"]
    assert list(out[SOURCE_ID]) == ["r1", "r2", "r2", None]
    assert list(out[DROP]) == ["", "", "", "flat_map:FlatMap(split):no rows"]
    assert decode_rows(out[ROW][:3]).column("part").to_pylist() == [0, 0, 1]
    _, flt = _stage(items().map_batches(Score, fn_constructor_args=(0.5,)).filter(big_enough))
    marked = flt(_batch(pa.table({"id": [1, 2], "x": [1.0, 9.0], "score": pa.array([0.5, 4.5], pa.float32())}), ["a", "b"]))
    assert list(marked[DROP]) == ["filter:Filter(big_enough)", ""]
    _, scorer = _stage(items().map_batches(Score, fn_constructor_args=(0.5,)))
    scored = scorer(_batch(table, ["a", "b", "c"]))
    assert list(scored[ID]) == ["a", "b", "c"]
    result = decode_rows(scored[ROW])
    assert result.schema.field("score").type == pa.float32() and result.column("score").to_pylist() == [0.5, 2.5, 4.5]


def test_a_map_batches_changing_the_row_count_attributes_its_rows_to_the_batch(ray_cluster):
    def halve(batch):
        return {k: v[::2] for k, v in batch.items()}

    _, stage = _stage(items().map_batches(halve))
    out = stage(_batch(pa.table({"id": [1, 2, 3]}), ["a", "b", "c"]))
    assert list(out[ID]) == ["a/0", "a/1", "b", "c"]
    assert list(out[DROP])[2:] == ["map_batches:MapBatches(halve):2 rows out of 3"] * 2
    assert decode_rows(out[ROW][:2]).column("id").to_pylist() == [1, 3]


class Warm:
    """A UDF whose cold start records whether the replica was still readying its conversions meanwhile."""

    built: list = []

    def __init__(self) -> None:
        Warm.built.append(any(t.name == "trident-ray-data-warm-up" and t.is_alive() for t in threading.enumerate()))

    def __call__(self, batch):
        batch["score"] = batch["x"] * 2
        return batch


def test_a_replica_builds_its_udfs_while_its_conversions_get_ready(ray_cluster, monkeypatch):
    from trident_flows.ray_data import batches

    # readying the conversions (pyarrow importing pandas: 0.3 s of CPU) must overlap the UDFs' cold
    # start, not precede it nor be paid by the first batch: hold it until the UDF has been built,
    # then let the batch through
    ready, release = threading.Event(), threading.Event()
    run = batches.Warming._run

    def held_run(self) -> None:
        release.wait(60)
        run(self)
        ready.set()

    monkeypatch.setattr(batches.Warming, "_run", held_run)
    Warm.built.clear()
    _, stage = _stage(items().map_batches(Warm, compute=ActorPoolStrategy(size=1)))
    assert Warm.built == [True]  # built while the conversions were getting ready
    out: dict = {}
    call = threading.Thread(target=lambda: out.update(stage(_batch(pa.table({"id": [1, 2], "x": [1.0, 3.0]}), ["a", "b"]))))
    call.start()
    call.join(0.5)
    assert call.is_alive() and not out  # the first batch waits for them
    release.set()
    call.join(60)
    assert ready.is_set() and list(out[ID]) == ["a", "b"]
    assert decode_rows(out[ROW]).column("score").to_pylist() == [2.0, 6.0]


# ---------------------------------------------------------------------------- end to end
def _sorted_rows(table: pa.Table) -> list[str]:
    return sorted(repr(sorted(r.items())) for r in table.to_pylist())


def test_trident_writes_what_ray_data_writes_and_dead_letters_what_fails_it(ray_cluster, tmp_path):
    # Ray Data fails the whole job on row 13: the reference is Ray Data's output without it
    pipeline(items().filter(lambda r: r["id"] != 13)).write_parquet(str(tmp_path / "ray-data"))
    run = run_dataset(pipeline(items()), tmp_path / "trident", policy="static")
    expected, got = pq.read_table(tmp_path / "ray-data"), pq.read_table(run.dataset_dir)
    assert got.schema.equals(expected.schema)
    assert "Tensor" in str(got.schema.field("vec").type)  # the tensor column stays a Ray Data tensor, as Ray Data writes it
    assert _sorted_rows(got) == _sorted_rows(expected) and run.rows_published == expected.num_rows
    s = run.summary
    assert (s.items_in, s.items_missing, s.duplicate_ids, s.items_dead_lettered) == (40, 0, 0, 1)
    dead = pq.read_table(tmp_path / "trident" / "dead_letter").to_pylist()
    assert len(dead) == 1 and "row 13 is bad input" in dead[0]["error"] and dead[0]["operator"] == "big_enough+label+split"
    with pytest.raises(ray.exceptions.RayError, match="row 13 is bad input"):  # Ray Data's wrap of the UDF's ValueError
        pipeline(items()).write_parquet(str(tmp_path / "ray-data-fails"))


def test_the_emulated_example_is_the_native_emulated_docs_pipeline(ray_cluster):
    from trident_flows.pipelines.emulated_docs import build as native_build
    from trident_flows.ray_data import call_function, load_function

    ds = call_function(load_function(str(ROOT / "examples" / "ray_data_emulated.py") + ":build"), synth=50, seed=1)
    plan = read_dataset(ds)
    native = native_build(synth=50, seed=1)
    assert [s.operator for s in plan.stages] == [o.name for o in native.operators]
    for stage, op in zip(plan.stages, native.operators):
        assert (stage.config, stage.replicas, stage.space.devices) == (op.config, op.replicas, op.space.devices), op.name
        assert (stage.space.batch_size_min, stage.space.batch_size_max) == (op.space.batch_size_min, op.space.batch_size_max)
    assert plan.source.take_all() == list(native.source())  # the same input rows, in the same order


@pytest.mark.models
def test_a_real_document_pipeline_gives_the_same_rows_and_schema_as_ray_data(ray_cluster, tmp_path):
    from trident_flows.pipelines.synth_documents import generate
    from trident_flows.ray_data import load_function

    corpus = tmp_path / "corpus"
    generate(corpus, n=6, regimes="short:6", duplicates=0.0, broken=0.0, seed=3)
    build = load_function(str(ROOT / "examples" / "ray_data_documents.py") + ":build")
    build(str(corpus)).write_parquet(str(tmp_path / "ray-data"))
    run = run_dataset(build(str(corpus)), tmp_path / "trident", policy="static")
    expected, got = pq.read_table(tmp_path / "ray-data"), pq.read_table(run.dataset_dir)
    assert got.schema.equals(expected.schema)
    assert expected.num_rows >= 6 and got.num_rows == expected.num_rows
    key = lambda t: sorted(zip(t.column("doc_id").to_pylist(), t.column("chunk").to_pylist(), t.column("text").to_pylist(),  # noqa: E731
                               t.column("language").to_pylist(), t.column("embedding").to_pylist()))
    for (*a, ea), (*b, eb) in zip(key(expected), key(got)):
        assert a == b
        np.testing.assert_allclose(np.asarray(ea), np.asarray(eb), atol=1e-4)  # batch padding differs by a few ulps
    assert (run.summary.items_missing, run.summary.duplicate_ids) == (0, 0)


def test_cli_runs_module_function_pipelines(tmp_path):
    from ray_data_fast_example import TARGET  # the example at a tenth of its measured time

    script = f"""
import sys
sys.argv = ["trident-flows", "run", {TARGET!r}, "--synth", "30", "--cpus", "8",
            "--gpus", "1", "--policy", "static", "--out", {str(tmp_path / 'out')!r}, "--summary-json", {str(tmp_path / 's.json')!r}]
from trident_flows.cli import app
app()
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=400, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    import json

    summary = json.loads((tmp_path / "s.json").read_text())
    assert (summary["pipeline"], summary["items_in"], summary["items_missing"], summary["duplicate_ids"]) == ("ray-data-fast-example", 30, 0, 0)
    assert pq.read_table(tmp_path / "out" / "dataset").num_rows == 30
