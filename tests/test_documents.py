"""The real document operators on a tiny generated corpus, chained in this process."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from trident_flows.core.types import OpConfig
from trident_flows.pipelines.doc_dedup import release_index
from trident_flows.pipelines.doc_embed import EMBEDDING_DIM
from trident_flows.pipelines.doc_filters import NearDuplicates, minhash_values
from trident_flows.pipelines.doc_parse import ParsePdf
from trident_flows.pipelines.doc_rows import OPERATOR_NAMES
from trident_flows.pipelines.documents import build, run_in_process
from trident_flows.pipelines.synth_documents import generate
from trident_flows.runtime.spec import DROP, ERROR, rows_to_batch

# Seed 1 gives, in six documents: a near-duplicate, a low-quality (repetitive) file, a
# truncated file and a two-page scan; checked by ``test_corpus_has_every_case``.
CORPUS = dict(n=6, regimes="short:4,scans:2", duplicates=0.17, broken=0.17, seed=1)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, pd.DataFrame]:
    out = tmp_path_factory.mktemp("docs")
    return out, generate(out, **CORPUS)


@pytest.fixture(scope="module")
def output(corpus) -> pd.DataFrame:
    spec = build(input=corpus[0])
    batch = run_in_process(spec, batch_size=4)
    release_index(spec.operator("dedup").params["index_name"])
    return pd.DataFrame({k: list(v) for k, v in batch.items()}).set_index("id")


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z]+", text.lower()) if len(w) >= 4}


def test_corpus_has_every_case(corpus):
    kinds = list(corpus[1].kind)
    assert any(k.startswith("duplicate-of:") for k in kinds)
    assert any(k.startswith("broken:") for k in kinds)
    assert any(k.startswith("low-quality:") for k in kinds)
    assert corpus[1].scanned_pages.sum() > 0


@pytest.mark.models
def test_every_input_is_accounted_for_exactly_once(corpus, output):
    assert sorted(output.index) == sorted(corpus[1].id)
    assert output.index.is_unique
    for doc_id, row in output.iterrows():
        assert not (row[DROP] and row[ERROR]), doc_id


@pytest.mark.models
def test_ocr_reads_the_words_drawn_on_scanned_pages(corpus, output):
    scans = corpus[1][(corpus[1].scanned_pages > 0) & ~corpus[1].kind.str.startswith("broken")]
    assert len(scans) > 0
    for _, doc in scans.iterrows():
        row = output.loc[doc.id]
        assert row.ocr_pages == doc.scanned_pages
        found = _words(row.text)
        for drawn in doc.scanned_words:
            expected = _words(drawn)
            assert len(expected & found) >= 0.75 * len(expected), (doc.id, sorted(expected - found))


@pytest.mark.models
def test_near_duplicate_is_marked_and_original_kept(corpus, output):
    dups = corpus[1][corpus[1].kind.str.startswith("duplicate-of:")]
    for _, doc in dups.iterrows():
        original = doc.kind.split(":", 1)[1]
        assert output.loc[doc.id, DROP] == f"duplicate-of:{original}"
        assert output.loc[doc.id, "duplicate_of"] == original
        assert output.loc[original, DROP] == "" and output.loc[original, "duplicate_of"] == ""


@pytest.mark.models
def test_broken_file_is_dead_lettered_with_a_reason(corpus, output):
    broken = corpus[1][corpus[1].kind.str.startswith("broken:")]
    assert len(broken) > 0
    for doc_id in broken.id:
        assert output.loc[doc_id, ERROR].startswith("corrupt PDF"), output.loc[doc_id, ERROR]
    ok = corpus[1][corpus[1].kind == "ok"]
    assert (output.loc[list(ok.id), ERROR] == "").all()


@pytest.mark.models
def test_low_quality_is_dropped_and_good_documents_are_kept(corpus, output):
    assert {"low-quality", "ok"} <= {k.split(":", 1)[0] for k in corpus[1].kind}
    for _, doc in corpus[1].iterrows():
        row = output.loc[doc.id]
        if doc.kind.startswith("low-quality:"):
            assert row[DROP].startswith("quality:"), (doc.id, row[DROP])
        elif doc.kind == "ok":
            assert row[DROP] == "" and row.language == doc.language and row.pages == doc.pages


@pytest.mark.models
def test_kept_documents_have_384_dimensional_chunk_embeddings(corpus, output):
    kept = output[(output[DROP] == "") & (output[ERROR] == "")]
    assert len(kept) >= 3
    for _, row in kept.iterrows():
        assert row.chunks == len(row.embeddings) > 0
        vectors = np.asarray(row.embeddings, dtype=np.float32)
        assert vectors.shape == (row.chunks, EMBEDDING_DIM)
        assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-3)
    assert all(len(e) == 0 for e in output[output[DROP] != ""].embeddings)


def test_parse_names_why_each_broken_file_failed(tmp_path):
    manifest = generate(tmp_path, n=3, regimes="short:3", duplicates=0.0, broken=1.0, seed=3)
    assert sorted(manifest.kind) == ["broken:encrypted", "broken:not-a-pdf", "broken:truncated"]
    batch = rows_to_batch([{"id": r.id, "path": str(tmp_path / r.path)} for r in manifest.itertuples()]
                          + [{"id": "missing", "path": str(tmp_path / "missing.pdf")}])
    out = ParsePdf(OpConfig.make())(batch)
    reasons = dict(zip(out["id"], out[ERROR]))
    kinds = dict(zip(manifest.id, manifest.kind))
    for doc_id, kind in kinds.items():
        expected = "encrypted PDF" if kind == "broken:encrypted" else "corrupt PDF"
        assert reasons[doc_id].startswith(expected), (kind, reasons[doc_id])
    assert reasons["missing"].startswith("missing file")


def test_synth_is_deterministic_by_seed(tmp_path):
    args = dict(n=3, regimes="short:2,scans:1", duplicates=0.0, broken=0.0)
    a = generate(tmp_path / "a", seed=7, **args)
    b = generate(tmp_path / "b", seed=7, **args)
    generate(tmp_path / "c", seed=8, **args)
    pd.testing.assert_frame_equal(a, b)
    for name in a.path:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert any((tmp_path / "a" / n).read_bytes() != (tmp_path / "c" / n).read_bytes() for n in a.path)
    assert list(a.regime) == ["short", "short", "scans"] and a.scanned_pages.iloc[2] > 0


def _text_rows(rows: list[tuple[str, str]]) -> dict:
    return rows_to_batch([{"id": i, "text": t} for i, t in rows])


def test_dedup_catches_a_pair_seen_by_two_instances_sharing_the_index():
    import random

    from trident_flows.pipelines.doc_text import paragraph

    text = paragraph(random.Random(0), "en", 300)
    near = text.replace("committee", "commission", 1)
    name = f"test-{uuid.uuid4().hex}"
    try:
        first = NearDuplicates(OpConfig.make(), index_name=name)
        second = NearDuplicates(OpConfig.make(), index_name=name)
        other = NearDuplicates(OpConfig.make(), index_name=name + "-other")
        a = first(_text_rows([("a", text)]))
        b = second(_text_rows([("b", near)]))
        assert a[DROP][0] == "" and b[DROP][0] == "duplicate-of:a" and b["duplicate_of"][0] == "a"
        assert other(_text_rows([("b", near)]))[DROP][0] == ""  # a separate index knows nothing of "a"
        again = first(_text_rows([("a", text), ("b", near)]))  # a retried batch gets the same answers
        assert list(again[DROP]) == ["", "duplicate-of:a"]
    finally:
        release_index(name)
        release_index(name + "-other")


def test_dedup_keeps_distinct_documents_and_orders_by_id():
    import random

    from trident_flows.pipelines.doc_text import paragraph

    t1, t2 = paragraph(random.Random(1), "de", 300), paragraph(random.Random(2), "de", 300)
    assert np.mean(minhash_values(t1, 128) == minhash_values(t2, 128)) < 0.7
    name = f"test-{uuid.uuid4().hex}"
    try:
        out = NearDuplicates(OpConfig.make(), index_name=name)(_text_rows([("z", t1), ("y", t2), ("x", t1)]))
        assert list(out[DROP]) == ["duplicate-of:x", "", ""]
    finally:
        release_index(name)


@pytest.mark.ray
def test_dedup_index_is_shared_by_replicas_in_different_ray_actors(ray_cluster):
    import random

    from trident_flows.pipelines.doc_text import paragraph

    class DedupReplica:  # defined here so Ray ships it by value to the workers
        def __init__(self, name: str) -> None:
            self.op = NearDuplicates(OpConfig.make(), index_name=name)

        def run(self, batch: dict) -> dict:
            return self.op(batch)

    ray = ray_cluster
    text = paragraph(random.Random(5), "fr", 300)
    name = f"test-{uuid.uuid4().hex}"
    replica = ray.remote(num_cpus=0.1)(DedupReplica)
    one, two = replica.remote(name), replica.remote(name)
    try:
        a = ray.get(one.run.remote(_text_rows([("a", text)])))
        b = ray.get(two.run.remote(_text_rows([("b", text.replace("le comité", "la commission", 1))])))
        assert a[DROP][0] == "" and b[DROP][0] == "duplicate-of:a"
    finally:
        for actor in (one, two):
            ray.kill(actor)
        release_index(name)


def test_build_needs_an_input_and_names_the_operators(tmp_path):
    with pytest.raises(ValueError, match="input=.*synth="):
        build()
    with pytest.raises(ValueError, match="no \\*.pdf files"):
        build(input=tmp_path)
    generate(tmp_path / "c", n=2, regimes="short:2", duplicates=0.0, broken=0.0, seed=0)
    spec = build(input=tmp_path / "c")
    assert tuple(o.name for o in spec.operators) == OPERATOR_NAMES
    assert spec.items == 2 and [r["id"] for r in spec.source()] == ["doc-00000", "doc-00001"]
    assert spec.operator("embed").space.devices == ("cpu", "gpu")
