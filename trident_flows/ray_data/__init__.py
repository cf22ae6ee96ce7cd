"""Existing Ray Data pipelines under trident, without rewriting them.

A ``ray.data.read_...().map_batches(UDF, ...)`` Dataset becomes a trident pipeline: each stage an
operator whose replicas, batch size, device and resources trident controls, running the user's UDF
unchanged, with exactly-once output, a dead-letter table, and the rows Ray Data would write.

- ``run_dataset(ds, out_dir, policy="trident")``: the one call (``run``).
- ``prepare`` / ``prepare_target``: the ``PipelineSpec`` of a Dataset / of ``MODULE:FUNCTION``;
  ``publish`` writes its output. ``read_dataset``: the plan read and checked (``RayDataPlanError``).
- Every Ray Data internal used is in ``internals`` (pinned to ``internals.RAY_VERSION``).

``run_dataset`` runs through ``control.launch``, so this package sits above ``control``, which never
imports it (the CLI hands it to ``control.launch.run_command`` as ``dataset_support``).
"""

from trident_flows.ray_data.pipeline import RayDataPipeline, RayDataPlanError, publish, read_dataset
from trident_flows.ray_data.run import RayDataRun, call_function, load_function, prepare, prepare_target, run_dataset

__all__ = ["RayDataPipeline", "RayDataPlanError", "RayDataRun", "call_function", "load_function", "prepare", "prepare_target",
           "publish", "read_dataset", "run_dataset"]
