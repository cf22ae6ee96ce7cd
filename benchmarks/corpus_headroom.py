"""How much any scheduler could gain on the corpus workloads: the cost model's fluid headroom and the simulated one.

Contract of ``run(quick)`` (the benchmark ``corpus-headroom``; every figure SIMULATED or modelled, none live):
- For ``documents-corpus`` and ``video-corpus`` (``corpus_workloads``), on 1 node (and, full run, on
  ``NODES_MANY`` nodes): the fluid headroom (``headroom.headroom``: per-source optimum switched for
  free over the best static in hindsight, on the cost model's mean item of each source) and the
  simulated headroom (``sim_headroom.simulated_headroom``: the model's allocations measured, and
  hill-climbed, in the simulator on the corpus's own items; the oracle switches for free).
- Summary per workload: ``headroom_fluid_<n>n``, ``headroom_sim_<n>n``; raw keeps the schedules, the
  per-source rates and allocations, the workload's ``sources`` (the pages of the published statistics)
  and every figure of the corpus model with its kind (published / derived / assumed).
- The figure: the simulated and fluid headroom per workload and node count.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from benchmarks import corpus_workloads, headroom, sim_headroom
from benchmarks.closed_loop_workload import DEVICE_MEMORY, GPUS
from benchmarks.report import BenchResult
from trident_flows.core.types import ClusterSpec, NodeClass

NODES_MANY = 8
KEYS = {1: ("headroom_fluid_1n", "headroom_sim_1n"), NODES_MANY: ("headroom_fluid_8n", "headroom_sim_8n")}  # summary keys by nodes
MAX_EVALS, QUICK_MAX_EVALS = 40, 6


def cluster(nodes: int) -> ClusterSpec:
    return ClusterSpec((NodeClass("node", nodes, corpus_workloads.CPUS, GPUS, DEVICE_MEMORY),))


def measure(name: str, quick: bool, nodes: int, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The fluid and simulated headroom of corpus workload ``name`` on ``nodes`` nodes."""
    t0 = time.perf_counter()
    workload, stream = corpus_workloads.corpus_workload(name, quick, nodes)
    fluid = headroom.headroom(workload)
    log(f"{name} {nodes}n: fluid headroom {fluid.ratio:.4f} ({time.perf_counter() - t0:.0f} s)")
    simulated = sim_headroom.simulated_headroom(workload, stream, cluster(nodes),
                                                max_evals=QUICK_MAX_EVALS if quick else MAX_EVALS)
    log(f"{name} {nodes}n: simulated headroom {simulated.ratio:.4f} ({time.perf_counter() - t0:.0f} s, "
        f"{simulated.evals} allocations measured)")
    return {"nodes": nodes, "fluid": fluid.to_dict(), "simulated": simulated.to_dict(), "schedule": [list(b) for b in workload.schedule],
            "seconds": time.perf_counter() - t0}


def run(quick: bool) -> BenchResult:
    node_counts = (1,) if quick else (1, NODES_MANY)
    summary: dict[str, Any] = {}
    raw: dict[str, Any] = {}
    for name in corpus_workloads.CORPORA:
        workload, _ = corpus_workloads.corpus_workload(name, quick)
        raw[name] = {"sources": list(workload.sources), "figures": corpus_workloads.figures_of(name), "note": workload.note,
                     "runs": []}
        summary[name] = {}
    for nodes in node_counts:  # every workload on 1 node first
        for name in corpus_workloads.CORPORA:
            result = measure(name, quick, nodes)
            raw[name]["runs"].append(result)
            fluid_key, sim_key = KEYS[nodes]
            summary[name][fluid_key] = round(result["fluid"]["headroom"], 4)
            summary[name][sim_key] = round(result["simulated"]["headroom"], 4)
    notes = ("SIMULATED and modelled, no live run. Workloads drawn from published corpus statistics (raw.<workload>.figures: "
             "each figure published, derived or assumed, with its page). Headroom = the stream's duration under the best single "
             "static allocation in hindsight / under each source's best allocation switched for free at block boundaries: "
             "fluid on the cost model's mean item per source, simulated on the corpus's own items (sim_headroom). Items beyond "
             "the profiles' measured range run on the cost models extrapolated (raw.<workload>.note).")
    return BenchResult("corpus-headroom", summary, raw=raw, figure=_figure(summary), notes=notes)


def _figure(summary: dict[str, Any]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    labels, fluid, sim = [], [], []
    for name, figs in summary.items():
        for key in figs:
            if key.startswith("headroom_sim_"):
                n = key.rsplit("_", 1)[1]
                labels.append(f"{name}\n{n}")
                sim.append(figs[key])
                fluid.append(figs[f"headroom_fluid_{n}"])
    xs = range(len(labels))
    ax.bar([x - 0.2 for x in xs], fluid, width=0.4, color="#9db7dc", label="fluid (cost model)")
    ax.bar([x + 0.2 for x in xs], sim, width=0.4, color="#3465a4", label="simulated")
    for x, r in zip(xs, sim):
        ax.text(x + 0.2, r + 0.01, f"{r:.2f}x", ha="center", fontsize=8)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.set_ylabel("static hindsight / per-source optimum")
    ax.set_title("Headroom of the corpus workloads (SIMULATED)")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    return fig
