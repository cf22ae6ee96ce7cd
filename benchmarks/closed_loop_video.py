"""Benchmark ``closed-loop-video``: the closed-loop benchmark (``closed_loop``) on the emulated
video pipeline (cost models from ``profiles/video.json``). ``run(quick) -> BenchResult``."""

from __future__ import annotations

from typing import Sequence

from benchmarks import closed_loop
from benchmarks.closed_loop import SPIKE_SYSTEMS, SYSTEMS
from benchmarks.report import BenchResult


def run(quick: bool = False, *, systems: Sequence[str] = SYSTEMS, spike_systems: Sequence[str] = SPIKE_SYSTEMS,
        repeats: int | None = None) -> BenchResult:
    """``closed_loop.run`` with ``pipeline="video"``."""
    return closed_loop.run(quick, pipeline="video", systems=systems, spike_systems=spike_systems, repeats=repeats)
