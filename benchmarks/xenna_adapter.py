"""Run an emulated pipeline under cosmos-xenna 0.3.0 (NVIDIA's pipeline scheduler), streaming mode.

Contract:
- ``run_xenna(spec, *, device_prefix, device_namespace, autoscale_interval_s, window_s) -> XennaRun`` runs
  the operators of ``spec`` (each with its initial ``OpConfig``) as xenna stages on the current Ray cluster,
  with xenna's own autoscaler deciding the workers per stage (``StageSpec(num_workers=None)``). ``XennaRun``:
  seconds from submission to the last output, the output rows' ids, and each output row's completion time
  (seconds since submission, stamped by the last stage).
- Every row passes every stage (rows marked ``_drop``/``_error`` are skipped by later operators, as in the
  runtime), so ids in = ids out unless xenna loses an item.
- The cluster needs Ray's dashboard (``ray.init(include_dashboard=True)``) and, for GPU stages, the emulated
  devices the caller created (``runtime.devices.create_devices(device_prefix, ...)``).
- Nothing is left running: xenna's processes below this driver are killed after the run (``stop_xenna_processes``).
- Requires the ``bench`` extra (``pip install 'trident-flows[bench]'``); ``ImportError`` names it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from trident_flows.runtime.spec import ID, OperatorSpec, PipelineSpec, rows_to_batch

DONE_AT = "_done_at"

try:
    from cosmos_xenna.pipelines import v1 as xenna
except ImportError as exc:  # pragma: no cover - depends on the optional extra
    xenna = None
    _IMPORT_ERROR = exc
else:
    _IMPORT_ERROR = None


def _batch_to_rows(batch: dict[str, Any]) -> list[dict[str, Any]]:
    n = len(batch[ID])
    return [{k: (v[i].item() if hasattr(v[i], "item") else v[i]) for k, v in batch.items()} for i in range(n)]


if xenna is not None:

    class EmulatedStage(xenna.Stage):
        """One operator of a PipelineSpec as a xenna stage. On a GPU stage xenna allocates GPUs itself (it creates
        workers with ``num_cpus=0`` and sets ``CUDA_VISIBLE_DEVICES``), so Ray's GPU ids are empty inside a worker;
        the stage binds the emulated device of the GPU index xenna gave it (``WorkerMetadata.allocation.gpus``)."""

        def __init__(self, op: OperatorSpec, device_prefix: str, device_namespace: str | None, t0: float, last: bool) -> None:
            self.op = op
            self.device_prefix = device_prefix
            self.device_namespace = device_namespace
            self.t0 = t0
            self.last = last
            self.impl: Any = None

        @property
        def stage_batch_size(self) -> int:
            return int(self.op.config.batch_size)

        @property
        def required_resources(self) -> Any:
            return xenna.Resources(cpus=float(self.op.config.cpus), gpus=float(self.op.config.gpus))

        def setup(self, worker_metadata: Any) -> None:
            import ray

            from trident_flows.runtime import devices

            device = None
            if self.op.config.gpus > 0:
                gpu = worker_metadata.allocation.gpus[0].index
                name = devices.device_name(self.device_prefix, ray.get_runtime_context().get_node_id(), gpu)
                device = ray.get_actor(name, namespace=self.device_namespace)
            self.impl = self.op.cls(config=self.op.config, device=device, **dict(self.op.params))

        def process_data(self, in_data: list[dict[str, Any]]) -> list[dict[str, Any]]:
            out = _batch_to_rows(self.impl(rows_to_batch(in_data)))
            if self.last:
                now = time.time() - self.t0
                for row in out:
                    row[DONE_AT] = now
            return out


def _cluster_resources(cpu_allocation_percentage: float) -> Any:
    """xenna's ClusterResources for the current Ray cluster, GPUs from Ray's (logical) GPU count."""
    import math
    import uuid

    import ray
    from cosmos_xenna.pipelines.private import resources

    nodes = {}
    for node in ray.nodes():
        if not node.get("Alive", True):
            continue
        res = node.get("Resources", {})
        gpus = [resources.GpuResources(index=i, uuid_=uuid.uuid5(uuid.NAMESPACE_OID, f"{node['NodeID']}:{i}"), used_fraction=0.0)
                for i in range(int(res.get("GPU", 0)))]
        nodes[str(node["NodeID"])] = resources.NodeResources(
            used_cpus=0.0, total_cpus=max(0, math.floor(float(res.get("CPU", 0)) * cpu_allocation_percentage)), gpus=gpus,
            name=str(node["NodeID"]))
    return resources.ClusterResources(nodes)


def _run_streaming(pipeline_spec: Any) -> list | None:
    """xenna's ``run_pipeline`` from the cluster discovery on. xenna's ``run_pipeline`` discovers GPUs with NVML on each
    node, so on a machine without NVIDIA GPUs it sees none and refuses a GPU stage ("Not enough GPU resources"), and it
    calls ``ray.init()`` without an address (which may find another local cluster). So this does what ``run_pipeline``
    does after that discovery, on the current Ray cluster: the same stage-spec preparation, then xenna's own streaming
    executor (``streaming.run_pipeline``) with a ``ClusterResources`` built from Ray's node list, logical GPUs included
    (CPUs at xenna's default 95% allocation). xenna's monitor uses Ray's state API, so the cluster needs its dashboard,
    and ``RAY_ADDRESS`` is set to this driver's cluster for it."""
    import copy
    import os

    import loguru
    import ray
    from cosmos_xenna._cosmos_xenna import setup_logging
    from cosmos_xenna.pipelines.private import specs, streaming
    from cosmos_xenna.ray_utils import cluster

    setup_logging()
    os.environ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] = "1"
    ray.util.register_serializer(loguru.logger.__class__, serializer=cluster.logger_custom_serializer,
                                 deserializer=cluster.logger_custom_deserializer)
    # xenna's monitor lists actors through Ray's state API, which resolves address=None to the *latest* local
    # cluster: point it at this driver's cluster (the state API needs that cluster's dashboard)
    os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    spec = copy.deepcopy(pipeline_spec)
    spec.stages = [x if isinstance(x, specs.StageSpec) else specs.StageSpec(x) for x in spec.stages]
    spec.stages = [x.override_with_pipeline_params(spec.config) for x in spec.stages]
    cluster_resources = _cluster_resources(spec.config.cpu_allocation_percentage)
    for stage_spec in spec.stages:
        stage_spec.validate(cluster_resources)
    if spec.config.mode_specific is None:
        spec.config.mode_specific = specs.StreamingSpecificSpec()
    return streaming.run_pipeline(spec, cluster_resources)


