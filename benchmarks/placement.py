"""Benchmark "placement": MILP solve time vs cluster size and operator count, and the
optimality gap against exhaustive search (issue 6).

Contract: ``run(quick) -> BenchResult``. Seeded random instances: pipelines of 5/10/20
operators (CPU-only operators, and accelerator operators with CPU and whole/fractional
GPU options of different device memory, diminishing-returns curves, host<->device
traffic) on 1/8/16/64/256 nodes of three kinds (CPU-only nodes, nodes with 16 GiB GPUs,
nodes with 80 GiB GPUs). Every instance is solved with HiGHS (the default) and with CBC
side by side; times are end-to-end ``solve_placement`` calls (model build, solver,
node packing, plan). Small instances (2-3 operators, 1-3 nodes) are also solved by brute
force over every replica count of every (option, node class) that fits; the gap is
``(T_bruteforce - T_milp) / T_bruteforce``. Summary keys: ``p95_ms_16x10`` (default solver
HiGHS, 16 nodes x 10 operators), ``p95_ms_256_nodes`` (HiGHS, 256 nodes, all operator
counts), ``max_gap_small``; CBC and CPU-time figures alongside.
"""

from __future__ import annotations

import random
import resource
import statistics
import time

from benchmarks.report import BenchResult, Target
from trident_flows.core.types import ClusterSpec, NodeClass, OpConfig
from trident_flows.scheduler.placement.milp import PlacementError, solve_placement
from trident_flows.scheduler.placement.model import Key, class_capacity, ineligibility, operator_capacity, pack_cluster, throughput_of, usage_vector
from trident_flows.scheduler.placement.solvers import GAP_REL
from trident_flows.scheduler.placement.types import GiB, OperatorDemand, PlacementOption

NODE_COUNTS = (1, 8, 16, 64, 256)
TIME_LIMIT_S = 1.0  # the default of solve_placement
FAST_LIMIT_S = 0.15  # a tighter budget, to show what it costs in throughput
OP_COUNTS = (5, 10, 20)


