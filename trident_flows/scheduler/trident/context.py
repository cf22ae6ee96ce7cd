"""What the parts of the Trident policy read in common: the pipeline spec and the cluster planned for.

Contract: ``Context(spec, cluster)``: ``spec`` is the pipeline's spec (None: unknown; then no config
space, optimiser or replica bounds are known), ``cluster`` the cluster planned for. ``given_cluster``
is the one the policy was built with; ``follow(state)`` replaces ``cluster`` with the live nodes the
runner reports (``live_cluster``: memory figures from the given classes), if it reports any, at the
start of every tick, so every part sees the same cluster within a tick. ``planned_for(state)`` is that
cluster, or one node of the runner's CPUs and GPUs when none is known.
"""

from __future__ import annotations

from typing import Any

from trident_flows.core.state import RunnerState
from trident_flows.core.types import ClusterSpec
from trident_flows.scheduler.live_cluster import live_cluster


class Context:
    """The pipeline spec and the cluster every part reads (see the module docstring)."""

    def __init__(self, spec: Any | None, cluster: ClusterSpec | None) -> None:
        self.spec = spec
        self.cluster = cluster
        self.given_cluster = cluster

    def follow(self, state: RunnerState) -> None:
        live = live_cluster(state, self.given_cluster)
        if live is not None:  # the live nodes, read by the runner: a node that joined or left changes what is planned for
            self.cluster = live

    def planned_for(self, state: RunnerState) -> ClusterSpec:
        return self.cluster or ClusterSpec.single_node(state.cluster_cpus, int(state.cluster_gpus))
