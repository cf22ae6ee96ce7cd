"""``S3CredentialsBlock``: credentials for the ``s3://`` locations of a curation run (where the
documents land, the table), kept on the Prefect server instead of in the environment.

Contract: an access key id and a secret access key (a ``SecretStr``: the UI and the API show it
masked), an optional session token (also secret), the endpoint of an S3-compatible server
(``http(s)://HOST[:PORT]``; empty: AWS) and a region. An empty key id or secret, or an endpoint
that is not an http(s) URL, is refused at construction, naming the field and what to give.
``credentials()`` is the block as ``corpus.location.S3Credentials``, naming the block in every
error about them. ``load_credentials(name)`` loads the block saved under ``name``; a name with no
block, or a saved block that no longer validates, raises ``ValueError``: one line saying what to
change. The ``document-curation`` flow's ``credentials`` parameter (or the pipeline settings'
``credentials``) is such a name; without one a run uses the standard places (the AWS chain).
"""

from __future__ import annotations

from typing import Optional
from urllib.parse import urlsplit

from prefect.blocks.core import Block
from pydantic import Field, SecretStr, ValidationError, field_validator

from trident_flows.blocks.catalogue import DOCUMENTATION_URL, LOGO_URL
from trident_flows.corpus.location import S3Credentials

BLOCK_TYPE = "Trident S3 Credentials"


class S3CredentialsBlock(Block):
    """Access key, secret, session token, endpoint and region for the s3:// locations of a curation run."""

    _block_type_name = BLOCK_TYPE
    _block_type_slug = "trident-s3-credentials"
    _description = "Credentials for the s3:// input and table locations of a Trident curation run (AWS or an S3-compatible server)."
    _documentation_url = DOCUMENTATION_URL
    _logo_url = LOGO_URL

    aws_access_key_id: str = Field(default="", validate_default=True, description="Access key id.")
    aws_secret_access_key: SecretStr = Field(default=SecretStr(""), validate_default=True, description="Secret access key (stored as a secret).")
    aws_session_token: Optional[SecretStr] = Field(default=None, description="Session token of temporary credentials; empty: none.")
    endpoint_url: Optional[str] = Field(default=None, description="Endpoint of an S3-compatible server, e.g. 'http://minio:9000'; empty: AWS.")
    region_name: Optional[str] = Field(default=None, description="Region, e.g. 'eu-west-1'; empty: the SDK's default (us-east-1).")

    @field_validator("aws_access_key_id")
    @classmethod
    def _check_key_id(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("aws_access_key_id is empty: give the access key id of the bucket's credentials")
        return value.strip()

    @field_validator("aws_secret_access_key")
    @classmethod
    def _check_secret(cls, value: SecretStr) -> SecretStr:
        if not value.get_secret_value().strip():
            raise ValueError("aws_secret_access_key is empty: give the secret access key that goes with aws_access_key_id")
        return value

    @field_validator("endpoint_url")
    @classmethod
    def _check_endpoint(cls, value: Optional[str]) -> Optional[str]:
        if value is None or not value.strip():
            return None
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.path.strip("/"):
            raise ValueError(f"endpoint_url={value!r} is not an endpoint: give http(s)://HOST[:PORT] (e.g. 'http://minio:9000'), "
                             "or leave it empty for AWS")
        return f"{parts.scheme}://{parts.netloc}"

    def credentials(self) -> S3Credentials:
        """These credentials for ``corpus.location`` (errors about them name this block)."""
        name = self._block_document_name
        token = self.aws_session_token.get_secret_value() if self.aws_session_token is not None else None
        return S3Credentials(self.aws_access_key_id, self.aws_secret_access_key.get_secret_value(), token or None, self.endpoint_url,
                             self.region_name or None, source=f"the {BLOCK_TYPE} block {name!r}" if name else f"the {BLOCK_TYPE} block")


def load_credentials(name: str) -> S3Credentials:
    """The credentials of the block saved under ``name`` (see the module docstring)."""
    try:
        block = S3CredentialsBlock.load(name)
    except RuntimeError as exc:  # Prefect's wrapping of a saved document that no longer validates
        if not isinstance(exc.__cause__, ValidationError):
            raise
        problems = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.__cause__.errors())
        raise ValueError(f"the {BLOCK_TYPE} block {name!r} is incomplete ({problems}): fix it on the Prefect UI's Blocks page") from None
    except ValueError:
        raise ValueError(f"no {BLOCK_TYPE} block named {name!r} on the Prefect server: save one under that name "
                         f"(Blocks page, or S3CredentialsBlock(...).save({name!r})), or give the name of one `prefect block ls` lists") from None
    return block.credentials()
