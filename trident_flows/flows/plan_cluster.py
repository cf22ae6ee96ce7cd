"""The ``plan-cluster`` flow: which cluster to rent for a corpus, published as Prefect artifacts.

Contract:
- Parameters are those of ``trident-flows plan``: the corpus as a regime mix (``regimes``) or a
  sample directory (``sample``), ``items``, one goal (``deadline_h`` or ``budget``), an optional
  catalogue file and subset of its classes (``only``), how many options to check in the
  simulator (``simulate_top``).
- It runs ``planning.planner.plan_cluster`` and publishes, under keys derived from
  ``artifact_key``: a table artifact ``<key>-options`` (the recommendation and runner-ups, one row
  each, with ranges) and a markdown artifact ``<key>-pareto`` (the recommendation in words, the
  starting placement, notes and the Pareto plot of cost against duration inlined as a PNG data URI).
- It returns the recommendation as the JSON document of ``trident-flows plan --json``
  (``planning.report.plan_json``). A bad input fails the flow run with the CLI's one-line message
  (a ``PlanningError``), before anything is published.
"""

from __future__ import annotations

import base64
import tempfile
from pathlib import Path
from typing import Any, Optional

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from trident_flows.planning.catalogue import PlanningError, load_catalogue
from trident_flows.planning.planner import ClusterOption, Goal, plan_cluster
from trident_flows.planning.report import pareto_png, plan_json, plan_lines
from trident_flows.planning.workload import from_regimes, from_sample


def _row(kind: str, o: ClusterOption, currency: str) -> dict[str, Any]:
    low, high = o.items_per_s_range
    return {"option": kind, "nodes": o.label(), "items_per_s": round(o.items_per_s, 3),
            "items_per_s_range": f"{low:.3g}-{high:.3g}",
            "simulated_items_per_s": round(o.simulated_items_per_s, 3) if o.simulated_items_per_s else None,
            "hours": round(o.hours, 3), f"cost_{currency}": round(o.cost, 2),
            f"cost_range_{currency}": "{:.2f}-{:.2f}".format(*o.cost_range()), f"price_per_hour_{currency}": o.price_per_hour,
            "bottleneck": ", ".join(o.bottlenecks)}


@flow(name="plan-cluster", description="Which nodes to rent for a corpus and a goal (deadline or budget): node counts by "
      "optimisation, checked in the simulator; publishes the options table and the Pareto plot.")
def plan_cluster_flow(items: int, regimes: Optional[str] = None, sample: Optional[str] = None, pipeline: str = "documents",
                      deadline_h: Optional[float] = None, budget: Optional[float] = None, catalogue: Optional[str] = None,
                      only: Optional[list[str]] = None, simulate_top: int = 3, artifact_key: str = "cluster-plan") -> dict[str, Any]:
    logger = get_run_logger()
    if (regimes is None) == (sample is None):
        raise PlanningError("describe the corpus with one of regimes (e.g. 'short:500,scans:500') or sample (a directory)")
    goal = Goal(items, deadline_h=deadline_h, budget=budget)
    nodes = load_catalogue(Path(catalogue) if catalogue else None)
    nodes = nodes.only(list(only)) if only else nodes
    workload = from_regimes(pipeline, regimes) if regimes is not None else from_sample(Path(sample))  # type: ignore[arg-type]
    result = plan_cluster(workload, nodes, goal, simulate_top=simulate_top)
    r, cur = result.recommended, nodes.currency
    logger.info("recommended %s: %.3g items/s, %.3g h, %.4g %s", r.label(), r.items_per_s, r.hours, r.cost, cur)
    rows = [_row("recommended", r, cur)] + [_row(f"runner-up {i}", o, cur) for i, o in enumerate(result.runner_ups, start=1)]
    create_table_artifact(rows, key=f"{artifact_key}-options", description=f"Cluster options: {goal.describe(cur)}")
    with tempfile.TemporaryDirectory() as tmp:
        png = base64.b64encode(pareto_png(result, Path(tmp) / "pareto.png").read_bytes()).decode("ascii")
    low, high = r.hours_range()
    markdown = "\n".join([f"### Recommended: {r.label()}", "",
                          f"**{r.items_per_s:.3g} items/s, {r.hours:.3g} h ({low:.3g}-{high:.3g}), {r.cost:.4g} {cur}** "
                          f"for {goal.describe(cur)}.", ""]
                         + [f"- {line}" for line in plan_lines(result)]
                         + ["", f"![cost against duration of the checked clusters](data:image/png;base64,{png})", ""])
    create_markdown_artifact(markdown, key=f"{artifact_key}-pareto", description=f"Recommended {r.label()}")
    return plan_json(result)
