"""The document-curation flow running a user's Ray Data pipeline named in the pipeline block."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from trident_flows.blocks import PipelineSettingsBlock

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = str(ROOT / "examples" / "ray_data_emulated.py") + ":build"


def test_the_pipeline_block_takes_a_ray_data_function_without_an_input_location():
    block = PipelineSettingsBlock(ray_data_pipeline=EXAMPLE, synth=10, output_location="out")
    assert block.ray_data_pipeline == EXAMPLE
    with pytest.raises(ValueError, match="needs an input"):
        PipelineSettingsBlock(pipeline="documents", output_location="out").with_locations()


@pytest.mark.prefect
@pytest.mark.ray
def test_the_curation_flow_runs_the_ray_data_pipeline_and_publishes_its_rows(prefect_harness, ray_cluster, tmp_path):
    from ray_data_fast_example import TARGET  # the example at a tenth of its measured time

    from trident_flows.flows.document_curation import document_curation

    out = tmp_path / "curated"
    settings = {"ray_data_pipeline": TARGET, "synth": 12, "output_location": str(out), "shard_size": 5,
                "runner_name": "ray-data-curation-test"}
    summary = document_curation(pipeline=settings, trident={"policy": "static"})
    assert (summary["items_in"], summary["shards"], summary["duplicate_ids"], summary["dead_lettered"]) == (12, 3, 0, 0)
    published = pq.read_table(out / "dataset")
    assert sorted(published.column("id").to_pylist()) == [f"item-{k:07d}" for k in range(12)]
