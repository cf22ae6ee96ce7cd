"""The batches and rows a Ray Data UDF gets and gives under trident (trident_flows/ray_data/batches.py).

Each conversion done with pyarrow/numpy alone is checked against Ray Data's own (internals, the
installed Ray): the same numpy dtypes, values and writability in, the same Arrow IPC bytes out.
A Ray upgrade that changes Ray Data's conversion of plain data fails here.
"""

from __future__ import annotations

import datetime
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

pytest.importorskip("ray")

from trident_flows.ray_data import batches, internals  # noqa: E402
from trident_flows.ray_data.rows import ROW, decode_rows, encode_rows  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _plain_table() -> pa.Table:
    """Rows of every plain Arrow type, nulls included, decoded as a replica decodes them (one chunk per row)."""
    table = pa.table({
        "id": ["item-0", "item-1", None],
        "regime": pa.array(["short", "long", "scans"], pa.large_string()),
        "pages": [1.5, None, float("nan")],
        "score": pa.array([0.25, 1.5, -2.0], pa.float32()),
        "count": [1, None, 3],
        "small": pa.array([1, 2, 3], pa.int8()),
        "unsigned": pa.array([1, 2, 3], pa.uint32()),
        "flag": [True, False, None],
        "always": [True, False, True],
        "raw": [b"a", None, b"ccc"],
        "nothing": pa.nulls(3),
        "tags": [[1, 2], [], None],
        "meta": [{"a": 1, "b": "x"}, None, {"a": 3, "b": "z"}],
        "when": pa.array([datetime.datetime(2024, 1, 1), None, datetime.datetime(2024, 3, 1)], pa.timestamp("us")),
        "day": pa.array([datetime.date(2024, 1, 1), None, datetime.date(2024, 3, 1)], pa.date32()),
    })
    return decode_rows(encode_rows(table))


def _same_numpy(got: np.ndarray, want: np.ndarray) -> None:
    assert (got.dtype, got.shape, got.flags.writeable) == (want.dtype, want.shape, want.flags.writeable)
    if got.dtype == object:
        plain = lambda a: [v.tolist() if isinstance(v, np.ndarray) else v for v in a]  # noqa: E731
        assert repr(plain(got)) == repr(plain(want))
    else:
        np.testing.assert_array_equal(got, want)


def _same_block(got: pa.Table, want: pa.Table) -> None:
    assert got.schema.equals(want.schema, check_metadata=True), (got.schema, want.schema)
    assert encode_rows(got) == encode_rows(want)


# ---------------------------------------------------------------------------- in
@pytest.mark.parametrize("copy", [False, True])
def test_numpy_batches_are_what_ray_data_gives_the_udf(copy):
    table = _plain_table()
    assert table.column("id").num_chunks == 3  # several chunks, combined as Ray Data combines them
    got, want = batches.batch_of(table, "numpy", copy), internals.batch_of(table, "numpy", copy)
    assert list(got) == list(want)
    for name in want:
        _same_numpy(got[name], want[name])
    one_chunk = table.combine_chunks()  # a single chunk is converted without combining, as in Ray Data
    got, want = batches.batch_of(one_chunk, "numpy", copy), internals.batch_of(one_chunk, "numpy", copy)
    for name in want:
        _same_numpy(got[name], want[name])


def test_pyarrow_batches_and_rows_are_what_ray_data_gives_the_udf():
    table = _plain_table()
    assert batches.batch_of(table, "pyarrow", False) is table
    assert internals.batch_of(table, "pyarrow", False) is table  # Ray Data hands over the block itself
    got, want = list(batches.rows_of(table)), list(internals.rows_of(table))
    assert repr(got) == repr(want) and all(type(r) is dict for r in got)


def test_data_that_is_not_plain_goes_to_ray_datas_own_conversion():
    tensors = internals.block_of_batch({"vec": np.ones((2, 3), np.float32), "x": np.array([1.0, 2.0])})
    assert batches.has_extension_fields(tensors.schema)
    got, want = batches.batch_of(tensors, "numpy", False), internals.batch_of(tensors, "numpy", False)
    assert got["vec"].shape == (2, 3) and np.array_equal(got["vec"], want["vec"])
    assert [type(r["vec"]) for r in batches.rows_of(tensors)] == [np.ndarray, np.ndarray]
    import pandas as pd

    table = _plain_table()
    pd.testing.assert_frame_equal(batches.batch_of(table, "pandas", False), internals.batch_of(table, "pandas", False))


def test_rows_decoded_before_ray_data_registered_their_types_are_recognised():
    tensors = internals.block_of_batch({"vec": np.ones((2, 3), np.float32)})
    storage = pa.table({"vec": tensors.column("vec").chunk(0).storage})
    field = storage.schema.field("vec").with_metadata({b"ARROW:extension:name": b"ray.data.arrow_tensor_v2"})
    unregistered = storage.cast(pa.schema([field]))  # what a process that never imported Ray Data decodes
    assert batches.has_unregistered_extension(unregistered.schema) and batches.has_extension_fields(unregistered.schema)
    assert not batches.has_unregistered_extension(tensors.schema) and not batches.has_extension_fields(_plain_table().schema)


