"""Statistics over closed-loop run records: per-system medians and the benchmark's summary.

Contract: ``per_system(records)``: for each system (in order of first appearance) its runs, the
median throughput and accelerator busy fraction of its runs without error, OOMs, items lost,
reconfigurations, refused applies and errors. ``summarise(main, spikes)``: trident's median
throughput over static-avg, Ray Data, xenna and the oracle (regimes variant), and trident's OOMs,
items lost, refused applies and 95th-percentile tick milliseconds over both variants. A figure
that cannot be computed (no run of that system succeeded) is None.
"""

from __future__ import annotations

import statistics
from typing import Any, Iterable, Sequence

import numpy as np

from benchmarks.closed_loop_runs import RunRecord


def _median(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return float(statistics.median(vals)) if vals else None


def per_system(records: Sequence[RunRecord]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for system in dict.fromkeys(r.system for r in records):
        rs = [r for r in records if r.system == system]
        ok = [r for r in rs if not r.error and r.items_per_s is not None]
        out[system] = {
            "runs": len(rs), "ok_runs": len(ok),
            "items_per_s_median": _median(r.items_per_s for r in ok),
            "items_per_s": [r.items_per_s for r in rs],
            "accel_busy_median": _median(r.accel_busy for r in ok),
            "ooms": None if any(r.ooms is None for r in ok) or not ok else sum(r.ooms for r in ok),
            "items_lost": None if not ok else sum(r.items_lost or 0 for r in ok),
            "reconfigurations_median": _median(r.reconfigurations for r in ok),
            "applies_refused": sum(r.applies_refused or 0 for r in ok),
            "refused_repeated": sum(r.refused_repeated or 0 for r in ok),
            "errors": sorted({r.error for r in rs if r.error}),
        }
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summarise(main: Sequence[RunRecord], spikes: Sequence[RunRecord]) -> dict[str, Any]:
    stats = per_system(main)
    tp = {s: v["items_per_s_median"] for s, v in stats.items()}
    trident = [r for r in (*main, *spikes) if r.system == "trident" and not r.error]
    ticks = [t for r in trident for t in r.tick_ms]
    return {
        "speedup_vs_static_avg": _ratio(tp.get("trident"), tp.get("static-avg")),
        "speedup_vs_ray_data": _ratio(tp.get("trident"), tp.get("ray-data")),
        "speedup_vs_xenna": _ratio(tp.get("trident"), tp.get("xenna")),
        "ratio_to_oracle": _ratio(tp.get("trident"), tp.get("oracle")),
        "trident_ooms": sum(r.ooms or 0 for r in trident) if trident else None,
        "trident_items_lost": sum(r.items_lost or 0 for r in trident) if trident else None,
        "tick_ms_p95": float(np.percentile(ticks, 95)) if ticks else None,
        "applies_refused": sum(r.applies_refused or 0 for r in trident) if trident else None,
        "refused_repeated": sum(r.refused_repeated or 0 for r in trident) if trident else None,
    }

