"""The Prefect blocks accept sound settings and refuse bad ones with a message saying what to change."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from trident_flows.blocks import PipelineSettingsBlock, RayClusterBlock, TridentSettingsBlock
from trident_flows.planning.catalogue import DEFAULT_CATALOGUE

CATALOGUE = str(DEFAULT_CATALOGUE)

pytestmark = pytest.mark.prefect


def test_ray_cluster_local_node_kwargs_never_auto():
    block = RayClusterBlock(num_cpus=8, num_gpus=2, object_store_mb=256)
    assert block.ray_address == "local"
    kwargs = block.init_kwargs({"PREFECT_API_URL": "http://127.0.0.1:4200/api"})
    assert kwargs["num_cpus"] == 8 and kwargs["num_gpus"] == 2 and kwargs["object_store_memory"] == 256 * 2**20
    assert kwargs["runtime_env"] == {"env_vars": {"PREFECT_API_URL": "http://127.0.0.1:4200/api"}}
    runner = block.task_runner()
    assert runner.address == "local"


def test_ray_cluster_existing_address():
    block = RayClusterBlock(address="ray://head.example:10001", namespace="curation")
    assert block.ray_address == "ray://head.example:10001"
    assert "num_cpus" not in block.init_kwargs() and block.init_kwargs()["namespace"] == "curation"


@pytest.mark.parametrize("fields, message", [
    ({"address": "auto"}, "stranger's cluster"),
    ({"address": "local"}, "leave address empty"),
    ({"address": "my cluster"}, "ray://HOST:10001"),
    ({"address": "10.0.0.1:6379", "num_gpus": 2}, "clear them, or clear address"),
    ({"num_cpus": 0}, "greater than or equal to 1"),
    ({"object_store_mb": 10}, "greater than or equal to 100"),
])
def test_ray_cluster_refuses(fields, message):
    with pytest.raises(ValidationError, match=message):
        RayClusterBlock(**fields)


def test_trident_settings_normalises_policy():
    assert TridentSettingsBlock(policy=" Static ").policy == "static"


@pytest.mark.parametrize("fields, message", [
    ({"policy": "fastest"}, "is not available: choose one of .*static"),
    ({"tick_interval_s": 0}, "greater than 0"),
    ({"memory_safety_margin": 0.95}, "less than 0.9"),
    ({"memory_safety_margin": -0.1}, "greater than or equal to 0"),
    ({"gpu_budget": -1}, "greater than or equal to 0"),
    ({"max_changes": -1}, "greater than or equal to 0"),
    ({"max_reconfigurations_per_tick": 2}, "unknown field 'max_reconfigurations_per_tick'; known fields: .*max_changes"),
    ({"min_samples": 4}, "unknown field 'min_samples' \\(did you mean 'min_new_samples'\\?\\)"),
    ({"deadline": "2h"}, "deadline/budget need node_catalogue"),
    ({"deadline": "2h", "node_catalogue": CATALOGUE, "policy": "ds2"}, "need policy='trident'"),
    ({"deadline": "soon", "node_catalogue": CATALOGUE}, "deadline 'soon': give seconds from now"),
    ({"deadline": "2h", "budget": 3.0, "node_catalogue": CATALOGUE}, "give one goal"),
    ({"deadline": "2h", "node_catalogue": "/no/such.toml"}, "no such file"),
    ({"node_catalogue": CATALOGUE}, "set deadline or budget, or clear it"),
    ({"budget": 0}, "greater than 0"),
])
def test_trident_settings_refuses(fields, message):
    with pytest.raises(ValidationError, match=message):
        TridentSettingsBlock(**fields)


def test_trident_settings_default_to_the_sidecar_preset():
    from trident_flows.scheduler.trident_settings import TridentSettings

    assert TridentSettings.from_options(**TridentSettingsBlock().trident_options()) == TridentSettings.sidecar()
    assert TridentSettingsBlock().min_new_samples == 8  # the sidecar's own count, not Trident's min_samples (32)


def test_trident_settings_goal_counts_a_relative_deadline_from_the_run_start():
    settings = TridentSettingsBlock(deadline="90m", node_catalogue=CATALOGUE)
    pool, goal = settings.elastic(1000.0)
    assert goal.deadline_at == 1000.0 + 5400 and goal.budget is None and "c16" in pool.classes.names
    assert TridentSettingsBlock().elastic(1000.0) is None


def test_pipeline_settings_paths_and_options(tmp_path):
    block = PipelineSettingsBlock(pipeline="documents", input_location=f"file://{tmp_path}", output_location=str(tmp_path / "out"))
    assert block.input_location == str(tmp_path)
    options = block.build_options(tmp_path / "work")
    assert options["input"] == tmp_path and options["synth"] is None and options["work_dir"] == tmp_path / "work"


def test_the_documents_pipeline_reads_urls_and_takes_the_flows_input_and_table():
    block = PipelineSettingsBlock(pipeline="documents", input_location="s3://bucket/landing", table_location="s3://bucket/tables/docs")
    assert (block.input_location, block.table_location) == ("s3://bucket/landing", "s3://bucket/tables/docs")
    bare = PipelineSettingsBlock(pipeline="documents", output_location="out")
    placed = bare.with_locations(input="file:///data/landing", table="tables/docs")
    assert (placed.input_location, placed.table_location, placed.output_location) == ("/data/landing", "tables/docs", "out")
    with pytest.raises(ValueError, match="give the flow's input parameter"):
        bare.with_locations()


@pytest.mark.parametrize("fields, message", [
    ({"pipeline": "images", "synth": 5}, "choose one of documents, emulated-docs"),
    ({"pipeline": "video"}, "set input_location to a directory, or synth"),
    ({"pipeline": "video", "input_location": "s3://bucket/videos"}, "only local directories"),
    ({"pipeline": "emulated-docs", "table_location": "tables/x"}, "table_location, retry_dead_letters and credentials are for the documents pipeline"),
    ({"pipeline": "emulated-docs", "output_location": " "}, "output_location is empty"),
    ({"pipeline": "emulated-docs", "shard_size": 0}, "greater than or equal to 1"),
])
def test_pipeline_settings_refuses(fields, message):
    with pytest.raises(ValidationError, match=message):
        PipelineSettingsBlock(**fields)


def test_blocks_round_trip_through_the_api(prefect_harness):
    RayClusterBlock(num_cpus=4, num_gpus=1).save("test-local", overwrite=True)
    TridentSettingsBlock(policy="static", tick_interval_s=2).save("test-trident", overwrite=True)
    PipelineSettingsBlock(pipeline="emulated-docs", synth=40, shard_size=10).save("test-pipeline", overwrite=True)
    assert RayClusterBlock.load("test-local").num_gpus == 1
    assert TridentSettingsBlock.load("test-trident").policy == "static"
    assert PipelineSettingsBlock.load("test-pipeline").shard_size == 10


def test_ray_cluster_connect_fails_fast_without_a_cluster():
    from trident_flows.prefect_server import free_port

    block = RayClusterBlock(address=f"127.0.0.1:{free_port()}", connect_timeout_s=1)
    with pytest.raises(ConnectionError, match="no Ray cluster answers at address='127.0.0.1:.*fix the RayClusterBlock's address"):
        block.check_reachable()
