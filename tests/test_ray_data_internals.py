"""The Ray Data internals trident reads (trident_flows/ray_data/internals.py), checked against the installed Ray.

These tests fail when a Ray upgrade changes the logical plan or the block conversions that
trident relies on: port internals.py to the new release, then update RAY_VERSION and the pin
in pyproject.toml together.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ray = pytest.importorskip("ray")

from ray.data import ActorPoolStrategy  # noqa: E402

from trident_flows.ray_data import internals  # noqa: E402


class Udf:
    def __init__(self, k: int, name: str = "") -> None:
        self.k = k

    def __call__(self, batch, extra=0):
        return batch


def keep(row):
    return True


def test_installed_ray_is_the_pinned_release_and_pyproject_pins_it():
    assert ray.__version__ == internals.RAY_VERSION, (
        f"Ray {ray.__version__} is installed but trident_flows/ray_data/internals.py reads Ray {internals.RAY_VERSION}: port it")
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    pins = re.findall(r'"ray\[[^\]]*\]==([0-9.]+)"', pyproject)
    assert pins == [internals.RAY_VERSION]
    internals.check_ray_version()


def test_a_version_mismatch_is_refused_naming_both_versions_and_the_module(monkeypatch):
    monkeypatch.setattr(ray, "__version__", "9.9.9")
    with pytest.raises(internals.RayDataVersionError, match=r"ray==2\.60\.0.*ray==9\.9\.9.*internals\.py"):
        internals.check_ray_version()


def test_the_logical_plan_of_each_stage_kind_reads_back_as_written(ray_cluster):
    ds = (ray.data.from_items([{"x": 1}])
          .map_batches(Udf, fn_args=(5,), fn_kwargs={"extra": 2}, fn_constructor_args=(3,), fn_constructor_kwargs={"name": "u"},
                       batch_size=16, batch_format="pandas", zero_copy_batch=False, compute=ActorPoolStrategy(min_size=2, max_size=5),
                       num_gpus=0.5, num_cpus=2)
          .filter(keep)
          .map(lambda r: r, concurrency=3)
          .flat_map(lambda r: [r]))
    chain = internals.plan_chain(ds)
    assert [type(op).__name__ for op in chain] == ["FromItems", "MapBatches", "Filter", "MapRows", "FlatMap"]
    assert internals.is_source(chain[0]) and not any(internals.is_source(op) for op in chain[1:])
    views = [internals.stage_view(op) for op in chain[1:]]
    assert internals.stage_view(chain[0]) is None
    mb, flt, mp, fm = views
    assert (mb.kind, mb.name, mb.fn) == ("map_batches", "MapBatches(Udf)", Udf)
    assert (mb.fn_args, dict(mb.fn_kwargs), mb.fn_constructor_args, dict(mb.fn_constructor_kwargs)) == ((5,), {"extra": 2}, (3,), {"name": "u"})
    assert (mb.batch_size, mb.batch_format, mb.zero_copy_batch) == (16, "pandas", False)
    assert (mb.initial_replicas, mb.max_replicas, mb.actor_pool) == (2, 5, True)
    assert dict(mb.ray_remote_args) == {"num_gpus": 0.5, "num_cpus": 2}
    assert not mb.has_remote_args_fn and internals.is_callable_class(mb.fn)
    assert (flt.kind, flt.fn, flt.predicate, flt.actor_pool) == ("filter", keep, None, False)
    assert (mp.kind, mp.initial_replicas, mp.max_replicas, mp.modifies_row_count) == ("map", 3, 3, False)
    assert fm.kind == "flat_map" and fm.modifies_row_count
    assert internals.stage_view(chain[1]).batch_format == "pandas"
    default = internals.stage_view(internals.plan_chain(ray.data.from_items([{"x": 1}]).map_batches(lambda b: b))[-1])
    assert (default.batch_size, default.batch_format, default.initial_replicas, default.actor_pool) == (None, "numpy", None, False)


def test_reads_are_sources_and_all_to_all_operations_are_recognised(ray_cluster, tmp_path):
    pq.write_table(pa.table({"id": [1, 2, 3]}), tmp_path / "a.parquet")
    parquet = internals.plan_chain(ray.data.read_parquet(str(tmp_path)))
    assert all(internals.is_source(op) for op in parquet)
    assert all(internals.is_source(op) for op in internals.plan_chain(ray.data.read_binary_files(str(tmp_path))))
    base = ray.data.from_items([{"id": 1, "g": 0}])
    for ds in (base.sort("id"), base.repartition(2), base.random_shuffle(), base.groupby("g").count()):
        assert internals.is_all_to_all(internals.plan_chain(ds)[-1])
    assert not internals.is_all_to_all(internals.plan_chain(base.map(keep))[-1])
    with pytest.raises(ValueError, match="combines 2 datasets"):
        internals.plan_chain(base.union(base))


def test_the_source_dataset_reads_only_the_input(ray_cluster):
    ds = ray.data.from_items([{"x": i} for i in range(5)]).map(lambda r: {"x": r["x"] * 10})
    source = internals.source_dataset(ds, internals.plan_chain(ds)[0])
    assert [r["x"] for r in source.take_all()] == [0, 1, 2, 3, 4]
    assert source.context.execution_options.preserve_order


def test_an_in_memory_input_gives_its_block_references_in_read_order(ray_cluster, tmp_path):
    ds = ray.data.from_items([{"x": i} for i in range(7)], override_num_blocks=3).map(keep)
    refs = internals.in_memory_blocks(internals.plan_chain(ds)[:1])
    assert len(refs) == 3
    assert [r["x"] for ref in refs for r in internals.arrow_of(ray.get(ref)).to_pylist()] == list(range(7))
    pq.write_table(pa.table({"id": [1]}), tmp_path / "a.parquet")
    read = internals.plan_chain(ray.data.read_parquet(str(tmp_path)))
    assert internals.in_memory_blocks(read) is None


def test_callable_classes_are_recognised_as_ray_data_recognises_them():
    from ray.data.block import CallableClass

    assert CallableClass is type  # internals.is_callable_class relies on it (so replicas need not import Ray Data for it)
    assert internals.is_callable_class(dict) and not internals.is_callable_class(len) and not internals.is_callable_class(dict())


def test_block_conversions_are_ray_datas_own(ray_cluster):
    table = pa.table({"id": ["a", "b", "c"], "x": pa.array([1.5, 2.5, 3.5], pa.float32())})
    batch = internals.batch_of(table, "numpy", copy=False)
    assert batch["x"].dtype == np.float32
    batch["vec"] = np.ones((3, 4), dtype=np.float32)
    block = internals.block_of_batch(batch)
    assert block.schema.field("x").type == pa.float32()
    assert "Tensor" in str(block.schema.field("vec").type)
    copied = internals.batch_of(table, "numpy", copy=True)
    copied["x"][0] = 9  # a copy is writable
    assert internals.batch_of(table, "pandas", copy=False)["x"].tolist() == [1.5, 2.5, 3.5]
    rows = list(internals.rows_of(table))
    assert rows[0] == {"id": "a", "x": 1.5}
    assert internals.block_of_rows([{"id": "a", "n": 1}, {"id": "b", "n": 2}]).to_pylist() == [{"id": "a", "n": 1}, {"id": "b", "n": 2}]
    from ray.data.expressions import col

    assert internals.filter_mask(table, col("x") > 2).tolist() == [False, True, True]
