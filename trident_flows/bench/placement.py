"""Benchmark "placement": MILP solve time vs cluster size and operator count, and the
optimality gap against exhaustive search (issue 6).

Contract: ``run(quick) -> BenchResult``. Seeded random instances: pipelines of 5/10/20
operators (CPU-only operators, and accelerator operators with CPU and whole/fractional
GPU options of different device memory, diminishing-returns curves, host<->device
traffic) on 1/8/16/64/256 nodes of three kinds (CPU-only nodes, nodes with 16 GiB GPUs,
nodes with 80 GiB GPUs). Every instance is solved with CBC (the default) and with HiGHS
side by side; times are end-to-end ``solve_placement`` calls (model build, solver,
node packing, plan). Small instances (2-3 operators, 1-3 nodes) are also solved by brute
force over every replica count of every (option, node class); the gap is
``(T_bruteforce - T_milp) / T_bruteforce``. Summary keys: ``p95_ms_16x10`` (CBC, 16 nodes
x 10 operators), ``p95_ms_256_nodes`` (CBC, 256 nodes, all operator counts),
``max_gap_small``.
"""

from __future__ import annotations

import itertools
import random
import statistics
import time

from trident_flows.bench.report import BenchResult, Target
from trident_flows.scheduler.placement import solve_placement
from trident_flows.scheduler.placement_eval import ineligibility, pack_cluster, throughput_of, usage_vector
from trident_flows.scheduler.placement_types import GiB, OperatorDemand, PlacementOption
from trident_flows.scheduler.types import ClusterSpec, NodeClass, OpConfig

NODE_COUNTS = (1, 8, 16, 64, 256)
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


def brute_force(demands: list[OperatorDemand], cluster: ClusterSpec, max_per_key: int) -> float:
    """The best throughput over every replica count 0..max_per_key of every eligible
    (operator, option, node class), keeping only placements that pack node by node."""
    keys = [(d.name, k, nc.name) for d in demands for k, opt in enumerate(d.options) for nc in cluster.node_classes
            if ineligibility(d, opt, nc) is None]
    by_name = {d.name: d for d in demands}
    best = 0.0
    for combo in itertools.product(range(max_per_key + 1), repeat=len(keys)):
        counts = {key: n for key, n in zip(keys, combo) if n}
        per_op = {d.name: 0 for d in demands}
        for (op, _, _), n in counts.items():
            per_op[op] += n
        if any(per_op[d.name] < d.min_replicas for d in demands):
            continue
        use: dict[str, list[float]] = {}
        for (op, k, c), n in counts.items():
            vec = usage_vector(by_name[op].options[k], cluster.node_class(c))
            u = use.setdefault(c, [0.0, 0.0, 0.0])
            for i in range(3):
                u[i] += vec[i] * n
        if any(u[0] > nc.cpus * nc.count + 1e-9 or u[1] > nc.gpus * nc.count + 1e-9 for c, u in use.items() for nc in [cluster.node_class(c)]):
            continue
        upper = min(sum(by_name[op].options[k].rate_at(n) for (op, k, _), n in counts.items() if op == d.name) / d.work_per_item
                    for d in demands)
        if upper <= best or pack_cluster(demands, cluster, counts):
            continue
        best = max(best, throughput_of(demands, cluster, counts))
    return best


def _small_instance(seed: int) -> tuple[list[OperatorDemand], ClusterSpec, int]:
    rng = random.Random(1000 + seed)
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
    keys = sum(1 for d in demands for o in d.options for nc in classes if ineligibility(d, o, nc) is None)
    return demands, ClusterSpec(classes), 4 if keys <= 5 else 3


def _time_solve(demands: list[OperatorDemand], cluster: ClusterSpec, solver: str) -> tuple[float, float, str]:
    t0 = time.perf_counter()
    res = solve_placement(demands, cluster, solver=solver, time_limit_s=5.0)
    return (time.perf_counter() - t0) * 1e3, res.throughput, res.status


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(0.95 * (len(ordered) - 1))))]


