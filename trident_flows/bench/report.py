"""Benchmark reports: one JSON and one PNG per benchmark (conventions in docs/architecture.md).

Contract: a benchmark module returns a ``BenchResult``; ``write_report`` writes
``DIR/NAME.json`` with ``summary`` (headline figures, plain numbers), ``targets`` (goal per
headline figure and whether it was met), ``machine`` (where it ran) and ``raw`` (the
measurements), and ``DIR/NAME.png`` from the result's matplotlib figure. Both files are
written atomically (temporary file, then rename).
"""

from __future__ import annotations

import json
import math
import operator
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_OPS = {"<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt, "==": operator.eq}


@dataclass(frozen=True)
class Target:
    """A goal for one summary figure, e.g. ``Target("<=", 0.05)``."""

    op: str
    value: float

    def met(self, measured: float) -> bool:
        return measured is not None and not (isinstance(measured, float) and math.isnan(measured)) and _OPS[self.op](measured, self.value)


@dataclass
class BenchResult:
    name: str
    summary: dict[str, Any]
    targets: dict[str, Target] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)
    figure: Any = None  # a matplotlib Figure
    notes: str = ""


def machine_info() -> dict[str, Any]:
    import psutil

    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "processor": platform.processor() or platform.machine(),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _plain(value: Any) -> Any:
    """Make numpy scalars and arrays JSON-serialisable."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_report(result: BenchResult, out_dir: Path, quick: bool) -> tuple[Path, Path | None]:
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {
        "name": result.name,
        "quick": quick,
        "summary": _plain(result.summary),
        "targets": {k: {"goal": f"{t.op} {t.value}", "met": t.met(result.summary.get(k))} for k, t in result.targets.items()},
        "machine": machine_info(),
        "notes": result.notes,
        "raw": _plain(result.raw),
    }
    json_path = out_dir / f"{result.name}.json"
    tmp = json_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(json_path)
    png_path = None
    if result.figure is not None:
        png_path = out_dir / f"{result.name}.png"
        tmp_png = out_dir / f".{result.name}.tmp.png"
        result.figure.savefig(tmp_png, dpi=110, bbox_inches="tight")
        tmp_png.replace(png_path)
    return json_path, png_path
