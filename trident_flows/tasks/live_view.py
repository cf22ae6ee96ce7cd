"""The live view of a tuned pipeline: what a Prefect user watches while the sidecar runs.

Contract:
- ``LiveHistory`` is frozen plain data the sidecar carries between ticks (and between scheduled
  runs, in its memory actor): one ``Point`` per tick (pipeline time, throughput, per-operator
  items taken and serving replicas) and the decisions taken, each as a table row. It keeps the
  last ``MAX_POINTS`` points and ``MAX_DECISIONS`` decisions.
- ``operator_rows(history, state)``: one row per operator: items/s over the last ticks, queue,
  replicas (serving, starting, draining) and device/configuration.
- ``chart_png(history, unit)``: a PNG of throughput over time above each operator's replicas,
  with the decisions marked (matplotlib, rendered off-screen).
- ``render_markdown(...)``: the markdown document of the live-view artifact: status sentence,
  capacity advice (``planning.advice``: the binding resource and what one more node of each
  catalogue class would buy), operator table, the chart inlined as a data URI.
No Ray, no Prefect: the flow publishes what this module renders.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass, replace
from typing import Any, Optional

from trident_flows.planning.advice import advice_dict

# A tick every 2-5 s: 720 points are 25-60 minutes of history, ~50 KB in the memory actor.
MAX_POINTS = 720
MAX_DECISIONS = 200
# Items/s per operator are averaged over this many ticks (one tick's counter deltas are lumpy:
# a batch of 32 finishing or not moves one tick's rate by a whole batch).
RATE_TICKS = 3


@dataclass(frozen=True)
class Point:
    """The pipeline at one tick: ``at`` is the pipeline's wall time in seconds."""

    at: float
    throughput: float
    items_in: tuple[tuple[str, int], ...]
    replicas: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class LiveHistory:
    """Points and decision rows of one tuned pipeline (see the module docstring)."""

    points: tuple[Point, ...] = ()
    decisions: tuple[dict[str, Any], ...] = ()

    def observe(self, state: Any) -> "LiveHistory":
        point = Point(state.wall_s, state.throughput, tuple((o.name, o.items_in) for o in state.operators),
                      tuple((o.name, sum(o.configs().values())) for o in state.operators))
        return replace(self, points=(self.points + (point,))[-MAX_POINTS:])

    def decided(self, row: dict[str, Any]) -> "LiveHistory":
        return replace(self, decisions=(self.decisions + (row,))[-MAX_DECISIONS:])


def _rate(history: LiveHistory, operator: str) -> Optional[float]:
    points = history.points[-(RATE_TICKS + 1):]
    if len(points) < 2 or points[-1].at <= points[0].at:
        return None
    first, last = dict(points[0].items_in), dict(points[-1].items_in)
    if operator not in first or operator not in last:
        return None
    return (last[operator] - first[operator]) / (points[-1].at - points[0].at)


def operator_rows(history: LiveHistory, state: Any) -> list[dict[str, Any]]:
    """One row per operator: items/s, queue, replicas and device (see the module docstring)."""
    rows = []
    for op in state.operators:
        serving = [r for r in op.replicas if not r.draining and r.warm and not r.canary]
        starting = sum(1 for r in op.replicas if not r.draining and not r.warm)
        draining = sum(1 for r in op.replicas if r.draining)
        canaries = sum(1 for r in op.replicas if r.canary and not r.draining)
        extra = ", ".join(f"{n} {what}" for n, what in ((starting, "starting"), (canaries, "canary"), (draining, "draining")) if n)
        configs = op.configs(include_canary=True)
        rate = _rate(history, op.name)
        rows.append({"operator": op.name, "items/s": "-" if rate is None else round(rate, 2), "queue": op.queue_items,
                     "replicas": f"{len(serving)}" + (f" ({extra})" if extra else ""),
                     "device": ", ".join(sorted({c.device for c in configs})) or "-",
                     "configuration": ", ".join(f"{n} x {c.label()}" for c, n in sorted(configs.items(), key=lambda kv: kv[0].label())) or "-",
                     "busy": f"{op.busy_fraction:.0%}"})
    return rows


def chart_png(history: LiveHistory, unit: str) -> bytes:
    """Throughput (top) and replicas per operator (bottom) over pipeline time, decisions marked."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 4.2), dpi=90)
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    times = [p.at for p in history.points]
    top.plot(times, [p.throughput for p in history.points], color="#2563eb", lw=1.8)
    top.set_ylabel(unit)
    top.set_title("pipeline throughput and replicas; dashed lines: decisions", fontsize=10)
    names = [name for name, _ in history.points[-1].replicas] if history.points else []
    for name in names:
        bottom.step(times, [dict(p.replicas).get(name, 0) for p in history.points], where="post", lw=1.5, label=name)
    bottom.set_ylabel("replicas")
    bottom.set_xlabel("seconds since the pipeline started")
    if names:
        bottom.legend(loc="upper left", fontsize=7, ncol=min(len(names), 6), frameon=False)
    for row in history.decisions:
        at = row.get("pipeline time (s)")
        if isinstance(at, (int, float)):
            for ax in (top, bottom):
                ax.axvline(at, color="#dc2626" if row.get("outcome", "").startswith("applied") else "#9ca3af", ls="--", lw=1)
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def _table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return ""
    head = list(rows[0])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(r.get(k, "")).replace("|", "/") for k in head) + " |" for r in rows]
    return "\n".join(lines)


def render_markdown(history: LiveHistory, state: Any, status: str, unit: str, title: str) -> str:
    """The live-view artifact: status, operator table, chart, the latest decisions."""
    parts = [f"### {title}", "",
             f"**{status}**", "",
             f"{state.items_written + state.items_dead_lettered} of {state.items_in} items through "
             f"({state.items_dead_lettered} dead-lettered) after {state.wall_s:.0f} s, {state.throughput:.2f} {unit}; "
             f"{len(history.decisions)} decision(s) so far.", ""]
    advice = advice_dict(state)
    if advice.get("summary"):  # the binding resource and what one more node of each class would buy (planning.advice)
        parts += [f"Capacity: {advice['summary']}", ""]
    parts += [_table(operator_rows(history, state)), ""]
    if len(history.points) >= 2:
        png = base64.b64encode(chart_png(history, unit)).decode("ascii")
        parts += [f"![throughput and replicas over time](data:image/png;base64,{png})", ""]
    return "\n".join(parts)
