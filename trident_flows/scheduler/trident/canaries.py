"""Canaries of the Trident policy: a config the optimiser proposes, tried on one extra replica.

Contract:
- ``CanaryTrial`` is one running canary: its config, when it started (runner ``wall_s``), why, and the
  samples of the canary (``candidate``) and of the running replicas (``incumbent``) since.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trident_flows.core.types import OpConfig


@dataclass
class CanaryTrial:
    config: OpConfig
    started_s: float
    reason: str
    candidate: list = field(default_factory=list)
    incumbent: list = field(default_factory=list)
