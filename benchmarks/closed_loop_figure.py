"""The closed-loop benchmark's figure, and the timeline helpers other closed-loop figures share.

Contract: ``figure(main, spikes, workload, summary, reach, colors, title)`` draws completed items/s
over time per system (median repeat) for the regimes and memory-spike variants with the regimes
shaded, trident's replicas per operator, and the median throughput per system. Helpers:
``median_run`` (the run of median throughput of a system), ``completion_rate`` (items/s in time
bins), ``since_first_output`` (a timeline from the run's first output) and ``regime_spans`` (about
when the last operator worked on each block). matplotlib is imported only when drawing.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from benchmarks.closed_loop_runs import RunRecord
from benchmarks.closed_loop_stats import per_system
from benchmarks.closed_loop_workload import Workload


def median_run(records: Sequence[RunRecord], system: str) -> RunRecord | None:
    """The run of ``system`` with the median throughput among its runs without error that have a timeline
    (the upper middle one of an even count); None if there is none."""
    ok = sorted((r for r in records if r.system == system and not r.error and r.timeline), key=lambda r: r.items_per_s or 0)
    return ok[len(ok) // 2] if ok else None


def completion_rate(timeline: Sequence[tuple[float, int]], bin_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Completed items/s in bins of ``bin_s`` seconds of a (seconds, items completed) timeline, as (bin
    centres, rates); empty arrays for a timeline of fewer than two points."""
    if len(timeline) < 2:
        return np.array([]), np.array([])
    t = np.array([p[0] for p in timeline])
    n = np.array([p[1] for p in timeline], dtype=float)
    edges = np.arange(0.0, t[-1] + bin_s, bin_s)
    done = np.interp(edges, np.concatenate([[0.0], t]), np.concatenate([[0.0], n]))
    return edges[1:] - bin_s / 2, np.diff(done) / bin_s


def since_first_output(run: RunRecord) -> list[tuple[float, int]]:
    """The run's timeline with time counted from its first output (cold starts differ between systems)."""
    t0 = run.startup_s or 0.0
    return [(t - t0, n) for t, n in run.timeline if t >= t0]


def regime_spans(run: RunRecord, blocks: Sequence[tuple[str, int, int]], reach: float) -> list[tuple[str, float, float]]:
    """About when the run's last operator worked on each block: its items taken / ``reach`` (the share of
    input items that get past the upstream filters) read as a position in the input stream."""
    t0 = run.startup_s or 0.0
    t = np.array([p[0] - t0 for p in run.tail])
    n = np.maximum.accumulate(np.array([p[1] for p in run.tail], dtype=float)) / reach
    return [(r, float(np.interp(s, n, t)), float(np.interp(e, n, t))) for r, s, e in blocks]


def figure(main: Sequence[RunRecord], spikes: Sequence[RunRecord], workload: Workload, summary: Mapping[str, Any],
           reach: float = 1.0, colors: Mapping[str, str] | None = None, title: str = "") -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(14, 8.5))
    bin_s = 1.0
    trident = median_run(main, "trident")
    for ax, records, title in ((axes[0][0], main, "regimes"), (axes[1][0], spikes, "memory spikes (5x per item, inside the long block)")):
        ref = median_run(records, "trident")
        if ref is not None and ref.tail:
            for regime, a, b in regime_spans(ref, workload.blocks(), reach):
                ax.axvspan(a, b, color=(colors or {}).get(regime, "#eeeeee"), alpha=0.8, lw=0)
                ax.text((a + b) / 2, 1.0, regime, transform=ax.get_xaxis_transform(), ha="center", va="bottom", fontsize=8)
        for system in dict.fromkeys(r.system for r in records):
            run = median_run(records, system)
            if run is None:
                continue
            x, y = completion_rate(since_first_output(run), bin_s)
            extra = f", {run.ooms} OOMs" if run.ooms else ""
            ax.plot(x, y, lw=2.2 if system == "trident" else 1.2, label=f"{system} ({run.items_per_s:.1f}/s{extra})")
        ax.set_title(f"{title}: completed items/s ({bin_s:g} s bins, median repeat);\nshaded: regime at trident's last operator (approx.)",
                     fontsize=9)
        ax.set_xlabel("seconds since the run's first output")
        ax.set_ylabel("items/s")
        ax.set_yscale("symlog", linthresh=5)
        ax.legend(fontsize=7, ncol=2)
    ax = axes[0][1]
    if trident is not None:
        t0 = trident.startup_s or 0.0
        for op, series in trident.replicas.items():
            ax.step([p[0] - t0 for p in series], [p[1] for p in series], where="post", label=op)
        ax.set_title("trident: replicas per operator (runner state, median repeat)", fontsize=9)
        ax.set_xlabel("seconds since the run's first output (negative: cold start)")
        ax.set_ylabel("active replicas")
        ax.legend(fontsize=7)
    ax = axes[1][1]
    stats = per_system(main)
    names = list(stats)
    vals = [stats[s]["items_per_s_median"] or 0.0 for s in names]
    ax.bar(range(len(names)), vals, color=["C3" if s == "trident" else "C0" for s in names])
    for k, s in enumerate(names):
        label = "n/a" if stats[s]["items_per_s_median"] is None else f"{vals[k]:.1f}"
        ax.text(k, vals[k], label, ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(names)), names, rotation=30, fontsize=8)
    ax.set_ylabel("items/s (median of repeats)")
    fmt = {k: ("n/a" if v is None else f"{v:.2f}x") for k, v in summary.items()}
    fmt.setdefault("oracle_headroom_model", "n/a")
    ax.set_title(f"{title}regimes: median throughput (first to last output). trident vs static-avg {fmt['speedup_vs_static_avg']}, "
                 f"Ray Data {fmt['speedup_vs_ray_data']},\nxenna {fmt['speedup_vs_xenna']}, oracle {fmt['ratio_to_oracle']}", fontsize=9)
    fig.tight_layout()
    return fig

