"""``RayClusterBlock``: where the pipeline runs — an existing Ray cluster by address, or a
local Ray node with stated logical resources.

Contract:
- ``address`` empty: ``connect()`` starts a new local node (``num_cpus``, ``num_gpus``,
  ``object_store_mb``); never ``address="auto"``, which could attach to somebody else's cluster.
- ``address`` set: ``connect()`` joins it after checking within ``connect_timeout_s`` that
  something listens there; a token-authenticated head needs ``auth_token`` (or ``RAY_AUTH_TOKEN``).
- ``connect()`` reuses this process's Ray connection and reports whether it started one;
  ``task_runner()`` is prefect-ray's ``RayTaskRunner`` for the same target.
- ``nic_bandwidth`` declares the local node's link as its ``trident.nic`` label (refused with
  ``address``, or when not a rate). ``env_vars`` reach every Ray worker's runtime environment.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from prefect.blocks.core import Block
from pydantic import Field, SecretStr, field_validator, model_validator

from trident_flows.blocks.catalogue import DOCUMENTATION_URL, LOGO_URL
from trident_flows.core.units import parse_rate
from trident_flows.runtime.nodes import NIC_LABEL

_ADDRESS = re.compile(r"^(ray://)?[A-Za-z0-9_.\-\[\]:]+:\d{2,5}$")


@dataclass(frozen=True)
class RayConnection:
    """The Ray cluster this process is connected to, and whether ``connect()`` started it."""

    address: str
    namespace: str
    started_by_us: bool
    resources: Mapping[str, float]


class RayClusterBlock(Block):
    """A Ray cluster for Trident pipelines: an existing cluster's address, or the logical
    resources of a local Ray node to start (logical GPUs make placement real on CPU-only machines)."""

    _block_type_name = "Trident Ray Cluster"
    _block_type_slug = "trident-ray-cluster"
    _description = "An existing Ray cluster (address) or a local Ray node (CPUs, logical GPUs, object store) for Trident pipelines."
    _documentation_url = DOCUMENTATION_URL
    _logo_url = LOGO_URL

    address: Optional[str] = Field(
        default=None,
        description="Existing cluster: 'ray://HOST:10001' (Ray Client) or 'HOST:6379' (from a cluster node). "
                    "Leave empty to start a local Ray node with the resources below.",
    )
    num_cpus: Optional[int] = Field(default=None, ge=1, description="Logical CPUs of the local node (empty: the machine's cores).")
    num_gpus: float = Field(default=0.0, ge=0, description="Logical GPUs of the local node (may exceed the physical ones for emulation).")
    object_store_mb: Optional[int] = Field(default=None, ge=100, description="Object store size of the local node in MiB (empty: Ray's default).")
    nic_bandwidth: Optional[str] = Field(
        default=None,
        description="Network link of the local node, each way, e.g. '100Gbps' (bits) or '12.5GBps' (bytes); Ray does not measure it. "
                    "The placement keeps cross-node bytes within it. Empty: not declared. Nodes of an existing cluster declare theirs "
                    "with `ray start --labels trident.nic=100Gbps`.",
    )
    namespace: str = Field(default="trident", min_length=1, description="Ray namespace the pipeline runner and the sidecar share.")
    connect_timeout_s: float = Field(default=10.0, gt=0, description="How long connect() waits for the cluster's address to answer.")
    auth_token: Optional[SecretStr] = Field(
        default=None,
        description="Token of a cluster started with RAY_AUTH_MODE=token (`ray get-auth-token`); empty: use RAY_AUTH_TOKEN / ~/.ray/auth_token.",
    )

    @field_validator("address")
    @classmethod
    def _check_address(cls, value: Optional[str]) -> Optional[str]:
        if value is None or not value.strip():
            return None
        value = value.strip()
        if value in ("auto", "local"):
            raise ValueError(f"address={value!r} is not allowed: 'auto' may attach to a stranger's cluster. "
                             "Give the cluster's address, e.g. 'ray://head:10001', or leave address empty for a local node")
        if not _ADDRESS.match(value):
            raise ValueError(f"address={value!r} is not a Ray address: use 'ray://HOST:10001' or 'HOST:6379'")
        return value

    @field_validator("nic_bandwidth")
    @classmethod
    def _check_nic(cls, value: Optional[str]) -> Optional[str]:
        if value is None or not value.strip():
            return None
        parse_rate(value, "nic_bandwidth")  # raises naming the field and what to write
        return value.strip()

    @model_validator(mode="after")
    def _check_local_resources(self) -> "RayClusterBlock":
        if self.address and (self.num_cpus is not None or self.num_gpus or self.object_store_mb is not None):
            raise ValueError("num_cpus / num_gpus / object_store_mb describe a local node and are ignored for an existing cluster: "
                             f"clear them, or clear address={self.address!r} to start a local node")
        if self.address and self.nic_bandwidth:
            raise ValueError(f"nic_bandwidth describes the local node; the nodes of the cluster at {self.address!r} declare their own: "
                             f"start them with `ray start --labels {NIC_LABEL}={self.nic_bandwidth}` and clear nic_bandwidth")
        return self

    def init_kwargs(self, env_vars: Mapping[str, str] | None = None) -> dict[str, Any]:
        """Keyword arguments for ``ray.init`` (without the address)."""
        kwargs: dict[str, Any] = {"namespace": self.namespace, "ignore_reinit_error": True}
        if not self.address:
            kwargs.update(num_gpus=self.num_gpus, include_dashboard=False)
            if self.num_cpus is not None:
                kwargs["num_cpus"] = self.num_cpus
            if self.object_store_mb is not None:
                kwargs["object_store_memory"] = self.object_store_mb * 2**20
            if self.nic_bandwidth:
                kwargs["labels"] = {NIC_LABEL: self.nic_bandwidth}
        if env_vars:
            kwargs["runtime_env"] = {"env_vars": dict(env_vars)}
        return kwargs

    @property
    def ray_address(self) -> str:
        """What ``ray.init`` is called with: the cluster address, or ``"local"`` (always a new node)."""
        return self.address or "local"

    def _export_auth(self) -> None:
        if self.address and self.auth_token is not None:
            os.environ["RAY_AUTH_MODE"] = "token"
            os.environ["RAY_AUTH_TOKEN"] = self.auth_token.get_secret_value()

    def check_reachable(self) -> None:
        """Raise ``ConnectionError`` naming the address when no process listens there."""
        if not self.address:
            return
        host, _, port = self.address.removeprefix("ray://").rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=self.connect_timeout_s).close()
        except OSError as exc:
            raise ConnectionError(f"no Ray cluster answers at address={self.address!r} ({exc}): start one there "
                                  "(e.g. `RAY_AUTH_MODE=token ray start --head --port 6379`) or fix the RayClusterBlock's address") from exc

    def connect(self, env_vars: Mapping[str, str] | None = None) -> RayConnection:
        """Join the cluster (or start the local node) unless this process is already connected."""
        import ray

        started = False
        if not ray.is_initialized():
            self.check_reachable()
            self._export_auth()
            ray.init(self.ray_address, **self.init_kwargs(env_vars))
            started = True
        context = ray.get_runtime_context()
        return RayConnection(address=context.gcs_address, namespace=context.namespace, started_by_us=started,
                             resources=dict(ray.cluster_resources()))

    def task_runner(self, env_vars: Mapping[str, str] | None = None):
        """prefect-ray's ``RayTaskRunner`` for this cluster (it reuses a connection this process already holds)."""
        from prefect_ray import RayTaskRunner

        self._export_auth()
        return RayTaskRunner(address=self.ray_address, init_kwargs=self.init_kwargs(env_vars))
