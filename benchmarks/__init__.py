"""The benchmarks of trident-flows, by name. Each entry names a module with
``run(quick: bool) -> BenchResult``; ``benchmarks.report.write_report`` writes
``DIR/NAME.json`` and ``DIR/NAME.png``.

A package of the repository, not of the installed ``trident_flows`` (the wheel leaves it out): it
is imported from a checkout, by ``trident-flows bench NAME`` and the tests. It may import any
part of ``trident_flows``; nothing in ``trident_flows`` imports it but the CLI's ``bench``
command, lazily. ``BENCHMARKS`` stays a literal dict: ``trident-flows bench --help`` reads its
names from this file without importing the package."""

BENCHMARKS: dict[str, str] = {
    "overhead": "benchmarks.overhead",
    "observe": "benchmarks.observe",
    "observe-live": "benchmarks.observe_live",
    "optimize": "benchmarks.optimize",
    "placement": "benchmarks.placement",
    "closed-loop": "benchmarks.closed_loop",
    "closed-loop-video": "benchmarks.closed_loop_video",
    "headroom": "benchmarks.headroom",
    "corpus-headroom": "benchmarks.corpus_headroom",
    "corpus-trident": "benchmarks.corpus_trident",
    "closed-loop-suite": "benchmarks.closed_loop_suite",
    "faults": "benchmarks.faults",
    "ray-data-import": "benchmarks.ray_data_import",
    "sim-fidelity": "benchmarks.sim_fidelity",
    "closed-loop-sim": "benchmarks.closed_loop_sim",
    "plan-fidelity": "benchmarks.plan_fidelity",
    "dataplane": "benchmarks.dataplane",
    "rollout-latency": "benchmarks.rollout_latency",
    "warm-start": "benchmarks.warm_start",
    "no-headroom-ceiling": "benchmarks.no_headroom_ceiling",
    "manifest": "benchmarks.manifest",
    "elastic": "benchmarks.elastic",
}
