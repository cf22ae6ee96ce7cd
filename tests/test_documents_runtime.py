"""The real document pipeline through the Ray runtime (runner, replica pools, Parquet sink)."""

from __future__ import annotations

import pandas as pd
import pytest

from trident_flows.pipelines.doc_dedup import release_index
from trident_flows.pipelines.doc_embed import EMBEDDING_DIM
from trident_flows.pipelines.documents import build, dedup_index_name
from trident_flows.pipelines.synth_documents import generate


@pytest.mark.models
@pytest.mark.ray
def test_document_pipeline_on_the_runtime_accounts_for_every_document(ray_cluster, tmp_path):
    from trident_flows.control.launch import run_pipeline

    manifest = generate(tmp_path / "corpus", n=5, regimes="short:5", duplicates=0.2, broken=0.2, seed=2)
    kinds = dict(zip(manifest.id, manifest.kind))
    assert sum(k.startswith("duplicate-of:") for k in kinds.values()) == 1
    assert sum(k.startswith("broken:") for k in kinds.values()) == 1
    spec = build(input=tmp_path / "corpus")
    try:
        summary = run_pipeline(spec, tmp_path / "run")
    finally:
        release_index(dedup_index_name(spec))
    assert summary.error == "" and summary.items_in == 5
    assert summary.items_missing == 0 and summary.duplicate_ids == 0
    assert summary.items_dead_lettered == 1
    data = pd.concat([pd.read_parquet(p) for p in (tmp_path / "run" / "data").glob("*.parquet")]).set_index("id")
    dead = pd.concat([pd.read_parquet(p) for p in (tmp_path / "run" / "dead_letter").glob("*.parquet")]).set_index("id")
    assert sorted(list(data.index) + list(dead.index)) == sorted(kinds)
    for doc_id, kind in kinds.items():
        if kind.startswith("broken:"):
            assert dead.loc[doc_id, "operator"] == "parse" and dead.loc[doc_id, "error"].startswith("corrupt PDF")
        elif kind.startswith("duplicate-of:"):
            assert data.loc[doc_id, "_drop"] == kind and data.loc[doc_id, "duplicate_of"] == kind.split(":", 1)[1]
        elif kind == "ok":
            row = data.loc[doc_id]
            assert pd.isna(row["_drop"]) and row["chunks"] == len(row["embeddings"]) > 0
            assert all(len(v) == EMBEDDING_DIM for v in row["embeddings"])
