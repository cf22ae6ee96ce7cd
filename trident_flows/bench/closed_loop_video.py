"""Benchmark ``closed-loop-video``: the closed-loop benchmark (``closed_loop``) on the emulated
video pipeline (cost models from ``profiles/video.json``). ``run(quick) -> BenchResult``."""

from __future__ import annotations

from typing import Any

from trident_flows.bench import closed_loop
from trident_flows.bench.report import BenchResult


def run(quick: bool = False, **options: Any) -> BenchResult:
    """``closed_loop.run`` with ``pipeline="video"``."""
    return closed_loop.run(quick, pipeline="video", **options)
