"""What each benchmark asks, which code its figures measure, what its systems are and which of its
figures are headlines: the one source ``trident-flows bench report`` writes ``docs/benchmarks.md`` from.

Contract:
- ``CATALOGUE[name]`` is a ``Benchmark`` for every name in ``bench.BENCHMARKS``:
  - ``question``: what the benchmark answers, one sentence;
  - ``code``: git pathspecs, relative to the repository root, of the code whose behaviour its figures
    measure (its module, the bench helpers it runs and the packages under test; not ``report.py``
    or ``provenance.py``, which only write the result). A result is stale when a later commit
    changed any of them;
  - ``systems``: the systems or baselines it compares, each defined in one sentence (empty where
    it compares none); the closed-loop suite's are ``baselines.DEFINITIONS``;
  - ``headline``: the summary figures the README may quote (the last key of a nested figure, e.g.
    ``headroom`` for ``cpu-only.headroom``): kept small.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from benchmarks.baselines import DEFINITIONS as SUITE_DEFINITIONS
from benchmarks.suite_sim import DEFINITIONS as SUITE_SIM_DEFINITIONS


@dataclass(frozen=True)
class Benchmark:
    question: str
    code: tuple[str, ...]
    systems: Mapping[str, str] = field(default_factory=dict)
    headline: tuple[str, ...] = ()


_PKG = "trident_flows"
_B = "benchmarks"
# the live stack a pipeline runs on under a policy, ticked by loop/ (the runtime's modules import planning's advice and ray_data;
# control's run imports corpus and the scale step, which reads the planner, which checks its clusters in the simulator)
_LIVE = tuple(f"{_PKG}/{p}" for p in ("scheduler", "runtime", "control", "loop", "core", "pipelines", "planning", "sim", "ray_data",
                                      "corpus"))
# the closed-loop runs (live and simulated) and the bench helpers they share
_LOOP = (f"{_B}/closed_loop_runs.py", f"{_B}/closed_loop_stats.py", f"{_B}/closed_loop_workload.py", f"{_B}/closed_loop_figure.py",
         f"{_B}/allocation.py", f"{_B}/oracle_policy.py", f"{_B}/xenna_adapter.py", f"{_B}/lineage.py", f"{_B}/local_ray.py",
         f"{_B}/headroom.py", f"{_B}/sim_headroom.py", f"{_B}/corpus_workloads.py", f"{_PKG}/sim", *_LIVE)
_SUITE = (f"{_B}/closed_loop_suite.py", f"{_B}/suite_workloads.py", f"{_B}/suite_sim.py", f"{_B}/baselines.py", *_LOOP)
_FIDELITY = (f"{_B}/sim_fidelity.py", f"{_B}/fidelity_traces.py", f"{_B}/replay_policy.py", f"{_B}/live_trace.py", f"{_B}/record_traces.py", f"{_B}/traces",
             "bench-results/closed-loop.json", "bench-results/closed-loop-video.json", "bench-results/sim-fidelity-live", *_SUITE)

CLOSED_LOOP_SYSTEMS: dict[str, str] = {
    "static-avg": "the cost model's best static configuration for the mean item of a random 10% sample of the stream",
    "static-large": "static-avg's replicas with the GPU operators at the largest batch that fits the device (the hand-tuned "
                    "\"max batch size\")",
    "oracle": "knows the regime schedule and switches each operator to its regime's best static configuration when the block "
              "reaches it, paying real cold starts",
    "ds2": "DS2's rate-based parallelism run as a policy of this runtime, starting from static-avg",
    "threshold": "Ray Data's utilisation-threshold autoscaling rule run as a policy of this runtime, starting from static-avg",
    "trident": "this project's closed-loop policy in the runtime's control loop, starting from static-avg",
    "ray-data": "plain Ray Data, map_batches with ActorPoolStrategy(min 1, max, initial = static-avg's replicas)",
    "xenna": "cosmos-xenna streaming with its own autoscaler",
}

CATALOGUE: dict[str, Benchmark] = {
    "overhead": Benchmark(
        "Does this runtime run a static pipeline as fast as plain Ray Data on the same operators, configuration and items?",
        (f"{_B}/overhead.py", *_LIVE)),
    "observe": Benchmark(
        "How accurate and how cheap is the observation layer (throughput model, regime detection, regime memory) on "
        "simulated samples whose truth is known?",
        (f"{_B}/observe.py", f"{_B}/sample_sim.py", f"{_PKG}/scheduler", f"{_PKG}/core", f"{_PKG}/runtime/costmodel.py")),
    "observe-live": Benchmark(
        "How accurate is the observation layer on the committed live traces, where trident makes its decisions?",
        (f"{_B}/observe_live.py", f"{_B}/live_trace.py", f"{_B}/traces", f"{_PKG}/scheduler", f"{_PKG}/core",
         f"{_PKG}/runtime/costmodel.py")),
    "optimize": Benchmark(
        "Does trident's OOM-safe Bayesian optimiser find a near-best configuration in fewer evaluations and with fewer "
        "out-of-memory trials than unconstrained skopt and random search?",
        (f"{_B}/optimize.py", f"{_PKG}/scheduler", f"{_PKG}/core"),
        systems={"trident": "scheduler.optimize.ConfigOptimizer (memory GP, safe expansion, OOM regions)",
                 "skopt_unconstrained": "the same skopt GP/EI optimiser without a constraint model, an OOM scored worse than "
                                        "anything seen",
                 "random": "uniform random configurations (batch size log-uniform)"}),
    "placement": Benchmark(
        "How long does the placement MILP take as clusters and pipelines grow, and how far is it from the exhaustive optimum "
        "on small instances?",
        (f"{_B}/placement.py", f"{_PKG}/scheduler/placement", f"{_PKG}/core")),
    "closed-loop": Benchmark(
        "On the emulated document pipeline fed changing regimes, how does trident's throughput compare with static, oracle, "
        "DS2, threshold, plain Ray Data and cosmos-xenna?",
        (f"{_B}/closed_loop.py", *_LOOP), systems=CLOSED_LOOP_SYSTEMS),
    "closed-loop-video": Benchmark(
        "On the emulated video pipeline fed changing regimes, how does trident's throughput compare with static, oracle, DS2, "
        "threshold, plain Ray Data and cosmos-xenna?",
        (f"{_B}/closed_loop_video.py", f"{_B}/closed_loop.py", *_LOOP), systems=CLOSED_LOOP_SYSTEMS),
    "headroom": Benchmark(
        "How much could any scheduler gain on each workload: the per-regime optimum over the best single static "
        "configuration, by the cost models?",
        (f"{_B}/headroom.py", f"{_B}/corpus_workloads.py", f"{_B}/closed_loop_workload.py", f"{_PKG}/sim/static_search.py", f"{_PKG}/runtime/costmodel.py",
         f"{_PKG}/runtime/devices.py", f"{_PKG}/runtime/spec.py", f"{_PKG}/pipelines/emulated.py", f"{_PKG}/pipelines/corpus_model.py",
         f"{_PKG}/pipelines/corpus_documents.py", f"{_PKG}/pipelines/corpus_video.py", f"{_PKG}/pipelines/profiles", f"{_PKG}/core")),
    "corpus-headroom": Benchmark(
        "On document and video workloads drawn from published corpus statistics, how much could any scheduler gain over the "
        "best single static allocation, by the cost model and in the simulator, on 1 and 8 nodes?",
        (f"{_B}/corpus_headroom.py", f"{_B}/corpus_workloads.py", f"{_B}/headroom.py", f"{_B}/sim_headroom.py",
         f"{_B}/allocation.py", f"{_B}/closed_loop_workload.py", f"{_PKG}/sim", f"{_PKG}/pipelines", f"{_PKG}/runtime",
         f"{_PKG}/core"),
        headline=("headroom_sim_1n", "headroom_sim_8n")),
    "corpus-trident": Benchmark(
        "On document and video workloads drawn from published corpus statistics, on 8 nodes over streams of about 2 simulated hours, how close "
        "does trident get to the per-regime oracle where there is headroom, does it cost anything against the best static "
        "allocation in hindsight where there is none, and do the simulator's rates hold live on one node within 10%?",
        (f"{_B}/corpus_trident.py", f"{_B}/corpus_live.py", f"{_B}/corpus_headroom.py", f"{_B}/replay_policy.py", *_SUITE),
        systems={"static-default": "the pipeline's own default sizing for one node, on every node",
                 "static-hindsight": SUITE_SIM_DEFINITIONS["static-hindsight"], "trident": SUITE_SIM_DEFINITIONS["trident"],
                 "oracle": SUITE_SIM_DEFINITIONS["oracle"]},
        headline=("headroom", "t_over_oracle", "gain_captured", "trident_vs_static_hindsight")),
    "closed-loop-suite": Benchmark(
        "On the regression workloads (hand-picked regimes, kept as regression checks beside the corpus workloads of "
        "corpus-trident), where adaptive scheduling can pay and on two where it cannot, how does trident's throughput compare "
        "with the baselines a user would have, and how much of the available headroom does it capture?",
        _SUITE,
        systems={**SUITE_DEFINITIONS, **SUITE_SIM_DEFINITIONS},
        headline=("headroom", "t_over_oracle", "gain_captured", "trident_vs_static_hindsight", "trident_vs_static_default",
                  "trident_vs_ray_data_autoscaling")),
    "warm-start": Benchmark(
        "Starting with the memory of an earlier run of the same pipeline, how much closer does trident get to the per-regime "
        "optimum than starting cold, how fast does it move to a new regime's configuration, and how much faster than the best "
        "static allocation in hindsight does it run live, cold and warm?",
        (f"{_B}/warm_start.py", f"{_B}/warm_start_live.py", *_SUITE),
        systems={"trident cold": "trident starting with no memory of earlier runs",
                 "trident warm": "trident starting from the memory an earlier run over the same regimes in another order wrote",
                 "static-hindsight": SUITE_SIM_DEFINITIONS["static-hindsight"], "oracle": SUITE_SIM_DEFINITIONS["oracle"]},
        headline=("sim_cold_t_over_oracle", "sim_warm_t_over_oracle", "reaction_s_median_cold", "reaction_s_median_warm")),
    "no-headroom-ceiling": Benchmark(
        "On the short streams without headroom, how close to the best static allocation in hindsight can any policy get "
        "that starts in static-default, as trident does, and acts no earlier than its first tick?",
        (f"{_B}/no_headroom_ceiling.py", f"{_B}/warm_start.py", f"{_B}/warm_start_live.py", *_SUITE),
        systems={"static-default": SUITE_SIM_DEFINITIONS["static-default"], "static-hindsight": SUITE_SIM_DEFINITIONS["static-hindsight"], "oracle": SUITE_SIM_DEFINITIONS["oracle"]},
        headline=("ceiling_work_bound",)),
    "faults": Benchmark(
        "When replicas, the runner or inputs fail while trident runs a pipeline, are items lost or duplicated, and how long "
        "does recovery take?",
        (f"{_B}/faults.py", f"{_B}/faults_inputs.py", f"{_B}/lineage.py", *_LIVE)),
    "ray-data-import": Benchmark(
        "Does a user's plain Ray Data pipeline run under trident as fast as the same pipeline written as this project's "
        "spec, with the same rows kept?",
        (f"{_B}/ray_data_import.py", "examples/ray_data_emulated.py", *_LIVE)),
    "sim-fidelity": Benchmark(
        "Do the simulator's throughput, busy fractions and reconfigurations match the emulated Ray runtime's on the same "
        "workloads and policies, so that simulated figures can be trusted?",
        _FIDELITY),
    "closed-loop-sim": Benchmark(
        "As the cluster grows from 1 to 256 simulated nodes, how long does trident's tick take, and does it keep every item "
        "and stay within memory while running at least as fast as the pipeline's own static sizing?",
        (f"{_B}/closed_loop_sim.py", f"{_B}/wide_pipeline.py", f"{_B}/sim_headroom.py", f"{_B}/headroom.py",
         f"{_B}/allocation.py", f"{_B}/closed_loop_workload.py", f"{_B}/corpus_workloads.py", *_LIVE),
        systems={"static-default": "the pipeline's own default sizing for one node (emulated layout: one replica per operator, GPU "
                                   "operators on the GPUs, the spare CPUs shared by its default regime mix) on every node: what a user "
                                   "who writes the pipeline runs",
                 "trident": "this project's policy from the registry, unchanged, starting from static-default, ticking every 10 "
                            "simulated seconds with each tick's CPU time charged to the simulated clock"},
        headline=("tick_ms_p95_256_nodes", "worst_trident_vs_static_default", "trident_ooms", "items_lost")),
    "plan-fidelity": Benchmark(
        "Does the capacity planner's predicted throughput match what the simulator and the emulated Ray runtime measure for "
        "the same placement?",
        (f"{_B}/plan_fidelity.py", *_FIDELITY)),
    "dataplane": Benchmark(
        "What does moving large intermediates between operators cost this runtime's runner, against plain Ray Data?",
        (f"{_B}/dataplane.py", f"{_B}/overhead.py", f"{_B}/local_ray.py", *_LIVE)),
    "manifest": Benchmark(
        "How long, and how much memory, does a corpus run take to list a 100,000-file input and diff it against its manifest?",
        (f"{_B}/manifest.py", f"{_PKG}/corpus/location.py", f"{_PKG}/corpus/manifest.py", f"{_PKG}/corpus/sidecar.py"),
        headline=("total_s", "peak_rss_mb")),
    "rollout-latency": Benchmark(
        "With a source offering items at a fixed rate below capacity in a stable regime, does an item's end-to-end latency "
        "(offered at the source to committed at the sink) stay as low while the runtime's rolling updates start and retire "
        "replicas as in steady state?",
        (f"{_B}/rollout_latency.py", f"{_B}/suite_workloads.py", f"{_B}/closed_loop_workload.py", f"{_B}/baselines.py",
         f"{_PKG}/sim/static_search.py", f"{_B}/headroom.py", f"{_B}/corpus_workloads.py", f"{_B}/lineage.py", f"{_B}/local_ray.py", *_LIVE),
        headline=("rollouts", "latency_s_p99_steady", "latency_s_p99_during_rollout", "p99_during_rollout_over_steady", "items_lost")),
    "elastic": Benchmark(
        "When the head alone would miss a run's deadline, does trident ask Ray's autoscaler for the nodes the deadline needs, at "
        "about the cost the capacity planner gives for it, give them back at the end, and ask for none when the head suffices?",
        (f"{_B}/elastic.py", f"{_B}/node_timeline.py", f"{_B}/autoscaling_cluster.py", f"{_PKG}/sim", *_LIVE),
        systems={"planner": "the capacity planner's cheapest cluster of the head and worker nodes finishing the same items within "
                            "the deadline by the cost model, start-up included (its job cost is the baseline of cost_vs_planner)",
                 "head alone": "the second run, whose deadline the head alone meets: no node should be requested"},
        headline=("deadline_met", "cost_vs_planner", "idle_node_s_after_end", "nodes_requested_when_head_suffices")),
}
