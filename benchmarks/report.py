"""Benchmark reports: one JSON and one PNG per benchmark (conventions in docs/architecture.md).

Contract: a benchmark module returns a ``BenchResult``; ``write_report`` writes
``DIR/NAME.json`` with ``summary`` (headline figures, plain numbers, possibly nested), ``targets``
(goal per headline figure, a nested one by its dotted key, and whether it was met), ``provenance`` (where and how it ran, machine included:
``bench.provenance``; the one the caller recorded from before the run, else what can be recorded
at write time; its ``time_scale`` is the result's ``raw["time_scale"]`` where that is a number) and
``raw`` (the measurements), and ``DIR/NAME.png`` from the result's matplotlib figure. Both files
are written atomically (temporary file, then rename).
"""

from __future__ import annotations

import json
import math
import operator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator, Mapping

from benchmarks.provenance import Provenance

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


def figures(summary: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """The summary's figures in its order, a nested figure under its dotted key."""
    for key, value in summary.items():
        if isinstance(value, Mapping):
            yield from figures(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def figure(summary: Mapping[str, Any], key: str) -> Any:
    """``summary[key]``, or for a dotted key (``sim.cpu-only.headroom``) the nested figure it names (None when absent)."""
    if key in summary:
        return summary[key]
    value: Any = summary
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def write_report(result: BenchResult, out_dir: Path, quick: bool, provenance: Provenance | None = None) -> tuple[Path, Path | None]:
    out_dir.mkdir(parents=True, exist_ok=True)
    provenance = provenance if provenance is not None else Provenance.at_write_time()
    time_scale = result.raw.get("time_scale")
    if isinstance(time_scale, (int, float)) and not isinstance(time_scale, bool):
        provenance = replace(provenance, time_scale=float(time_scale))
    doc = {
        "name": result.name,
        "quick": quick,
        "summary": _plain(result.summary),
        "targets": {k: {"goal": f"{t.op} {t.value}", "met": t.met(figure(result.summary, k))} for k, t in result.targets.items()},
        "provenance": provenance.to_dict(),
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
