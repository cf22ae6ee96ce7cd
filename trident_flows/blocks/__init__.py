"""Prefect blocks of trident-flows: ``prefect block register -m trident_flows.blocks`` registers all three."""

from trident_flows.blocks.pipeline_settings import PipelineSettingsBlock
from trident_flows.blocks.ray_cluster import RayClusterBlock, RayConnection
from trident_flows.blocks.trident_settings import TridentSettingsBlock

__all__ = ["PipelineSettingsBlock", "RayClusterBlock", "RayConnection", "TridentSettingsBlock"]