def make_cluster(nodes: int) -> ClusterSpec:
    """``nodes`` nodes: half CPU-only, a quarter with 4 x 16 GiB GPUs, a quarter with 8 x 80 GiB GPUs
    (a single node is one 128-CPU node with 8 x 40 GiB GPUs, so 20 operators fit on it)."""
    if nodes == 1:
        return ClusterSpec((NodeClass("gpu40", 1, 128, 8, 40 * GiB, 512 * GiB, 64e9),))
    gpu16 = max(1, nodes // 4)
    gpu80 = max(1, nodes // 4)
    cpu = nodes - gpu16 - gpu80
    classes = [NodeClass("cpu", cpu, 32, 0, 0, 128 * GiB)] if cpu else []
    classes += [NodeClass("gpu16", gpu16, 16, 4, 16 * GiB, 64 * GiB, 16e9), NodeClass("gpu80", gpu80, 32, 8, 80 * GiB, 256 * GiB, 32e9)]
    return ClusterSpec(tuple(classes))


def make_demands(n_ops: int, seed: int, max_replicas: int = 4096) -> list[OperatorDemand]:
    """A seeded random pipeline of ``n_ops`` operators (about 40% accelerator operators)."""
    rng = random.Random(seed)
    demands = []
    for i in range(n_ops):
        work = rng.choice([1.0, 1.0, 0.8, 3.0, 12.0, 40.0])
        options = []
        cpu_rate = rng.uniform(2, 50)
        for cpus in rng.sample([1, 2, 4], k=rng.randint(1, 2)):
            options.append(PlacementOption.from_rate(
                OpConfig.make("cpu", batch_size=rng.choice([4, 16]), cpus=cpus), cpu_rate * cpus * rng.uniform(0.7, 1.0),
                max_replicas=max_replicas, contention=rng.uniform(0, 0.02), host_mem_bytes=int(rng.uniform(0.5, 4) * cpus * GiB),
                cold_start_s=rng.uniform(1, 10)))
        if rng.random() < 0.4:
            for gpus in rng.sample([1.0, 0.5, 0.25], k=rng.randint(1, 2)):
                options.append(PlacementOption.from_rate(
                    OpConfig.make("gpu", batch_size=rng.choice([16, 64]), cpus=rng.choice([1, 2]), gpus=gpus),
                    cpu_rate * rng.uniform(8, 40) * gpus ** 0.5, max_replicas=max_replicas, contention=rng.uniform(0, 0.02),
                    host_mem_bytes=int(rng.uniform(2, 8) * GiB), device_mem_bytes=int(rng.uniform(1, 30) * GiB),
                    bandwidth_bytes_per_item=rng.uniform(1e5, 2e7), cold_start_s=rng.uniform(10, 60)))
        demands.append(OperatorDemand(f"op{i}", work, tuple(options)))
    return demands


def brute_force(demands: list[OperatorDemand], cluster: ClusterSpec, beat: float = 0.0) -> float:
    """The best throughput over every replica count of every eligible (operator, option,
    node class), enumerated depth-first within the classes' aggregate resources, keeping
    only placements that pack node by node. Branches that cannot beat ``beat`` (or the best
    found so far) are cut once an operator's counts are fixed; returns ``beat`` if nothing
    beats it."""
    keys = [Key(d.name, k, nc.name) for d in demands for k, opt in enumerate(d.options) for nc in cluster.node_classes
            if ineligibility(d, opt, nc) is None]
    by_name = {d.name: d for d in demands}
    vecs = [usage_vector(by_name[op].options[k], cluster.node_class(c)) for op, k, c in keys]
    caps = {nc.name: class_capacity(nc) for nc in cluster.node_classes}
    best = beat
    counts: dict = {}

    def evaluate() -> None:
        nonlocal best
        placed = {key: n for key, n in counts.items() if n}
        if any(sum(n for key, n in placed.items() if key.operator == d.name) < d.min_replicas for d in demands):
            return
        upper = min(operator_capacity(d, placed) / d.work_per_item for d in demands)
        if upper <= best or pack_cluster(demands, cluster, placed):
            return
        best = max(best, throughput_of(demands, cluster, placed))

    def dfs(i: int, use: dict[str, list[float]]) -> None:
        if i > 0 and (i == len(keys) or keys[i].operator != keys[i - 1].operator):  # an operator's counts are complete
            d = by_name[keys[i - 1].operator]
            if operator_capacity(d, {k: n for k, n in counts.items() if k.operator == d.name}) / d.work_per_item <= best:
                return
        if i == len(keys):
            evaluate()
            return
        c, vec = keys[i].node_class, vecs[i]
        n = 0
        while all(use[c][j] + n * vec[j] <= caps[c][j] + 1e-9 for j in range(3)):
            counts[keys[i]] = n
            nxt = {cc: list(u) for cc, u in use.items()}
            for j in range(3):
                nxt[c][j] += n * vec[j]
            dfs(i + 1, nxt)
            n += 1
        counts[keys[i]] = 0

    dfs(0, {nc.name: [0.0, 0.0, 0.0] for nc in cluster.node_classes})
    return best


def _small_instance(seed: int) -> tuple[list[OperatorDemand], ClusterSpec]:
    """A small seeded instance (2-3 operators, 1-3 nodes) with at most 8 (operator, option,
    node) choices, so exhaustive search stays in seconds, and room for every operator."""
    for attempt in range(1000):
        rng = random.Random(1000 * seed + attempt)
        gpu = NodeClass("gpu", rng.choice([1, 2]), rng.choice([4, 6]), rng.choice([1, 2]), rng.choice([8, 16]) * GiB, 32 * GiB,
                        rng.choice([0.0, 2e8]))
        classes = (gpu,) if rng.random() < 0.5 else (NodeClass("cpu", 1, rng.choice([3, 4, 8]), host_memory_bytes=16 * GiB), gpu)
        demands = []
        for i in range(rng.choice([2, 3])):
            opts = [PlacementOption.from_rate(OpConfig.make("cpu", cpus=rng.choice([1, 2])), rng.uniform(1, 10), max_replicas=8,
                                              contention=rng.choice([0.0, 0.1]), host_mem_bytes=int(rng.uniform(1, 6) * GiB))]
            if rng.random() < 0.6:
                opts.append(PlacementOption.from_rate(OpConfig.make("gpu", cpus=1, gpus=rng.choice([1.0, 0.5, 0.25])), rng.uniform(5, 40),
                                                      max_replicas=8, host_mem_bytes=2 * GiB, device_mem_bytes=int(rng.uniform(1, 9) * GiB),
                                                      bandwidth_bytes_per_item=rng.choice([0.0, 1e7])))
            demands.append(OperatorDemand(f"op{i}", rng.choice([1.0, 2.0, 5.0]), tuple(opts)))
        choices = sum(nc.count for d in demands for o in d.options for nc in classes if ineligibility(d, o, nc) is None)
        if choices <= 8:
            try:
                solve_placement(demands, ClusterSpec(classes))
            except PlacementError:
                continue  # minimum replicas do not fit: draw again
            return demands, ClusterSpec(classes)
    raise RuntimeError(f"no small instance for seed {seed}")


def _time_solve(demands: list[OperatorDemand], cluster: ClusterSpec, solver: str, time_limit_s: float = TIME_LIMIT_S) -> dict:
    """One end-to-end solve: wall ms, CPU ms (this process + solver subprocesses), T, status, gap."""
    c0 = time.process_time() + resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
    t0 = time.perf_counter()
    res = solve_placement(demands, cluster, solver=solver, time_limit_s=time_limit_s)
    wall = (time.perf_counter() - t0) * 1e3
    cpu = (time.process_time() + resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime - c0) * 1e3
    return {"ms": wall, "cpu_ms": cpu, "T": res.throughput, "status": res.status, "gap": res.gap, "repairs": res.repairs}


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(0.95 * (len(ordered) - 1))))]


