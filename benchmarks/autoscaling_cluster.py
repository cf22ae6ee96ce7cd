"""Ray's local autoscaling cluster (``ray.cluster_utils.AutoscalingCluster``: the fake multi-node provider Ray tests
its autoscaler with) on a port and a temporary directory of its own, stopped without touching any other Ray.

Contract:
- ``OwnAutoscalingCluster(head_resources, worker_node_types, idle_timeout_minutes=0.1)``: ``start()`` starts
  the head (autoscaler v2) on a free port under a fresh temporary directory, never stopping another Ray
  cluster on the machine; ``shutdown()`` ends only this cluster's processes, each by its id, and removes the
  directory.
- ``address`` is the GCS address to ``ray.init(address=...)`` (never ``"auto"``); the cluster runs without
  token authentication (``RAY_AUTH_MODE=disabled`` for its processes).
- ``status()`` is the autoscaler's own view: the live worker nodes per node type, the standing
  ``request_resources`` bundles, the pending launches and the nodes launched but not yet joined.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ray.cluster_utils import AutoscalingCluster

STOP_WAIT_S = 15.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OwnAutoscalingCluster(AutoscalingCluster):
    """``AutoscalingCluster`` on its own port and directory, with two changes. Its base config is written here (this Ray
    wheel does not ship the ``fake_multi_node/example.yaml`` the class reads, nor the autoscaler under the provider's
    own type name: the same provider class is named as an external module). ``start()`` runs ``ray start --head``
    itself, where Ray's ``start`` first runs ``ray stop --force``, which would stop every Ray cluster of the user on
    the machine."""

    def __init__(self, head_resources: dict[str, Any], worker_node_types: dict[str, Any], idle_timeout_minutes: float = 0.1) -> None:
        self.idle_timeout_minutes = idle_timeout_minutes
        self.port = _free_port()
        self.temp_dir = Path(tempfile.mkdtemp(prefix="tfas-", dir="/tmp"))  # short: Ray's socket paths live under it
        super().__init__(dict(head_resources), worker_node_types, autoscaler_v2=True)

    def _generate_config(self, head_resources: dict[str, Any], worker_node_types: dict[str, Any], autoscaler_v2: bool = False,
                         **config_kwargs: Any) -> dict[str, Any]:
        import ray
        from ray.autoscaler._private.fake_multi_node.node_provider import FAKE_HEAD_NODE_ID, FAKE_HEAD_NODE_TYPE

        types = dict(worker_node_types)
        types[FAKE_HEAD_NODE_TYPE] = {"resources": head_resources, "node_config": {}, "max_workers": 0}
        ip = ray._private.services.get_node_ip_address()
        return {"cluster_name": "trident-elastic", "max_workers": sum(int(t.get("max_workers", 0)) for t in worker_node_types.values()),
                "upscaling_speed": 1.0, "idle_timeout_minutes": self.idle_timeout_minutes,
                # Ray's fake multi-node provider, loaded as an external module: under its own type name the
                # autoscaler reads its defaults from the example.yaml this wheel lacks
                "provider": {"type": "external", "module": "ray.autoscaler._private.fake_multi_node.node_provider.FakeMultiNodeProvider",
                             "use_node_id_as_ip": True, "disable_node_updaters": True,
                             "disable_launch_config_check": True, "gcs_address": f"{ip}:{self.port}", "launch_multiple": True,
                             "head_node_id": FAKE_HEAD_NODE_ID},
                "available_node_types": types, "head_node_type": FAKE_HEAD_NODE_TYPE, "auth": {"ssh_user": "ubuntu"},
                "docker": {}, "file_mounts": {}, "cluster_synced_files": [], "file_mounts_sync_continuously": False,
                "rsync_exclude": [], "rsync_filter": [], "initialization_commands": [], "setup_commands": [],
                "head_setup_commands": [], "worker_setup_commands": [], "head_start_ray_commands": [], "worker_start_ray_commands": [],
                **config_kwargs}

    @property
    def address(self) -> str:
        return self._config["provider"]["gcs_address"]

    def start(self, _system_config: dict[str, Any] | None = None, override_env: dict[str, str] | None = None) -> None:
        """``ray start --head`` with the class's autoscaling config and environment (autoscaler v2, ``RAY_FAKE_CLUSTER``)
        on ``port`` under ``temp_dir``; ``RAY_AUTH_MODE=disabled`` for its processes whatever the caller's environment
        says (Ray reads that mode once, at import, so a driver process cannot switch it afterwards)."""
        from ray.autoscaler._private.fake_multi_node.node_provider import FAKE_HEAD_NODE_ID

        config = self.temp_dir / "autoscaling.json"
        config.write_text(json.dumps(self._config))
        head = dict(self._head_resources)
        cmd = [str(Path(sys.executable).parent / "ray"), "start", "--head", f"--port={self.port}", f"--temp-dir={self.temp_dir}", f"--autoscaling-config={config}",
               "--include-dashboard=false", "--disable-usage-stats", f"--ray-client-server-port={_free_port()}",
               f"--dashboard-agent-listen-port={_free_port()}", f"--num-cpus={head.pop('CPU', 1)}"]
        if "GPU" in head:
            cmd.append(f"--num-gpus={head.pop('GPU')}")
        if "object_store_memory" in head:
            cmd.append(f"--object-store-memory={head.pop('object_store_memory')}")
        if "memory" in head:
            cmd.append(f"--memory={head.pop('memory')}")
        if head:
            cmd.append(f"--resources={json.dumps(head)}")
        if _system_config is not None:
            cmd.append(f"--system-config={json.dumps(_system_config, separators=(',', ':'))}")
        env = {**os.environ, "RAY_AUTH_MODE": "disabled", "AUTOSCALER_UPDATE_INTERVAL_S": "1", "RAY_FAKE_CLUSTER": "1", "RAY_enable_autoscaler_v2": "1",
               "RAY_CLOUD_INSTANCE_ID": FAKE_HEAD_NODE_ID, "RAY_OVERRIDE_NODE_ID_FOR_TESTING": FAKE_HEAD_NODE_ID, **(override_env or {})}
        done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"ray start --head failed ({done.returncode}): {done.stderr[-2000:]}")

    def _own_pids(self) -> list[int]:
        """Processes whose command line names this cluster's directory (ours: nobody else knows it)."""
        mark, pids = str(self.temp_dir).encode(), []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                try:
                    if mark in (entry / "cmdline").read_bytes():
                        pids.append(int(entry.name))
                except OSError:  # gone meanwhile, or not readable: not ours
                    continue
        return pids

    def shutdown(self) -> None:
        """End the processes whose command line names this cluster's directory (the head's, and the worker nodes the
        autoscaler started: they take the head's temporary directory), each by its id, and remove the directory."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in self._own_pids():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + STOP_WAIT_S
            while self._own_pids() and time.monotonic() < deadline:
                time.sleep(0.5)
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def status(self) -> dict[str, Any]:
        """The autoscaler's view (``ray.autoscaler.v2.sdk.get_cluster_status``): live workers per node type, the standing
        ``request_resources`` bundles, the pending launches and the nodes launched but not yet joined (``pending_nodes``,
        per node type)."""
        from ray.autoscaler.v2.sdk import get_cluster_status

        status = get_cluster_status(self.address)
        workers: dict[str, int] = {}
        for node in list(status.active_nodes) + list(status.idle_nodes):
            if node.ray_node_type_name in self._config["available_node_types"] and node.ray_node_type_name != "ray.head.default":
                workers[node.ray_node_type_name] = workers.get(node.ray_node_type_name, 0) + 1
        requested = [dict(b.bundle) for d in status.resource_demands.cluster_constraint_demand for b in d.bundles_by_count
                     for _ in range(b.count)]
        pending = [{"type": p.ray_node_type_name, "count": p.count} for p in status.pending_launches]
        starting: dict[str, int] = {}
        for node in status.pending_nodes:
            starting[node.ray_node_type_name] = starting.get(node.ray_node_type_name, 0) + 1
        return {"workers": workers, "requested_bundles": requested, "pending_launches": pending, "pending_nodes": starting,
                "idle_workers": sorted(n.ray_node_type_name for n in status.idle_nodes if n.ray_node_type_name != "ray.head.default")}