# ---------------------------------------------------------------------------- out
@pytest.mark.parametrize("column", [
    np.array([True, False, True]),
    np.array([1, 2, 3], np.int8),
    np.array([1, 2, 3], np.uint64),
    np.array([1, 2, 3]),
    np.array([1.0, np.nan, 3.0], np.float16),
    np.array([1.5, np.nan, -3.0], np.float32),
    np.array([1.5, np.inf, -3.0]),
    np.array(["a", "", "long text"]),
    np.array(["item-0", "item-1", ""], dtype=object),
], ids=lambda c: str(c.dtype))
def test_plain_numpy_outputs_become_the_blocks_ray_data_makes(column):
    batch = {"id": np.array(["a", "b", "c"], dtype=object), "value": column}
    _same_block(batches.block_of_batch(batch), internals.block_of_batch(batch))


@pytest.mark.parametrize("batch", [
    {"vec": np.ones((3, 2), np.float32)},                                # a tensor
    {"__value__": np.array([1, 2, 3])},                                  # Ray Data's tensor column name
    {"when": np.array(["2024-01-01"] * 3, dtype="datetime64[ms]")},      # datetimes
    {"mixed": np.array(["a", None, 3], dtype=object)},                   # Python objects
    {"listed": [1, 2, 3]},                                               # a list, not an array
    {"x": np.array([1.0, 2.0, 3.0]), "short": np.array([1, 2])},        # columns of different lengths
], ids=["tensor", "value-column", "datetime", "objects", "list", "ragged"])
def test_other_outputs_become_the_blocks_ray_data_makes(batch):
    try:
        want = internals.block_of_batch(batch)
    except Exception as exc:  # noqa: BLE001 - then trident must fail the batch the same way
        with pytest.raises(type(exc)):
            batches.block_of_batch(batch)
        return
    _same_block(batches.block_of_batch(batch), want)


def test_a_pyarrow_output_is_the_block_itself():
    table = _plain_table()
    assert batches.block_of_batch(table) is table and internals.block_of_batch(table) is table


@pytest.mark.parametrize("rows", [
    [{"id": "a", "n": 1, "x": 0.5, "ok": True, "raw": b"1"}, {"id": "b", "n": 2, "x": 1.5, "ok": False, "raw": b"2"}],
    [{"id": "a", "n": None}, {"id": "b", "n": 2}, {"id": None, "n": None}],   # nulls
    [{"id": "a"}, {"id": "b", "late": 1.0}, {"late": 2.0}],                  # columns appearing late, or missing
    [{"n": 1}, {"n": 2.5}],                                                   # ints and floats in one column
    [{"n": None}, {"n": None}],                                               # all null
    [{"flag": True}, {"flag": 2}],                                            # bools and ints: Ray Data pickles them
    [{"vec": np.ones(2)}, {"vec": np.zeros(2)}],                              # arrays
    [{"n": np.int64(1)}, {"n": np.int64(2)}],                                 # numpy scalars
], ids=["scalars", "nulls", "late-columns", "int-float", "all-null", "bool-int", "arrays", "numpy-scalars"])
def test_output_rows_become_the_blocks_ray_data_makes(rows):
    _same_block(batches.block_of_rows([dict(r) for r in rows]), internals.block_of_rows([dict(r) for r in rows]))


def test_no_rows_become_an_empty_block():
    assert batches.block_of_rows([]).equals(internals.block_of_rows([]))


# ---------------------------------------------------------------------------- in a replica
REPLICA = """
import sys
from ray import cloudpickle
from trident_flows.ray_data.stage import RayDataStage
from trident_flows.runtime.spec import ID
import numpy as np
config, views, blobs = cloudpickle.loads(open(sys.argv[1], "rb").read())
stage = RayDataStage(config, stages=views)
ids = np.array([f"r{k}" for k in range(len(blobs))], dtype=object)
rows = np.empty(len(blobs), dtype=object)
rows[:] = blobs
out = stage({ID: ids, "_ray_data_row": rows})
print(len(out[ID]), "ray.data" in sys.modules)
"""


def _run_replica(tmp_path: Path, ds) -> str:
    from ray import cloudpickle

    from trident_flows.ray_data import read_dataset
    from trident_flows.ray_data.pipeline import staged_rows

    plan = read_dataset(ds)
    plan.stage_input(tmp_path / "input")  # the input rows, encoded as the runner streams them
    blobs = [row[ROW] for row in staged_rows(str(tmp_path / "input"))]
    path = tmp_path / "replica.pkl"
    path.write_bytes(cloudpickle.dumps((plan.stages[0].config, plan.stages[0].views, blobs)))
    proc = subprocess.run([sys.executable, "-c", REPLICA, str(path)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


def test_a_replica_of_plain_stages_never_imports_ray_data(ray_cluster, tmp_path):
    from trident_flows.ray_data import load_function

    build = load_function(str(ROOT / "examples" / "ray_data_emulated.py") + ":build")
    assert _run_replica(tmp_path, build(synth=8, seed=1, time_scale=0.0)) == "8 False"


def test_a_replica_meeting_tensors_imports_ray_data_and_hands_them_over_as_ray_data_does(ray_cluster, tmp_path):
    import ray

    def norms(batch):
        return {"norm": np.linalg.norm(batch["vec"], axis=1)}  # a (2, 3) tensor, as Ray Data gives it

    table = internals.block_of_batch({"vec": np.arange(6, dtype=np.float32).reshape(2, 3)})
    assert _run_replica(tmp_path, ray.data.from_arrow(table).map_batches(norms)) == "2 True"
