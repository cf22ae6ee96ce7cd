"""Benchmarks by name (DESIGN.md section 8). Each entry names a module with
``run(quick: bool) -> BenchResult``; ``trident_flows.bench.report.write_report`` writes
``DIR/NAME.json`` and ``DIR/NAME.png``."""

BENCHMARKS: dict[str, str] = {
    "overhead": "trident_flows.bench.overhead",
    "observe": "trident_flows.bench.observe",
    "optimize": "trident_flows.bench.optimize",
    "placement": "trident_flows.bench.placement",
    "closed-loop": "trident_flows.bench.closed_loop",
    "closed-loop-video": "trident_flows.bench.closed_loop_video",
    "sim-fidelity": "trident_flows.bench.sim_fidelity",
    "closed-loop-sim": "trident_flows.bench.closed_loop_sim",
}
