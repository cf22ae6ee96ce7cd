"""Pipelines by name. Each entry names a module with ``build(**options) -> PipelineSpec``.

Contract of ``build``: keyword-only options ``input`` (a directory of inputs, or None),
``synth`` (generate this many synthetic inputs when no input is given), ``seed``,
``regimes`` (a regime schedule string such as "short:200,long:100,scans:100", or None for
the pipeline's default), ``work_dir`` (where generated inputs may be cached), ``quality`` and
``tune`` (quality knob settings and tunable ranges, ``trident_flows.pipelines.quality``; a
pipeline without quality knobs refuses them). Modules are imported lazily so that an emulated
pipeline runs without the ``models`` extra installed.

A module may also define ``finish_run(spec, out_dir) -> dict``: what must happen to a run's
committed output once the run has ended (the documents pipeline settles near-duplicates found
out of order); ``finish_pipeline(spec, out_dir)`` calls it, and returns ``{}`` for the others.
Likewise ``resume_run(spec, out_dir) -> dict``: what must be restored from the committed shards of
an earlier run before a run resumes into ``out_dir`` (the documents pipeline seeds its
near-duplicate index); ``resume_pipeline(spec, out_dir)`` calls it.
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