def run(quick: bool) -> BenchResult:
    seeds = 4 if quick else 12
    node_counts = (1, 16, 256) if quick else NODE_COUNTS
    op_counts = (5, 10) if quick else OP_COUNTS
    timings: list[dict] = []
    for solver in ("cbc", "highs"):
        _time_solve(make_demands(3, 0), make_cluster(8), solver)  # warm imports and the solver binary
    for n_ops in op_counts:
        for nodes in node_counts:
            cluster = make_cluster(nodes)
            for seed in range(seeds):
                demands = make_demands(n_ops, seed)
                row = {"ops": n_ops, "nodes": nodes, "seed": seed}
                for solver in ("cbc", "highs"):  # side by side on the same instance
                    ms, t, status = _time_solve(demands, cluster, solver)
                    row[f"{solver}_ms"], row[f"{solver}_T"], row[f"{solver}_status"] = ms, t, status
                timings.append(row)
    small = []
    for seed in range(6 if quick else 20):
        demands, cluster, max_per_key = _small_instance(seed)
        milp = solve_placement(demands, cluster).throughput
        best = brute_force(demands, cluster, max_per_key)
        gap = max(0.0, (best - milp) / best) if best > 0 else 0.0
        small.append({"seed": seed, "milp_T": milp, "bruteforce_T": best, "gap": gap})
    cells = {}
    for n_ops in op_counts:
        for nodes in node_counts:
            rows = [r for r in timings if r["ops"] == n_ops and r["nodes"] == nodes]
            cells[f"{n_ops}x{nodes}"] = {s: {"median_ms": statistics.median(r[f"{s}_ms"] for r in rows), "p95_ms": _p95([r[f"{s}_ms"] for r in rows])}
                                        for s in ("cbc", "highs")}
    p95_16x10 = _p95([r["cbc_ms"] for r in timings if r["ops"] == 10 and r["nodes"] == 16])
    p95_256 = _p95([r["cbc_ms"] for r in timings if r["nodes"] == 256])
    summary = {
        "p95_ms_16x10": round(p95_16x10, 1),
        "p95_ms_256_nodes": round(p95_256, 1),
        "max_gap_small": max(s["gap"] for s in small),
        "median_ms_16x10": round(statistics.median(r["cbc_ms"] for r in timings if r["ops"] == 10 and r["nodes"] == 16), 1),
        "p95_ms_16x10_highs": round(_p95([r["highs_ms"] for r in timings if r["ops"] == 10 and r["nodes"] == 16]), 1),
        "p95_ms_256_nodes_highs": round(_p95([r["highs_ms"] for r in timings if r["nodes"] == 256]), 1),
        "time_limit_hits": sum(r[f"{s}_status"] != "optimal" for r in timings for s in ("cbc", "highs")),
        "solves": len(timings) * 2,
    }
    return BenchResult(
        name="placement",
        summary=summary,
        targets={"p95_ms_16x10": Target("<=", 200.0), "p95_ms_256_nodes": Target("<=", 1000.0), "max_gap_small": Target("<=", 0.0)},
        raw={"cells": cells, "timings": timings, "small": small, "seeds": seeds},
        figure=_figure(cells, op_counts, node_counts),
        notes=("End-to-end solve_placement times (build + solver + node packing + plan), CBC default and HiGHS side by side "
               "on the same seeded instances; p95 over seeds. max_gap_small: MILP vs brute force over replica counts."),
    )


def _figure(cells: dict, op_counts: tuple[int, ...], node_counts: tuple[int, ...]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, n_ops in enumerate(op_counts):
        for solver, style in (("cbc", "-o"), ("highs", "--s")):
            ax.plot(node_counts, [cells[f"{n_ops}x{n}"][solver]["p95_ms"] for n in node_counts], style, color=colours[i],
                    label=f"{n_ops} operators, {solver.upper()} (p95)")
    ax.axhline(200, color="tab:red", lw=1, ls=":")
    ax.text(node_counts[0], 210, "target p95 <= 200 ms (16 nodes x 10 ops)", color="tab:red", fontsize=8)
    ax.axhline(1000, color="tab:purple", lw=1, ls=":")
    ax.text(node_counts[0], 1050, "target <= 1 s (256 nodes)", color="tab:purple", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("nodes (mixed CPU / 16 GiB GPU / 80 GiB GPU nodes)")
    ax.set_ylabel("solve time, p95 (ms)")
    ax.set_title("Placement MILP solve time vs cluster size")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(True, which="both", alpha=0.3)
    return fig
