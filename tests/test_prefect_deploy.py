"""Against a real local Prefect server (127.0.0.1, a free port, SQLite): the blocks register with
the Prefect CLI, and ``prefect --no-prompt deploy --all --prefect-file deployments/prefect.yaml``
creates both deployments on a process work pool, with their schedules."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trident_flows.prefect_server import ensure_server, free_port, stop_server

pytestmark = pytest.mark.prefect
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    state_dir = tmp_path_factory.mktemp("prefect-server")
    info = ensure_server(port=free_port(), state_dir=state_dir, reuse_env=False)
    assert info.started_by_us and info.url.startswith("http://127.0.0.1:")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_API_URL=info.url, PREFECT_HOME=str(state_dir / "cli-home"), PWD=str(REPO))
    yield info, env
    assert stop_server(state_dir)
    assert not (state_dir / "server.pid").exists()


def _prefect(env, *args, timeout=240):
    result = subprocess.run([sys.executable, "-m", "prefect", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"prefect {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def _client(info):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    return temporary_settings({PREFECT_API_URL: info.url}), get_client


def test_second_ensure_server_reuses_ours(server, tmp_path):
    info, _ = server
    port = int(info.url.rsplit(":", 1)[1].split("/")[0])
    again = ensure_server(port=port, state_dir=tmp_path, reuse_env=False)
    assert again.url == info.url and not again.started_by_us  # found on the port, so not ours to stop
    assert not stop_server(tmp_path)


def test_blocks_register_with_the_cli(server):
    info, env = server
    out = _prefect(env, "block", "register", "-m", "trident_flows.blocks")
    assert "Successfully registered 4 blocks" in out
    settings, get_client = _client(info)
    with settings, get_client(sync_client=True) as client:
        slugs = {client.read_block_type_by_slug(s).slug for s in ("trident-ray-cluster", "trident-settings", "trident-pipeline-settings",
                                                                  "trident-s3-credentials")}
    assert slugs == {"trident-ray-cluster", "trident-settings", "trident-pipeline-settings", "trident-s3-credentials"}


def test_deploy_all_creates_both_deployments(server):
    info, env = server
    _prefect(env, "work-pool", "create", "trident-local", "--type", "process")
    out = _prefect(env, "--no-prompt", "deploy", "--all", "--prefect-file", "deployments/prefect.yaml")
    assert "document-curation/nightly" in out and "trident-sidecar/every-minute" in out
    settings, get_client = _client(info)
    with settings, get_client(sync_client=True) as client:
        deployments = {(client.read_flow(d.flow_id).name, d.name): d for d in client.read_deployments()}
    assert set(deployments) == {("document-curation", "nightly"), ("trident-sidecar", "every-minute")}
    nightly = deployments[("document-curation", "nightly")]
    sidecar = deployments[("trident-sidecar", "every-minute")]
    assert nightly.work_pool_name == sidecar.work_pool_name == "trident-local"
    assert nightly.schedules[0].schedule.cron == "0 2 * * *"
    assert sidecar.schedules[0].schedule.interval.total_seconds() == 60
    assert nightly.schedules[0].active and not sidecar.schedules[0].active  # the scheduled sidecar is created paused
    assert nightly.parameters["pipeline"]["pipeline"] == "documents" and "synth" not in nightly.parameters["pipeline"]
    assert (nightly.parameters["input"], nightly.parameters["table"]) == ("landing/documents", "curation-output/nightly-table")
    assert nightly.parameters["trident"]["policy"] == "trident"  # the nightly run tunes itself
    assert sidecar.parameters["runner_name"] == nightly.parameters["pipeline"]["runner_name"]
    assert nightly.pull_steps == [{"prefect.deployments.steps.set_working_directory": {"directory": str(REPO)}}]
