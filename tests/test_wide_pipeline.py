"""``documents10``: the 10-operator pipeline the 256-node tick is measured on, composed from the committed
documents profile only (its six operators, then copies of its last four stages)."""

from __future__ import annotations

from benchmarks import closed_loop_sim as cls
from benchmarks.wide_pipeline import COPIED, LAYOUT, load_profile, wide_profile
from trident_flows.pipelines.emulated_docs import LAYOUT as DOCS_LAYOUT
from trident_flows.runtime.costmodel import PipelineProfile


def test_the_wide_pipeline_is_the_documents_profile_followed_by_copies_of_its_last_four_stages() -> None:
    wide, docs = wide_profile(), PipelineProfile.load("documents")
    assert [o.name for o in wide.operators] == [*(o.name for o in docs.operators), "langid_2", "quality_2", "dedup_2", "embed_2"]
    for name in COPIED:
        copy, original = wide.operator(f"{name}_2"), docs.operator(name)
        assert (copy.devices, copy.selectivity, copy.features) == (original.devices, original.selectivity, original.features)
    assert wide.workloads == docs.workloads
    assert load_profile("documents10") == wide and load_profile("video").name == "video"


def test_the_wide_layout_is_the_documents_layout_over_ten_operators_with_both_embeds_on_the_gpus() -> None:
    assert LAYOUT.operators == tuple(o.name for o in wide_profile().operators)
    assert LAYOUT.gpu_operators == ("embed", "embed_2")
    assert (LAYOUT.default_shares, LAYOUT.batch_size, LAYOUT.gpu_batch_size) == (DOCS_LAYOUT.default_shares, DOCS_LAYOUT.batch_size,
                                                                                 DOCS_LAYOUT.gpu_batch_size)


def test_closed_loop_sim_runs_trident_on_the_wide_pipeline_with_every_item_accounted_for() -> None:
    assert "documents10-256" in cls.WORKLOADS
    profile = load_profile("documents10")
    workload = {"pipeline": "documents10", "nodes": 1, "items": 1500, "schedule": "short:1500",
                "start": cls.static_default("documents10", profile, 1)}
    row = cls.run_one(workload, "trident")  # long enough to tick
    assert row["error"] == "" and row["items_missing"] == 0 and row["items_lost"] == 0 and row["items_dead_lettered"] == 0
    assert row["ticks"] >= 1 and row["tick_ms_p95"] is not None and row["items"] == 1500
