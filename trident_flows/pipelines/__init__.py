"""Pipelines by name. Each entry names a module with ``build(**options) -> PipelineSpec``.

Contract of ``build``: keyword-only options ``input`` (a directory of inputs, or None),
``synth`` (generate this many synthetic inputs when no input is given), ``seed``,
``regimes`` (a regime schedule string such as "short:200,long:100,scans:100", or None for
the pipeline's default) and ``work_dir`` (where generated inputs may be cached). Modules are
imported lazily so that an emulated pipeline runs without the ``models`` extra installed.
"""

from __future__ import annotations

import importlib
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
