"""Prefect blocks of trident-flows: ``prefect block register -m trident_flows.blocks`` registers all four."""

from trident_flows.blocks.pipeline_settings import PipelineSettingsBlock
from trident_flows.blocks.ray_cluster import RayClusterBlock, RayConnection
from trident_flows.blocks.s3_credentials import S3CredentialsBlock
from trident_flows.blocks.trident_settings import TridentSettingsBlock

__all__ = ["PipelineSettingsBlock", "RayClusterBlock", "RayConnection", "S3CredentialsBlock", "TridentSettingsBlock"]
