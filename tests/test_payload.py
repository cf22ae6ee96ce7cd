"""The outline the runner routes by, and the rows a replica or the writer rebuilds from references."""

from __future__ import annotations

import time

import numpy as np
import pytest

from trident_flows.runtime.payload import LostPieces, Piece, assemble, check_batch, clean_row, fetch, outline, row_bytes
from trident_flows.runtime.spec import DROP, ERROR, rows_to_batch


def _batch() -> dict[str, np.ndarray]:
    return rows_to_batch([
        {"id": "a", "text": "kept", DROP: "", ERROR: ""},
        {"id": "b", "text": "filtered", DROP: "quality:too-short", ERROR: ""},
        {"id": "c", "text": "bad", DROP: "quality:too-short", ERROR: "corrupt PDF"},
        {"id": "c/1", "source_id": "c", "text": "child", DROP: None, ERROR: None},
    ])


def test_the_outline_routes_as_the_marks_say_an_error_before_a_drop():
    out = outline("parse", _batch())
    assert out.ids == ("a", "b", "c", "c/1")
    assert out.source_ids == (None, None, None, "c")
    assert out.drop == (False, True, False, False)  # an errored row is dead-lettered, not written as filtered
    assert out.error == ("", "", "corrupt PDF", "")
    assert out.nbytes == tuple(row_bytes(clean_row(_batch(), j)) for j in range(4))
    assert out.ref is None  # the runner adds the reference to the returned batch


def test_a_routed_row_keeps_its_drop_reason_only_when_it_was_filtered():
    batch = _batch()
    assert clean_row(batch, 0) == {"id": "a", "text": "kept", "source_id": None}
    assert clean_row(batch, 1)[DROP] == "quality:too-short" and ERROR not in clean_row(batch, 1)


def test_a_malformed_output_batch_is_refused_naming_the_operator():
    with pytest.raises(ValueError, match="operator 'ocr' returned a batch without the 'id' column"):
        check_batch("ocr", {"text": np.asarray(["x"])})
    with pytest.raises(ValueError, match="operator 'ocr' returned columns of different lengths"):
        check_batch("ocr", {"id": np.asarray(["a", "b"]), "text": np.asarray(["x"])})


def test_source_rows_sent_by_value_are_run_as_they_are():
    batch = rows_to_batch([{"id": "a"}])
    assert assemble(batch) is batch


def test_pieces_are_assembled_in_order_and_a_lost_one_is_named(ray_cluster):
    ray = ray_cluster

    @ray.remote(num_cpus=0)
    class Keeper:
        """Owns what it stores: its death loses the object, as a node's death would."""

        def store(self, batch):
            return [ray.put(batch)]

    first, second = ray.put(_batch()), ray.put(_batch())
    got = assemble([Piece(second, (3,)), Piece(first, (0, 1))])
    assert list(got["id"]) == ["c/1", "a", "b"]
    assert DROP in got and ERROR not in got
    keeper = Keeper.remote()
    [kept] = ray.get(keeper.store.remote({**_batch(), "payload": np.zeros((4, 2**20), np.uint8)}))  # in the object store
    ray.kill(keeper)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # until Ray has seen the owner die
        try:
            ray.get(kept, timeout=10)
        except ray.exceptions.ObjectLostError:
            break
        time.sleep(0.5)
    with pytest.raises(LostPieces) as lost:
        fetch([Piece(first, (0,)), Piece(kept, (3,))])
    assert lost.value.lost == (1,)
