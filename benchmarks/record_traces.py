"""Record the live traces that ``bench observe-live`` replays (``benchmarks/traces/*.jsonl.gz``).

Contract: ``python -m benchmarks.record_traces [--only NAME ...] [--out DIR]`` runs each named trace, one
after the other, through the runtime's own ``launch.run_pipeline`` (runner actor + control loop every
``TICK_S``), the policy wrapped in ``live_trace.RecordingPolicy`` and the runner polled by
``live_trace.RunnerPoller``:
- ``docs-{static,ds2,trident}`` and ``video-{static,ds2,trident}`` (the default): the closed-loop
  benchmarks' emulated streams (``record_emulated``); with ``--only`` also ``{docs,video}-{threshold,oracle}``,
  references for ``bench sim-fidelity``;
- ``cpu-only-trident``: the ``closed-loop-suite``'s cpu-only workload under trident (``record_suite``);
- ``real-docs-trident``: the real document pipeline on a generated PDF corpus (``record_real_documents``).
A run that lost or duplicated an item, or failed, is refused, not written. Recording is CPU-heavy: the
traces are committed, and the benchmark only replays them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import ray

from benchmarks import suite_workloads
from benchmarks.closed_loop_runs import TICK_S, make_system_policy
from benchmarks.closed_loop_workload import CPUS, DEVICE_MEMORY, GPUS, PIPELINES, tune, workloads
from benchmarks.live_trace import TRACE_DIR, RecordingPolicy, RunnerPoller, TraceWriter, profile_digest
from trident_flows.control.launch import find_runner, run_pipeline
from trident_flows.core.state import RunnerSettings
from trident_flows.core.types import ClusterSpec
from trident_flows.runtime.costmodel import PipelineProfile
from trident_flows.scheduler.policies import make_policy

EMULATED = {f"{p}-{policy}": (p, policy) for p in ("docs", "video") for policy in ("static", "ds2", "trident", "threshold", "oracle")}
# what a plain run records (the traces bench observe-live replays); the threshold and oracle traces are
# references for bench sim-fidelity, recorded with --only into its own directory
DEFAULT = tuple(sorted(n for n, (_, policy) in EMULATED.items() if policy in ("static", "ds2", "trident")))
SUITE = {"cpu-only-trident": ("cpu-only", "trident")}
REAL = "real-docs-trident"
NAMESPACE = "trident-traces"
REAL_REGIMES, REAL_ITEMS, REAL_CPUS = "short:160,long:40,scans:100", 300, 8


def _record(name: str, spec: Any, policy: Any, header: dict[str, Any], out: Path, settings: RunnerSettings) -> None:
    work = Path(tempfile.mkdtemp(prefix=f"trace-{name}-"))
    # the machine's load shapes what a live run measures (emulated work sleeps; wake-ups come late under load)
    # host_cpus: the cores the logical node's actors ran on (the simulator starts its actors on as many)
    # profile_sha256: the costs an emulated run's operators slept by (a trace of other costs is no reference for today's)
    profile = {"profile_sha256": profile_digest(str(header["pipeline"]))} if header["emulated"] else {}
    writer = TraceWriter(out / f"{name}.jsonl.gz", {**header, **profile, "load_average_start": os.getloadavg(), "host_cpus": os.cpu_count()})
    runner = f"trace-{name}"
    poller: list[RunnerPoller] = []

    def progress(state: Any) -> None:
        if not poller:
            poller.append(RunnerPoller(find_runner(runner, NAMESPACE), writer, TICK_S))
        poller[0](state)

    try:
        summary = run_pipeline(spec, work / "out", settings=settings, policy=RecordingPolicy(policy, writer), tick_s=TICK_S,
                               overwrite=True, progress=progress, name=runner, namespace=NAMESPACE, poll_s=0.25)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if summary.items_missing or summary.duplicate_ids or summary.error:
        raise RuntimeError(f"trace {name}: the run lost {summary.items_missing} items, duplicated {summary.duplicate_ids}, "
                           f"error {summary.error!r}; not a trace to keep")
    writer.end({**summary.to_dict(), "load_average_end": os.getloadavg()})
    print(f"{name}: {summary.items_in} items in {summary.wall_s:.1f} s, {summary.reconfigurations} reconfigurations -> {writer.path}")


def record_emulated(name: str, out: Path) -> None:
    """``name`` (a key of ``EMULATED``): the emulated document (``docs-*``: short:600, long:60, scans:40, short:600) or
    video (``video-*``: small:150, hd:150, long:30, small:150) pipeline on the closed-loop benchmark's full schedule
    (16 CPUs + 2 emulated GPUs, time scale 1), starting from the benchmark's static-avg configuration, under the named
    policy (the oracle: the closed-loop benchmark's ``OraclePolicy``). The threshold and oracle traces are references
    for ``bench sim-fidelity``: record them with ``--out bench-results/sim-fidelity-live/traces`` (``bench
    observe-live`` replays every trace of ``benchmarks/traces``)."""
    pipeline, policy_name = EMULATED[name]
    bench = PIPELINES["documents" if pipeline == "docs" else "video"]
    profile = PipelineProfile.load(bench.profile)
    workload, _ = workloads(False, bench)
    tuning = tune(profile, workload)
    spec = workload.spec(profile, tuning.static_avg, f"trace-{name}")
    cluster = ClusterSpec.single_node(CPUS, GPUS, gpu_memory_bytes=DEVICE_MEMORY)
    if policy_name == "oracle":  # knows the schedule: the closed-loop benchmark's labelled upper reference
        policy = make_system_policy("oracle", spec, tuning, workload)
    else:
        policy = make_policy(policy_name, spec=spec, cluster=cluster)
    header = {"pipeline": bench.profile, "emulated": True, "policy": policy_name, "cluster": {"cpus": CPUS, "gpus": GPUS},
              "blocks": workload.blocks(), "regimes": workload.regimes, "time_scale": workload.time_scale, "tick_s": TICK_S,
              "start_config": tuning.static_avg.label()}
    _record(name, spec, policy, header, out, RunnerSettings(device_memory_bytes=DEVICE_MEMORY))


def record_suite(name: str, suite: suite_workloads.SuiteWorkload, out: Path) -> None:
    """``name`` (a key of ``SUITE``) on its suite workload ``suite``, starting where the suite starts its policy.
    ``cpu-only-trident``: documents on 16 CPUs and no GPU, four regime blocks, from static-default, under trident: the
    workload where trident makes its moves (a few rolling updates), so the plans it applied can be scored."""
    workload_name, policy_name = SUITE[name]
    profile = PipelineProfile.load(suite.profile)
    stream, _ = suite.streams()
    start = suite.baselines(profile, stream, stream.rows(profile)).start(policy_name)
    spec = stream.spec(profile, start, f"trace-{name}")
    cluster = ClusterSpec.single_node(CPUS, suite.gpus, gpu_memory_bytes=DEVICE_MEMORY)
    header = {"pipeline": suite.profile, "emulated": True, "policy": policy_name, "suite_workload": workload_name,
              "cluster": {"cpus": CPUS, "gpus": suite.gpus}, "blocks": stream.blocks(), "regimes": stream.regimes,
              "time_scale": stream.time_scale, "tick_s": TICK_S, "start_config": start.label()}
    _record(name, spec, make_policy(policy_name, spec=spec, cluster=cluster), header, out,
            RunnerSettings(device_memory_bytes=DEVICE_MEMORY))


def record_real_documents(out: Path, corpus_dir: Path) -> None:
    """``real-docs-trident``: the real document pipeline (pypdfium2, tesseract, ...) on a generated corpus of
    ``REAL_ITEMS`` PDFs (``REAL_REGIMES``) in ``corpus_dir``, on ``REAL_CPUS`` logical CPUs, policy trident (as
    ``make demo``); the header's ``blocks`` are the input's runs of one regime."""
    import pandas as pd

    from trident_flows.pipelines.documents import build, synth_corpus

    corpus = synth_corpus(corpus_dir, REAL_ITEMS, 0, REAL_REGIMES)
    spec = build(input=corpus)
    manifest = pd.read_parquet(corpus / "manifest.parquet")
    regime_of = dict(zip(manifest["id"].astype(str), manifest["regime"].astype(str))) if "regime" in manifest else {}
    order = [regime_of.get(str(r["id"]), "unknown") for r in spec.source()]
    blocks, start = [], 0
    for k in range(1, len(order) + 1):   # runs of one regime in input order
        if k == len(order) or order[k] != order[start]:
            blocks.append((order[start], start, k))
            start = k
    cluster = ClusterSpec.single_node(REAL_CPUS, 0)
    header = {"pipeline": "documents", "emulated": False, "policy": "trident", "cluster": {"cpus": REAL_CPUS, "gpus": 0},
              "blocks": blocks if "unknown" not in order else [], "regimes": REAL_REGIMES, "time_scale": 1.0, "tick_s": TICK_S}
    _record(REAL, spec, make_policy("trident", spec=spec, cluster=cluster), header, out, RunnerSettings())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    known = sorted(EMULATED) + sorted(SUITE) + [REAL]
    parser.add_argument("--only", nargs="*", default=None, help=f"traces to record (default {list(DEFAULT) + [REAL]}): {known}")
    parser.add_argument("--out", type=Path, default=TRACE_DIR)
    parser.add_argument("--corpus-dir", type=Path, default=Path(tempfile.gettempdir()) / "trident-trace-corpus")
    args = parser.parse_args(argv)
    names = args.only or list(DEFAULT) + [REAL]
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"unknown trace(s) {unknown}; choose from {known}")
    emulated = [n for n in names if n in EMULATED]
    if emulated:
        ray.init("local", num_cpus=CPUS, num_gpus=GPUS, include_dashboard=False, log_to_driver=False, configure_logging=False)
        try:
            for name in emulated:
                record_emulated(name, args.out)
        finally:
            ray.shutdown()
    for name in (n for n in names if n in SUITE):   # a node with exactly the workload's GPUs, as the suite runs it
        suite = suite_workloads.suite_workloads(False, (SUITE[name][0],))[0]
        ray.init("local", num_cpus=CPUS, num_gpus=suite.gpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
        try:
            record_suite(name, suite, args.out)
        finally:
            ray.shutdown()
    if REAL in names:
        ray.init("local", num_cpus=REAL_CPUS, num_gpus=0, include_dashboard=False, log_to_driver=False, configure_logging=False)
        try:
            record_real_documents(args.out, args.corpus_dir)
        finally:
            ray.shutdown()


if __name__ == "__main__":
    main()
