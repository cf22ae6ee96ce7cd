"""Benchmarks by name. Each entry names a module with
``run(quick: bool) -> BenchResult``; ``trident_flows.bench.report.write_report`` writes
``DIR/NAME.json`` and ``DIR/NAME.png``."""

BENCHMARKS: dict[str, str] = {
    "overhead": "trident_flows.bench.overhead",
    "observe": "trident_flows.bench.observe",
    "observe-live": "trident_flows.bench.observe_live",
    "optimize": "trident_flows.bench.optimize",
    "placement": "trident_flows.bench.placement",
    "closed-loop": "trident_flows.bench.closed_loop",
    "closed-loop-video": "trident_flows.bench.closed_loop_video",
    "headroom": "trident_flows.bench.headroom",
    "closed-loop-suite": "trident_flows.bench.closed_loop_suite",
    "faults": "trident_flows.bench.faults",
    "ray-data-import": "trident_flows.bench.ray_data_import",
    "sim-fidelity": "trident_flows.bench.sim_fidelity",
    "closed-loop-sim": "trident_flows.bench.closed_loop_sim",
    "plan-fidelity": "trident_flows.bench.plan_fidelity",
    "dataplane": "trident_flows.bench.dataplane",
    "rollout-latency": "trident_flows.bench.rollout_latency",
    "warm-start": "trident_flows.bench.warm_start",
    "manifest": "trident_flows.bench.manifest",
}