def run(quick: bool) -> BenchResult:
    seeds = 4 if quick else 12
    node_counts = (1, 16, 256) if quick else NODE_COUNTS
    op_counts = (5, 10) if quick else OP_COUNTS
    timings: list[dict] = []
    for solver in ("highs", "cbc"):
        _time_solve(make_demands(3, 0), make_cluster(8), solver)  # warm imports and the CBC binary
    for n_ops in op_counts:
        for nodes in node_counts:
            cluster = make_cluster(nodes)
            for seed in range(seeds):
                demands = make_demands(n_ops, seed)
                row: dict = {"ops": n_ops, "nodes": nodes, "seed": seed}
                for solver in ("highs", "cbc"):  # side by side on the same instance
                    row.update({f"{solver}_{k}": v for k, v in _time_solve(demands, cluster, solver).items()})
                row.update({f"fast_{k}": v for k, v in _time_solve(demands, cluster, "highs", FAST_LIMIT_S).items()})
                timings.append(row)
    small = []
    for seed in range(6 if quick else 20):
        demands, cluster = _small_instance(seed)
        milp = solve_placement(demands, cluster).throughput
        best = brute_force(demands, cluster, beat=milp * (1 - 1e-9))
        gap = max(0.0, (best - milp) / best) if best > 0 else 0.0
        small.append({"seed": seed, "milp_T": milp, "bruteforce_T": best, "gap": gap})
    cells = {}
    for n_ops in op_counts:
        for nodes in node_counts:
            rows = [r for r in timings if r["ops"] == n_ops and r["nodes"] == nodes]
            cells[f"{n_ops}x{nodes}"] = {s: {"median_ms": statistics.median(r[f"{s}_ms"] for r in rows), "p95_ms": _p95([r[f"{s}_ms"] for r in rows]),
                                             "p95_cpu_ms": _p95([r[f"{s}_cpu_ms"] for r in rows]), "max_gap": max(r[f"{s}_gap"] for r in rows)}
                                         for s in ("highs", "cbc", "fast")}

    def pick(solver: str, field: str, ops: int | None = None, nodes: int | None = None) -> list[float]:
        return [r[f"{solver}_{field}"] for r in timings if (ops is None or r["ops"] == ops) and (nodes is None or r["nodes"] == nodes)]

    summary = {
        "p95_ms_16x10": round(_p95(pick("highs", "ms", 10, 16)), 1),
        "p95_ms_256_nodes": round(_p95(pick("highs", "ms", None, 256)), 1),
        "max_gap_small": max(s["gap"] for s in small),
        "median_ms_16x10": round(statistics.median(pick("highs", "ms", 10, 16)), 1),
        "p95_cpu_ms_16x10": round(_p95(pick("highs", "cpu_ms", 10, 16)), 1),
        "p95_cpu_ms_256_nodes": round(_p95(pick("highs", "cpu_ms", None, 256)), 1),
        "p95_ms_16x10_cbc": round(_p95(pick("cbc", "ms", 10, 16)), 1),
        "p95_ms_256_nodes_cbc": round(_p95(pick("cbc", "ms", None, 256)), 1),
        "median_reported_gap": statistics.median(pick("highs", "gap")),
        "max_reported_gap": max(pick("highs", "gap")),
        "cbc_vs_highs_median_T_ratio": round(statistics.median(r["cbc_T"] / r["highs_T"] for r in timings), 4),
        "p95_ms_16x10_fast": round(_p95(pick("fast", "ms", 10, 16)), 1),
        "p95_cpu_ms_16x10_fast": round(_p95(pick("fast", "cpu_ms", 10, 16)), 1),
        "fast_vs_default_min_T_ratio": round(min(r["fast_T"] / r["highs_T"] for r in timings), 4),
        "fast_vs_default_median_T_ratio": round(statistics.median(r["fast_T"] / r["highs_T"] for r in timings), 4),
        "time_limit_hits": sum(r[f"{s}_status"] != "optimal" for r in timings for s in ("highs", "cbc", "fast")),
        "solves": len(timings) * 3,
    }
    return BenchResult(
        name="placement",
        summary=summary,
        targets={"p95_ms_16x10": Target("<=", 200.0), "p95_ms_256_nodes": Target("<=", 1000.0), "max_gap_small": Target("<=", 0.0)},
        raw={"cells": cells, "timings": timings, "small": small, "seeds": seeds},
        figure=_figure(cells, op_counts, node_counts),
        notes=(f"End-to-end solve_placement times (build + LP bound + greedy start + whole-replica bound + MILP + node "
               f"packing + plan) with "
               f"time_limit_s={TIME_LIMIT_S} and GAP_REL={GAP_REL}; HiGHS (default, in-process) and CBC (subprocess) side by "
               "side on the same seeded instances; p95 over seeds; headline keys are HiGHS wall-clock (cpu_ms adds "
               "process + solver-subprocess CPU time, which excludes waiting for the shared cores). reported gap: "
               "solver bound vs plan. max_gap_small: MILP vs brute force over every replica count."),
    )


