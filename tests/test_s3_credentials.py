"""Credentials for the s3:// locations of a corpus run: from the standard places or a Trident S3 Credentials
block, against an S3-compatible server that checks them (moto with its IAM authentication on), with no AWS
setting in the environment; a bad or missing credential is refused in one line that says what to change."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pydantic import ValidationError

from trident_flows.blocks import PipelineSettingsBlock, S3CredentialsBlock
from trident_flows.blocks.s3_credentials import load_credentials
from trident_flows.control.corpus_run import CorpusRun
from trident_flows.core.state import RuntimeConfigError
from trident_flows.corpus.location import LocationError, S3Credentials, open_location
from trident_flows.corpus.table import CorpusTable

BLOCK = "the Trident S3 Credentials block 'landing'"


@pytest.fixture
def no_aws_settings(monkeypatch, tmp_path):
    """No AWS credential, endpoint or region in the environment or in ~/.aws."""
    import os

    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def _put(endpoint: str, key: str, secret: str, name: str, data: bytes) -> None:
    import boto3

    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=key,
                 aws_secret_access_key=secret).put_object(Bucket="landing", Key=name, Body=data)


def test_a_corpus_run_reads_and_commits_with_the_credentials_of_a_block_alone(s3_checked_credentials, no_aws_settings, tmp_path):
    bucket, endpoint, key, secret = s3_checked_credentials
    for name in ("in/a.pdf", "in/deep/b.pdf"):
        _put(endpoint, key, secret, name, name.encode())
    credentials = S3Credentials(key, secret, endpoint_url=endpoint, region="us-east-1", source=BLOCK)
    run = CorpusRun.prepare(f"{bucket}/in", f"{bucket}/tables/docs", tmp_path / "out", credentials=credentials)
    assert run.work.counts()["files_new"] == 2 and run.version is None
    assert run.table.commit(pa.table({"id": ["a.pdf", "deep/b.pdf"], "text": ["a", "b"]}), pa.table({"id": pa.array([], pa.string())}),
                            {"trident.flow_run_id": "run-1"}) == 1
    again = CorpusTable(open_location(f"{bucket}/tables/docs", credentials))
    assert again.version() == 1 and again.open(again.curated_uri).to_pyarrow_table().num_rows == 2


def _one_line(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert "\n" not in message
    return message


def test_a_bad_or_missing_credential_is_refused_in_one_line_saying_what_to_change(s3_checked_credentials, no_aws_settings, monkeypatch,
                                                                                   tmp_path):
    bucket, endpoint, key, secret = s3_checked_credentials
    wrong = S3Credentials(key, "not-the-secret", endpoint_url=endpoint, source=BLOCK)
    with pytest.raises(LocationError) as refused:
        open_location(f"{bucket}/in", wrong)
    message = _one_line(refused)
    assert message.startswith(f"{bucket}/in: cannot reach it with the credentials of {BLOCK} (")
    assert message.endswith(f"check the access key id, secret access key and endpoint of {BLOCK}")
    with pytest.raises(RuntimeConfigError, match="cannot reach it with the credentials of the Trident S3"):  # a run, before Ray
        CorpusRun.prepare(f"{bucket}/in", None, tmp_path / "out", credentials=wrong)

    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)  # the standard places hold the endpoint, but no key
    with pytest.raises(LocationError) as missing:
        open_location(f"{bucket}/in")
    message = _one_line(missing)
    assert message.startswith(f"{bucket}/in: cannot reach it with the credentials from the standard places (")
    assert "check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY" in message and "Trident S3 Credentials block" in message

    with pytest.raises(LocationError, match="is for s3:// locations; give an s3:// URL, or no credentials"):
        open_location(tmp_path, wrong)
    with pytest.raises(RuntimeConfigError, match="neither the input .* nor the table None is one: give no credentials"):
        CorpusRun.prepare(tmp_path, None, tmp_path / "out", credentials=wrong)


@pytest.mark.parametrize("fields, message", [
    ({"aws_secret_access_key": "s"}, "aws_access_key_id is empty: give the access key id"),
    ({"aws_access_key_id": "k", "aws_secret_access_key": " "}, "aws_secret_access_key is empty: give the secret access key"),
    ({"aws_access_key_id": "k", "aws_secret_access_key": "s", "endpoint_url": "minio:9000"}, r"give http\(s\)://HOST\[:PORT\]"),
])
def test_the_credentials_block_refuses_what_cannot_be_a_credential(fields, message):
    with pytest.raises(ValidationError, match=message):
        S3CredentialsBlock(**fields)


def test_the_pipeline_settings_take_the_name_of_a_credentials_block():
    block = PipelineSettingsBlock(pipeline="documents", input_location="s3://bucket/landing", credentials=" landing ")
    assert block.credentials == "landing" and block.with_locations(credentials="other").credentials == "other"
    assert block.with_locations().credentials == "landing"
    with pytest.raises(ValidationError, match="credentials are for the documents pipeline"):
        PipelineSettingsBlock(pipeline="emulated-docs", credentials="landing")


@pytest.mark.prefect
def test_a_saved_block_keeps_its_secret_and_a_name_without_one_says_what_to_do(prefect_harness):
    S3CredentialsBlock(aws_access_key_id="key", aws_secret_access_key="s3cr3t", endpoint_url="http://127.0.0.1:9000/",
                       region_name="eu-west-1").save("test-landing", overwrite=True)
    assert "s3cr3t" not in S3CredentialsBlock.load("test-landing").model_dump_json()
    credentials = load_credentials("test-landing")
    assert (credentials.access_key_id, credentials.secret_access_key, credentials.endpoint_url, credentials.region) == (
        "key", "s3cr3t", "http://127.0.0.1:9000", "eu-west-1")
    assert credentials.source == "the Trident S3 Credentials block 'test-landing'" and "s3cr3t" not in repr(credentials)
    assert credentials.storage_options()["AWS_ALLOW_HTTP"] == "true"

    with pytest.raises(ValueError) as missing:
        load_credentials("no-such-block")
    assert _one_line(missing).startswith("no Trident S3 Credentials block named 'no-such-block' on the Prefect server: save one")
    S3CredentialsBlock.model_construct(aws_access_key_id="key").save("test-half", overwrite=True)  # as a form left half-filled saves it
    with pytest.raises(ValueError) as half:
        load_credentials("test-half")
    assert _one_line(half) == ("the Trident S3 Credentials block 'test-half' is incomplete (aws_secret_access_key is empty: give the secret "
                               "access key that goes with aws_access_key_id): fix it on the Prefect UI's Blocks page")


@pytest.mark.prefect
@pytest.mark.ray
def test_the_curation_flow_fails_before_its_pipeline_on_a_missing_or_refused_credential(prefect_harness, ray_cluster, s3_checked_credentials,
                                                                                      no_aws_settings, tmp_path):
    from trident_flows.flows.document_curation import document_curation

    bucket, endpoint, key, _ = s3_checked_credentials
    S3CredentialsBlock(aws_access_key_id=key, aws_secret_access_key="not-the-secret", endpoint_url=endpoint).save("landing", overwrite=True)
    settings = {"pipeline": "documents", "output_location": str(tmp_path / "staging"), "runner_name": "credentials-test"}
    for name, message in (("nowhere", "no Trident S3 Credentials block named 'nowhere'"),
                          ("landing", f"{bucket}/in: cannot reach it with the credentials of {BLOCK}")):
        state = document_curation(pipeline=settings, trident={"policy": "static"}, input=f"{bucket}/in", credentials=name,
                                  return_state=True)
        assert state.is_failed() and message in state.message
