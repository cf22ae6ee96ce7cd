"""Pipelines by name. Each entry names a module with ``build(**options) -> PipelineSpec``.

Contract of ``build``: keyword-only ``input`` (a directory, or None), ``synth`` (synthetic inputs
when no input is given), ``seed``, ``regimes`` (a schedule such as "short:200,long:100", or None),
``work_dir`` (a cache for generated inputs), ``quality`` and ``tune`` (``pipelines.quality``; a
pipeline without quality knobs refuses them). Modules are imported lazily, so an emulated pipeline
runs without the ``models`` extra.

Optional hooks: ``finish_run(spec, out_dir) -> dict`` (what a run's committed output needs once
the run ended), called by ``finish_pipeline``; ``resume_run(spec, out_dir) -> dict`` (what to restore
from committed shards before a run resumes), called by ``resume_pipeline``; both ``{}`` without one.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from trident_flows.runtime.spec import PipelineSpec

PIPELINES: dict[str, str] = {
    "emulated-docs": "trident_flows.pipelines.emulated_docs",
    "emulated-video": "trident_flows.pipelines.emulated_video",
    "documents": "trident_flows.pipelines.documents",
    "video": "trident_flows.pipelines.video",
}


def build_pipeline(name: str, **options: Any) -> PipelineSpec:
    if name not in PIPELINES:
        raise ValueError(f"unknown pipeline {name!r}; choose one of {sorted(PIPELINES)}")
    module = importlib.import_module(PIPELINES[name])
    return module.build(**options)


def finish_pipeline(spec: PipelineSpec, out_dir: Path | str) -> dict[str, Any]:
    """Run the pipeline module's ``finish_run`` on a finished run's output (see the module docstring)."""
    if spec.name not in PIPELINES:
        return {}
    finish = getattr(importlib.import_module(PIPELINES[spec.name]), "finish_run", None)
    return dict(finish(spec, Path(out_dir))) if finish is not None else {}


def resume_pipeline(spec: PipelineSpec, out_dir: Path | str) -> dict[str, Any]:
    """Run the pipeline module's ``resume_run`` before a run resumes into ``out_dir`` (see the module docstring)."""
    if spec.name not in PIPELINES:
        return {}
    restore = getattr(importlib.import_module(PIPELINES[spec.name]), "resume_run", None)
    return dict(restore(spec, Path(out_dir))) if restore is not None else {}
