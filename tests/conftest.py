"""Shared fixtures: one local Ray cluster, one Prefect test harness and one S3-compatible server per test session."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

import pytest

os.environ.setdefault("OMP_THREAD_LIMIT", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# The test Prefect server works offline: no telemetry (it would also lock the test database).
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

# The logical node the runtime tests run on: more logical CPUs than the machine has cores
# (emulated operators sleep while holding a logical CPU) and two logical GPUs.
TEST_CPUS = 8
TEST_GPUS = 2


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray cluster of our own (never address='auto'), shared by the whole session."""
    import ray

    if not ray.is_initialized():
        ray.init("local", num_cpus=TEST_CPUS, num_gpus=TEST_GPUS, object_store_memory=256 * 2**20, include_dashboard=False,
                 namespace="trident-tests", log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture
def emulated_docs_time_scale(monkeypatch):
    """Build the named ``emulated-docs`` pipeline of this process (``build_pipeline``: the flows, ``run_command``) at a
    time scale: ``emulated_docs_time_scale(0.2)``. At its measured costs (scale 1) its replicas take ~20 s to start
    (embed's cold start) and a scanned document ~5 s of OCR; a test of what the flow does around the pipeline
    (artifacts, sidecar, sizing) needs the same pipeline, not those seconds."""
    from trident_flows.pipelines import emulated_docs

    build = emulated_docs.build

    def set_scale(scale: float) -> None:
        monkeypatch.setattr(emulated_docs, "build", lambda **options: build(**{**options, "time_scale": scale}))
    return set_scale


@pytest.fixture(scope="session")
def prefect_harness():
    """A Prefect API for the session (SQLite, temporary), with flow heartbeats off."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        with temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
            yield


@pytest.fixture(scope="session")
def curated_documents(prefect_harness, ray_cluster, tmp_path_factory):
    """One clean ``document-curation`` run of the real documents pipeline (8 synthetic documents in 3 shards, static
    policy), shared by the tests of what such a run leaves and of re-running it: ``(settings, state)``, the output
    at ``settings["output_location"]``. A test that re-runs into it must leave it as a clean run leaves it (every
    re-run of the flow does: it writes each id once)."""
    from trident_flows.flows.document_curation import document_curation

    out = tmp_path_factory.mktemp("curated-documents") / "curated"
    settings = {"pipeline": "documents", "synth": 8, "output_location": str(out), "shard_size": 3, "runner_name": "curation-test"}
    state = document_curation(pipeline=settings, trident={"policy": "static"}, return_state=True)
    return settings, state


@contextlib.contextmanager
def _moto_server() -> Iterator[dict[str, str]]:
    """moto's standalone S3-compatible server on a free port of 127.0.0.1; yields the environment a client needs
    to reach it (endpoint, moto's test credentials, region)."""
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                raise RuntimeError(f"moto's S3 server did not start on 127.0.0.1:{port}") from None
            time.sleep(0.2)
    try:
        yield {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true", "AWS_EC2_METADATA_DISABLED": "true"}
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.fixture(scope="session")
def s3_server():
    """A real S3-compatible server (moto's standalone server) on 127.0.0.1, for the session: yields the
    environment a client needs to reach it (endpoint, test credentials, region); tests set it with
    ``monkeypatch`` and create their own bucket."""
    with _moto_server() as env:
        yield env


@pytest.fixture(scope="module")
def s3_checked_credentials():
    """An S3-compatible server of its own that checks credentials (moto's IAM authentication, on once the user
    exists), with one bucket: yields ``(bucket URL, endpoint, access key id, secret access key)``. Any other key or
    secret, or none, is refused (403)."""
    import json
    import urllib.request

    import boto3

    with _moto_server() as env:
        endpoint = env["AWS_ENDPOINT_URL"]
        client = dict(endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing")
        iam = boto3.client("iam", **client)
        iam.create_user(UserName="curator")
        iam.put_user_policy(UserName="curator", PolicyName="s3", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
        key = iam.create_access_key(UserName="curator")["AccessKey"]
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset-auth", data=b"0", method="POST", headers={"Content-Type": "text/plain"})).read()
        s3 = boto3.client("s3", **{**client, "aws_access_key_id": key["AccessKeyId"], "aws_secret_access_key": key["SecretAccessKey"]})
        s3.create_bucket(Bucket="landing")
        yield "s3://landing", endpoint, key["AccessKeyId"], key["SecretAccessKey"]


@pytest.fixture
def s3_bucket(s3_server, monkeypatch):
    """A new bucket on the session's S3 server, its environment set for this test: yields ``s3://BUCKET``."""
    import uuid

    import boto3

    for key, value in s3_server.items():
        monkeypatch.setenv(key, value)
    name = f"t-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_server["AWS_ENDPOINT_URL"]).create_bucket(Bucket=name)
    return f"s3://{name}"
