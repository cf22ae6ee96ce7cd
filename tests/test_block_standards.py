"""The blocks pass Prefect's own block standard test suite, as Prefect's integrations do.

The suite fetches each block's logo from its URL. This machine has no network, so the
project's own logo URL is answered from the file of the checkout that the URL names in the
repository (``blocks.catalogue``); any other URL is fetched as usual.
"""

from __future__ import annotations

from urllib.request import urlopen

import pytest
from prefect.blocks.core import Block
from prefect.testing.standard_test_suites import BlockStandardTestSuite

from trident_flows.blocks import PipelineSettingsBlock, RayClusterBlock, S3CredentialsBlock, TridentSettingsBlock, catalogue


@pytest.fixture(autouse=True)
def repository_logo_from_the_checkout(monkeypatch):
    def fetch(url, *args, **kwargs):
        return catalogue.LOGO_FILE.open("rb") if str(url) == catalogue.LOGO_URL else urlopen(url, *args, **kwargs)

    monkeypatch.setattr("prefect.testing.standard_test_suites.blocks.urlopen", fetch)


def test_the_logo_url_names_the_logo_file_in_the_repository():
    repo_root = catalogue.LOGO_FILE.parents[2]
    assert catalogue.LOGO_FILE.relative_to(repo_root).as_posix() == catalogue.LOGO_PATH
    assert catalogue.LOGO_URL.endswith(f"/{catalogue.BRANCH}/{catalogue.LOGO_PATH}")


class TestBlockStandards(BlockStandardTestSuite):
    @pytest.fixture(params=[PipelineSettingsBlock, RayClusterBlock, S3CredentialsBlock, TridentSettingsBlock], ids=lambda b: b.__name__)
    def block(self, request: pytest.FixtureRequest) -> type[Block]:
        return request.param
