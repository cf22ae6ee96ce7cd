"""A ``ClusterPlan`` shown to people and programs: the JSON document, the rich table and the Pareto plot.

Contract:
- ``plan_json(plan)``: ``recommended`` (class -> count), ``predicted_items_per_s``,
  ``predicted_hours``, ``cost`` (in the catalogue's currency) with ``*_range`` of each,
  ``starting_plan`` (the placement trident would start with, ``Plan.to_dict``), ``runner_ups``
  and ``pareto`` (each an option's figures), the goal, workload, catalogue and notes.
- ``plan_table(plan)``: one row per option (recommended first), ``plan_lines(plan)`` the lines
  around it (workload, goal, starting placement, notes).
- ``pareto_png(plan, path)``: cost against duration of every checked option (at the lower of its
  predicted and simulated rate), the Pareto front joined, the recommendation marked with its
  range, the deadline or budget drawn; returns the path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table

from trident_flows.planning.planner import ClusterOption, ClusterPlan


def _option(o: ClusterOption) -> dict[str, Any]:
    return o.to_dict()


def plan_json(plan: ClusterPlan) -> dict[str, Any]:
    r = plan.recommended
    return {
        "recommended": {c: n for c, n in r.counts.items() if n > 0},
        "predicted_items_per_s": r.items_per_s,
        "items_per_s_range": list(r.items_per_s_range),
        "simulated_items_per_s": r.simulated_items_per_s,
        "predicted_hours": r.hours,
        "hours_range": list(r.hours_range()),
        "cost": r.cost,
        "cost_range": list(r.cost_range()),
        "currency": plan.catalogue.currency,
        "price_per_hour": r.price_per_hour,
        "bottlenecks": list(r.bottlenecks),
        "items_per_s_regime_blocks": r.blocks_items_per_s,
        "starting_plan": r.plan.to_dict(),
        "runner_ups": [_option(o) for o in plan.runner_ups],
        "pareto": [_option(o) for o in plan.pareto()],
        "checked_cost": r.checked_cost,
        "goal": {"items": plan.goal.items, "deadline_h": plan.goal.deadline_h, "budget": plan.goal.budget},
        "workload": {"pipeline": plan.workload.pipeline, "mix": dict(plan.workload.weights), "source": plan.workload.source,
                     "mean_item": plan.workload.mean_features()},
        "catalogue": {"source": plan.catalogue.source, "startup_minutes": plan.catalogue.startup_minutes,
                      "nodes": {n.name: {"cpus": n.cpus, "gpus": n.gpus, "gpu_mem_bytes": n.gpu_memory_bytes,
                                         "price_per_hour": n.price_per_hour, "max_count": n.max_count} for n in plan.catalogue.nodes}},
        "notes": list(plan.notes),
    }


def _span(low: float, high: float, digits: str = ".3g") -> str:
    return f"{low:{digits}}-{high:{digits}}"


def plan_table(plan: ClusterPlan) -> Table:
    cur = plan.catalogue.currency
    table = Table(title=f"trident-flows plan: {plan.goal.describe(cur)}")
    for col in ("", "nodes", "items/s (range)", "simulated", "hours (range)", f"cost {cur} (range)", f"{cur}/h", "bottleneck"):
        table.add_column(col, justify="left" if col in ("", "nodes", "bottleneck") else "right")
    for i, o in enumerate((plan.recommended,) + plan.runner_ups):
        table.add_row("recommended" if i == 0 else f"runner-up {i}", o.label(),
                      f"{o.items_per_s:.3g} ({_span(*o.items_per_s_range)})",
                      f"{o.simulated_items_per_s:.3g}" if o.simulated_items_per_s else "-",
                      f"{o.hours:.3g} ({_span(*o.hours_range())})", f"{o.cost:.4g} ({_span(*o.cost_range(), '.4g')})",
                      f"{o.price_per_hour:.4g}", ", ".join(o.bottlenecks))
    return table


def plan_lines(plan: ClusterPlan) -> list[str]:
    r = plan.recommended
    lines = [f"workload: {plan.workload.describe()}",
             "starting plan: " + "; ".join(f"{op.operator} " + " + ".join(f"{g.replicas}x {g.config.label()} on {g.node_class}"
                                                                         for g in op.groups if g.replicas) for op in r.plan.operators),
             f"if the corpus arrives sorted by kind (each regime in one block): {r.blocks_items_per_s:.3g} items/s"]
    lines += [f"note: {n}" for n in plan.notes]
    return lines


def pareto_png(plan: ClusterPlan, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import ScalarFormatter

    fig, ax = plt.subplots(figsize=(8, 4.8))
    every = plan.options()
    ax.scatter([o.checked_hours for o in every], [o.checked_cost for o in every], color="#9db7dc", s=18, label="checked clusters")
    front = plan.pareto()
    ax.plot([o.checked_hours for o in front], [o.checked_cost for o in front], color="#3465a4", marker="o", label="Pareto front")
    for k, o in enumerate(front):
        ax.annotate(o.label(), (o.checked_hours, o.checked_cost), fontsize=7, xytext=(4, 6 + 10 * (k % 3)), textcoords="offset points")
    r = plan.recommended
    low, high = r.hours_range()
    ax.errorbar([r.checked_hours], [r.checked_cost], xerr=[[max(0.0, r.checked_hours - low)], [max(0.0, high - r.checked_hours)]],
                color="#cc0000", marker="*", markersize=14, linestyle="none", label=f"recommended: {r.label()} (range)")
    if plan.goal.deadline_h is not None:
        ax.axvline(plan.goal.deadline_h, color="black", linestyle="--", linewidth=0.8, label=f"deadline {plan.goal.deadline_h:g} h")
    if plan.goal.budget is not None:
        ax.axhline(plan.goal.budget, color="black", linestyle="--", linewidth=0.8, label=f"budget {plan.goal.budget:g}")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(ScalarFormatter())
    ax.set_xlabel("hours to process the items (log scale; simulated rate where lower than predicted)")
    ax.set_ylabel(f"cost ({plan.catalogue.currency}{', placeholder prices' if plan.catalogue.placeholder_prices else ''})")
    ax.set_title(f"{plan.workload.pipeline}: {plan.goal.items} items, cost vs duration")
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