XENNA_ACTOR_TITLES = ("ray::StageWorker", "ray::NodeResourceMonitor")


def stop_xenna_processes(grace_s: float = 5.0) -> list[str]:
    """SIGKILL xenna's actor processes below this driver still alive after ``grace_s``. xenna's ``NodeResourceMonitor``
    keeps a non-daemon thread (Ray's graceful actor exit and even the raylet's death leave its process alive) and a
    ``StageWorker`` can survive xenna's ``ray.kill``; killing both classes' processes keeps them from holding a CPU
    during later runs or outliving the cluster."""
    import psutil

    def xenna_procs() -> list[psutil.Process]:
        found = []
        for proc in psutil.Process().children(recursive=True):
            try:
                if proc.cmdline()[:1] and proc.cmdline()[0].startswith(XENNA_ACTOR_TITLES):
                    found.append(proc)
            except psutil.Error:
                continue
        return found

    procs = xenna_procs()
    _, alive = psutil.wait_procs(procs, timeout=grace_s) if procs else ([], [])
    killed = []
    for proc in alive:
        try:
            killed.append(f"{proc.cmdline()[0]} (pid {proc.pid})")
            proc.kill()
        except psutil.Error:
            continue
    return killed


@dataclass(frozen=True)
class XennaRun:
    wall_s: float
    ids: tuple[str, ...]
    done_at: tuple[float, ...]


def run_xenna(spec: PipelineSpec, *, device_prefix: str, device_namespace: str | None, autoscale_interval_s: float = 5.0,
              window_s: float = 10.0) -> XennaRun:
    """Run ``spec`` under xenna's streaming executor and autoscaler (see the module docstring), then SIGKILL xenna's
    leftover processes (``stop_xenna_processes``)."""
    if xenna is None:
        raise ImportError(f"cosmos-xenna is not installed ({_IMPORT_ERROR}); install the bench extra: pip install 'trident-flows[bench]'")
    rows = list(spec.source())
    t0 = time.time()
    n = len(spec.operators)
    stages = [xenna.StageSpec(EmulatedStage(op, device_prefix, device_namespace, t0, k == n - 1)) for k, op in enumerate(spec.operators)]
    config = xenna.PipelineConfig(
        execution_mode=xenna.ExecutionMode.STREAMING, return_last_stage_outputs=True, logging_interval_s=3600,
        actor_pool_verbosity_level=xenna.VerbosityLevel.NONE, monitoring_verbosity_level=xenna.VerbosityLevel.NONE,
        mode_specific=xenna.StreamingSpecificSpec(autoscale_interval_s=autoscale_interval_s,
                                                  autoscale_speed_estimation_window_duration_s=window_s,
                                                  executor_verbosity_level=xenna.VerbosityLevel.NONE))
    try:
        outputs = _run_streaming(xenna.PipelineSpec(input_data=rows, stages=stages, config=config)) or []
        wall = time.time() - t0
    finally:
        stop_xenna_processes()
    flat = [row for item in outputs for row in (item if isinstance(item, list) else [item])]
    return XennaRun(wall, tuple(str(r[ID]) for r in flat), tuple(float(r[DONE_AT]) for r in flat))
