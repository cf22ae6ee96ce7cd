"""``TridentSettingsBlock``: how the Trident sidecar schedules a running pipeline.

Contract: names the scheduling policy (one registered in ``trident_flows.scheduler.policies``), the tick interval, the memory safety margin every proposed
configuration must keep free, and the resource budgets the scheduler may spend. Invalid values
are refused at construction with a message naming the field and what to change.
"""

from __future__ import annotations

from typing import Optional

from prefect.blocks.core import Block
from pydantic import Field, field_validator

from trident_flows.blocks.catalogue import DOCUMENTATION_URL, LOGO_URL


class TridentSettingsBlock(Block):
    """Scheduling settings of the Trident sidecar: policy, tick interval, OOM safety margin, budgets."""

    _block_type_name = "Trident Settings"
    _block_type_slug = "trident-settings"
    _description = "Policy, tick interval, memory safety margin and resource budgets of the Trident sidecar."
    _documentation_url = DOCUMENTATION_URL
    _logo_url = LOGO_URL

    policy: str = Field(default="trident", description="Scheduling policy: trident (the adaptive controller) or a baseline: static, ds2, threshold.")
    tick_interval_s: float = Field(default=5.0, gt=0, le=3600, description="Seconds between two ticks of a long-running sidecar.")
    memory_safety_margin: float = Field(
        default=0.15, ge=0.0, lt=0.9,
        description="Fraction of each device's memory a proposed configuration must leave free (0.15 = plan for at most 85%).",
    )
    cpu_budget: Optional[float] = Field(default=None, gt=0, description="Most logical CPUs the pipeline may hold (empty: the whole cluster).")
    gpu_budget: Optional[float] = Field(default=None, ge=0, description="Most GPUs the pipeline may hold (empty: the whole cluster).")
    max_reconfigurations_per_tick: int = Field(default=4, ge=0, description="Most operators one plan may change.")
    min_samples: int = Field(default=8, ge=1, description="Batch samples a tick needs before it decides anything.")

    @field_validator("policy")
    @classmethod
    def _check_policy(cls, value: str) -> str:
        from trident_flows.scheduler.policies import POLICIES, available_policies

        name = value.strip().lower()
        if name not in POLICIES:
            raise ValueError(f"policy={value!r} is not available: choose one of {', '.join(available_policies())}")
        return name
