"""Running a user's Ray Data pipeline under trident: from a Dataset, or from ``MODULE:FUNCTION``.

Contract:
- ``load_function("pkg.module:build")`` (or ``"path/to/file.py:build"``) imports the function that
  returns the Dataset; its module is shipped to Ray workers by value. A bad target is refused
  saying what to write. ``call_function(fn, **options)`` passes the options its signature accepts
  and checks it returned a Dataset.
- ``prepare(ds, work_dir, name=None) -> PipelineSpec`` reads the plan (refusing what trident cannot
  run, before anything runs) and stages the input; ``prepare_target(target, work_dir, **options)``
  does it from ``MODULE:FUNCTION`` (named after the module).
- ``run_dataset(ds, out_dir, *, policy="trident", ...) -> RayDataRun``: prepare, run to the end
  (``control.launch.run_pipeline``), then ``pipeline.publish`` what Ray Data would have written.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from trident_flows.ray_data.pipeline import RayDataPlanError, publish, read_dataset
from trident_flows.runtime.spec import PipelineSpec

FUNCTION_OPTIONS = ("input", "synth", "seed", "regimes")


def load_function(target: str) -> Callable[..., Any]:
    """The function named by ``MODULE:FUNCTION`` (see the module docstring)."""
    module_name, sep, attr = str(target).rpartition(":")
    if not sep or not module_name or not attr.isidentifier():
        raise RayDataPlanError(f"{target!r} is not MODULE:FUNCTION; write e.g. 'examples.ray_data_emulated:build' or "
                               "'path/to/pipeline.py:build' (a function returning a ray.data.Dataset)")
    if module_name.endswith(".py") or "/" in module_name:
        path = Path(module_name).resolve()
        if not path.is_file():
            raise RayDataPlanError(f"{target!r}: no file {path}")
        name = f"trident_user_pipeline_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    else:
        if str(Path.cwd()) not in sys.path and "" not in sys.path:
            sys.path.insert(0, str(Path.cwd()))
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            raise RayDataPlanError(f"{target!r}: cannot import {module_name!r} ({exc}); run from the directory that holds it "
                                   "or give a file path, e.g. 'examples/ray_data_emulated.py:build'") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise RayDataPlanError(f"{target!r}: module {module_name!r} has no function {attr!r}")
    if not module.__name__.startswith("trident_flows."):
        from ray import cloudpickle

        cloudpickle.register_pickle_by_value(module)
    return fn


def call_function(fn: Callable[..., Any], **options: Any) -> Any:
    """Call the user's function with the options its signature accepts (see the module docstring)."""
    from ray.data import Dataset

    params = inspect.signature(fn).parameters
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    kwargs = {k: v for k, v in options.items() if k in FUNCTION_OPTIONS and v is not None and (takes_all or k in params)}
    ds = fn(**kwargs)
    if not isinstance(ds, Dataset):
        raise RayDataPlanError(f"{getattr(fn, '__qualname__', fn)!r} returned {type(ds).__name__}, not a ray.data.Dataset: return the "
                               "Dataset before its write (ds.write_parquet(...) runs the pipeline at once and returns None)")
    return ds


def prepare(ds: Any, work_dir: Path | str, name: str | None = None) -> PipelineSpec:
    """Read, check and stage a Ray Data pipeline; the ``PipelineSpec`` trident runs (see the module docstring)."""
    pipeline = read_dataset(ds, name)
    items = pipeline.stage_input(work_dir)
    return pipeline.pipeline_spec(work_dir, items)


def prepare_target(target: str, work_dir: Path | str, **options: Any) -> PipelineSpec:
    """``prepare`` for the Dataset returned by ``MODULE:FUNCTION``."""
    fn = load_function(target)
    module = target.rpartition(":")[0]
    name = (Path(module).stem if module.endswith(".py") or "/" in module else module.rpartition(".")[2]).replace("_", "-")
    return prepare(call_function(fn, **options), work_dir, name=name)


@dataclass(frozen=True)
class RayDataRun:
    """A finished run: the runtime's summary and where the Ray Data output was published."""

    summary: Any  # control.launch.RunSummary
    dataset_dir: str
    rows_published: int


def run_dataset(ds: Any, out_dir: Path | str, *, policy: str = "trident", dest: Path | str | None = None, name: str | None = None,
                tick_s: float = 2.0, decision_log: Path | None = None, settings: Any = None, **policy_options: Any) -> RayDataRun:
    """Run a Ray Data pipeline under trident on the current Ray cluster (see the module docstring)."""
    from trident_flows.control.launch import cluster_totals, run_pipeline
    from trident_flows.core.types import ClusterSpec
    from trident_flows.scheduler.policies import make_policy

    out = Path(out_dir)
    make_policy(policy)  # refuse an unknown policy before anything runs
    spec = prepare(ds, out / "_inputs", name=name)
    cpus, gpus = cluster_totals()
    policy_obj = make_policy(policy, spec=spec, cluster=ClusterSpec.single_node(cpus, int(gpus)), **policy_options)
    summary = run_pipeline(spec, out, settings=settings, policy=policy_obj, tick_s=tick_s, decision_log=decision_log, overwrite=True)
    published = publish(out, dest)
    return RayDataRun(summary, str(Path(dest) if dest is not None else out / "dataset"), published["rows"])
