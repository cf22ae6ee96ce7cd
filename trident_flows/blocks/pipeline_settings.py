"""``PipelineSettingsBlock``: which curation pipeline to run, on what input, into where,
in shards of what size, and the name its runner is found by.

Contract: ``pipeline`` is a name from ``trident_flows.pipelines.PIPELINES`` unless
``ray_data_pipeline`` names a user's Ray Data pipeline (``MODULE:FUNCTION``). The output location
is a local directory; so is the input, except for documents, whose input may be any filesystem URL
(``trident_flows.corpus.location``); without one, ``synth`` synthetic inputs are generated.
``table_location`` (documents) makes each run a corpus run (``control.corpus_run``, with
``retry_dead_letters``); ``credentials`` names a saved ``S3CredentialsBlock`` for s3:// locations.
``with_locations(input, table, credentials)`` puts the flow's parameters in place of the block's,
refusing a documents pipeline left with no input. ``quality`` and ``tune`` are the user's quality
knob settings and tunable ranges (``trident_flows.pipelines.quality``). Invalid values are refused
at construction naming the field and what to change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Union

from prefect.blocks.core import Block
from pydantic import Field, field_validator, model_validator

from trident_flows.blocks.catalogue import DOCUMENTATION_URL, LOGO_URL
from trident_flows.pipelines import PIPELINES


def _local_path(field: str, value: Optional[str], urls: bool = False) -> Optional[str]:
    if value is None or not str(value).strip():
        return None
    value = str(value).strip()
    if value.startswith("file://"):
        value = value[len("file://"):]
    elif "://" in value and not urls:
        raise ValueError(f"{field}={value!r}: only local directories are supported here; give a path or a file:// URL "
                         "(the documents pipeline also reads filesystem URLs such as s3://bucket/prefix)")
    return value


class PipelineSettingsBlock(Block):
    """A curation pipeline run: pipeline name, input and output locations, shard size."""

    _block_type_name = "Trident Pipeline Settings"
    _block_type_slug = "trident-pipeline-settings"
    _description = "Pipeline name, input location, output location, shard size and runner name of a Trident curation run."
    _documentation_url = DOCUMENTATION_URL
    _logo_url = LOGO_URL

    pipeline: str = Field(default="documents", description=f"Pipeline to run: one of {', '.join(sorted(PIPELINES))}.")
    input_location: Optional[str] = Field(default=None, description="Directory of input files (path or file:// URL; documents: also s3://, gs://, ... URLs); empty: the flow's `input` parameter, or generate `synth` inputs.")
    table_location: Optional[str] = Field(default=None, description="documents: curate only new or changed input files into this table location (directory or URL; Delta Lake tables curated/ and dead_letter/, one commit per run); the output location is then the run's staging area.")
    retry_dead_letters: bool = Field(default=False, description="With a table location: retry files dead-lettered by earlier runs although their bytes did not change.")
    credentials: Optional[str] = Field(default=None, description="documents: name of a saved Trident S3 Credentials block for the s3:// input and table locations; empty: the standard places (AWS_* environment, ~/.aws, instance role).")
    output_location: str = Field(default="curation-output", description="Directory for the curated Parquet parts and the dead-letter table.")
    shard_size: int = Field(default=50, ge=1, le=100_000, description="Input items per shard; each shard is one task run with retries.")
    synth: Optional[int] = Field(default=None, ge=1, description="Generate this many synthetic inputs when no input location is given.")
    regimes: Optional[str] = Field(default=None, description="Regime schedule for synthetic inputs, e.g. 'short:20,long:10,scans:10'.")
    seed: int = Field(default=0, description="Random seed of synthetic inputs.")
    ray_data_pipeline: Optional[str] = Field(default=None, description="MODULE:FUNCTION returning a Ray Data Dataset to run instead of `pipeline` (its rows are published to OUTPUT/dataset), e.g. examples/ray_data_emulated.py:build.")
    runner_name: str = Field(default="trident-runner", min_length=1, description="Name the pipeline runner registers under in the Ray cluster; the sidecar finds it by this name.")
    quality: dict[str, Union[int, float, str]] = Field(
        default_factory=dict, description="Quality knob settings OPERATOR.KNOB -> value, e.g. {'ocr.dpi': 200}: they decide what the "
                                          "output is, and no scheduling policy changes them.")
    tune: dict[str, str] = Field(
        default_factory=dict, description="Quality knobs a policy may vary, OPERATOR.KNOB -> range 'LOW..HIGH' (or 'a|b'), e.g. "
                                          "{'ocr.dpi': '100..300'}; outputs then differ by configuration, each row records its values.")

    @field_validator("pipeline")
    @classmethod
    def _check_pipeline(cls, value: str) -> str:
        if value not in PIPELINES:
            raise ValueError(f"pipeline={value!r} is unknown: choose one of {', '.join(sorted(PIPELINES))}")
        return value

    @field_validator("credentials")
    @classmethod
    def _check_credentials(cls, value: Optional[str]) -> Optional[str]:
        return value.strip() if value is not None and value.strip() else None

    @field_validator("table_location")
    @classmethod
    def _check_table(cls, value: Optional[str]) -> Optional[str]:
        return _local_path("table_location", value, urls=True)

    @field_validator("output_location")
    @classmethod
    def _check_output(cls, value: str) -> str:
        path = _local_path("output_location", value)
        if path is None:
            raise ValueError("output_location is empty: give a directory for the curated output")
        return path

    @model_validator(mode="after")
    def _check_source(self) -> "PipelineSettingsBlock":
        documents = self.pipeline == "documents" and not self.ray_data_pipeline
        self.input_location = _local_path("input_location", self.input_location, urls=documents)
        if self.input_location is None and self.synth is None and not documents and not self.pipeline.startswith("emulated") \
                and not self.ray_data_pipeline:
            raise ValueError(f"pipeline {self.pipeline!r} needs an input: set input_location to a directory, or synth to a number of synthetic inputs")
        if (self.table_location or self.retry_dead_letters or self.credentials) and not documents:
            raise ValueError(f"table_location, retry_dead_letters and credentials are for the documents pipeline; {self.pipeline!r} curates "
                             "into output_location")
        from trident_flows.pipelines.quality import check_settings

        check_settings(self.pipeline, self.quality, self.tune)
        return self

    def with_locations(self, input: Optional[str] = None, table: Optional[str] = None,
                       credentials: Optional[str] = None) -> "PipelineSettingsBlock":
        """This block with the flow's ``input``, ``table`` and ``credentials`` parameters in place of its own (see the module docstring)."""
        fields = {name: getattr(self, name) for name in type(self).model_fields}
        fields["input_location"] = input or self.input_location
        fields["table_location"] = table or self.table_location
        fields["credentials"] = credentials or self.credentials
        block = type(self)(**fields)
        if block.pipeline == "documents" and not block.ray_data_pipeline and block.input_location is None and block.synth is None:
            raise ValueError("pipeline 'documents' needs an input: give the flow's input parameter (or input_location) the directory or "
                             "URL where the documents land, or set synth to a number of synthetic inputs")
        return block

    def build_options(self, work_dir: Path) -> dict[str, Any]:
        """Keyword options for ``trident_flows.pipelines.build_pipeline``."""
        return {"input": Path(self.input_location) if self.input_location else None, "synth": self.synth,
                "seed": self.seed, "regimes": self.regimes, "work_dir": work_dir, "quality": dict(self.quality), "tune": dict(self.tune)}
