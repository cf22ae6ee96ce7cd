"""The throughput timeline of a run with the policy's decisions marked: the PNG of the run's account.

Contract: ``timeline_png(account, points, done_t, path)`` writes a PNG to ``path`` (folders
created; a failed write raises ``OutputWriteError`` naming ``path``) and returns its bytes. Top panel: input items done per second (measured, from ``done_t``,
in bins of ``bin_s(run)``: about 30 bins, 2 s at least), the items taken per second of each
operator a decision changed (measured, from the control loop's ``CountPoint``s, in the same bins),
the run's measured mean, and the starting
configuration's rate when the account has one, drawn dashed and labelled ESTIMATE. Bottom panel:
each operator's serving replicas. Every decision is a vertical line where it landed (where it was
decided when nothing changed) numbered as in the account, coloured by status, its rolling update
(from the decision to its last step) shaded. Rendered off-screen
(a matplotlib ``Figure`` of its own, no pyplot state).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Sequence

import numpy as np
from matplotlib.figure import Figure

from trident_flows.control.account import ROLLED_BACK, RunAccount
from trident_flows.control.run_record import CountPoint
from trident_flows.core.output_errors import naming_the_path

TIMELINE_PNG = "timeline.png"  # the file name beside a run's output (``OUT/timeline.png``)
STATUS_COLOURS = {"landed": "tab:green", "partial": "tab:orange", "refused": "tab:red", ROLLED_BACK: "tab:purple"}


def bin_s(run_s: float) -> float:
    """The bin of the rate curves: about 30 bins over the run, 2 s at least (a bin holds a few batches)."""
    return max(2.0, run_s / 30.0)


def timeline_png(account: RunAccount, points: Sequence[CountPoint], done_t: np.ndarray, path: Path | str) -> bytes:
    """Draw the account's timeline into ``path`` and return the PNG (see the module docstring)."""
    done = np.asarray(done_t, dtype=float)
    done = np.sort(done[~np.isnan(done)]) - account.origin
    run_s = max(account.end - account.origin, 1e-9)
    fig = Figure(figsize=(10, 6), dpi=100)
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1.4]})
    step = bin_s(run_s)
    edges = np.arange(0.0, run_s + step, step)
    if len(edges) >= 2 and len(done):
        counts, _ = np.histogram(done, edges)
        top.step(edges[:-1], counts / step, where="post", color="black", lw=1.8, label="pipeline: input items done (measured)")
    names = [name for name, _ in points[0].items_in] if points else []
    ts = np.array([p.at - account.origin for p in points])
    changed = {name for d in account.decisions for name in d.operators}
    for name in names:
        bottom.step(ts, [dict(p.replicas).get(name, 0) for p in points], where="post", label=name)
        inside = edges[(edges >= ts[0]) & (edges <= ts[-1])] if len(ts) else edges[:0]
        if name in changed and len(inside) >= 2:
            taken = np.interp(inside, ts, [dict(p.items_in).get(name, 0) for p in points])
            top.step(inside[:-1], np.diff(taken) / np.diff(inside), where="post", lw=1, alpha=0.85, label=f"{name}: items taken (measured)")
    top.axhline(account.measured_items_per_s, color="grey", ls=":", lw=1, label=f"measured mean {account.measured_items_per_s:.3g}")
    if account.estimate.items_per_s is not None:
        top.axhline(account.estimate.items_per_s, color="tab:blue", ls="--", lw=1.2,
                    label=f"ESTIMATE: starting configuration {account.estimate.items_per_s:.3g} (models)")
    for d in account.decisions:
        at = d.landed_s if d.landed_s is not None else d.at_s
        colour = STATUS_COLOURS.get(d.status, "tab:gray")
        for ax in (top, bottom):
            ax.axvline(at, color=colour, ls="--", lw=1)
            if d.landed_s is not None and d.landed_s > d.at_s:  # the rolling update, from the decision to its last step
                ax.axvspan(d.at_s, d.landed_s, color=colour, alpha=0.08, lw=0)
        top.annotate(f"#{d.n}", (at, 1.0), xycoords=("data", "axes fraction"), xytext=(2, -12), textcoords="offset points",
                     color=colour, fontsize=9)
    title = (f"{account.policy}: {len(account.decisions)} decision(s)" if account.decisions
             else f"{account.policy}: {account.decisions_note}")
    top.set_title(title if len(title) <= 110 else title[:107] + "...", fontsize=10)
    top.set_ylabel("items/s")
    top.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    top.set_ylim(bottom=0)
    bottom.set_ylabel("replicas")
    bottom.set_xlabel("seconds since the first item was read")
    if names:
        bottom.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    png = buf.getvalue()
    out = Path(path)
    with naming_the_path(out):
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(png)
    return png