def _figure(cells: dict, op_counts: tuple[int, ...], node_counts: tuple[int, ...]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax_cpu) = plt.subplots(1, 2, figsize=(13, 4.8))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, n_ops in enumerate(op_counts):
        for solver, style, label in (("highs", "-o", "HiGHS"), ("cbc", "--s", "CBC"), ("fast", ":^", "HiGHS 0.15 s")):
            ax.plot(node_counts, [cells[f"{n_ops}x{n}"][solver]["p95_ms"] for n in node_counts], style, color=colours[i],
                    label=f"{n_ops} ops, {label}")
            ax_cpu.plot(node_counts, [cells[f"{n_ops}x{n}"][solver]["p95_cpu_ms"] for n in node_counts], style, color=colours[i],
                        label=f"{n_ops} ops, {label}")
    for axis, what in ((ax, "wall clock (includes waiting for the shared cores)"), (ax_cpu, "CPU time (process + solver subprocess)")):
        axis.axhline(200, color="tab:red", lw=1, ls=":")
        axis.text(node_counts[0], 210, "target p95 <= 200 ms (16 nodes x 10 ops)", color="tab:red", fontsize=8)
        axis.axhline(1000, color="tab:purple", lw=1, ls=":")
        axis.text(node_counts[0], 1050, "target <= 1 s (256 nodes)", color="tab:purple", fontsize=8)
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xlabel("nodes (mixed CPU / 16 GiB GPU / 80 GiB GPU nodes)")
        axis.set_ylabel("end-to-end solve time, p95 (ms)")
        axis.set_title(f"Placement solve time: {what}", fontsize=9)
        axis.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return fig
