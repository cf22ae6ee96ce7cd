"""Starting and finding runners, running a pipeline to the end, and the ``trident-flows run`` glue.

Contract:
- ``check_pipeline`` refuses, before anything starts, a pipeline whose initial replicas need more
  CPUs/GPUs than the cluster has (``RuntimeConfigError``).
- ``start_runner(...)`` creates and starts the named runner actor; ``find_runner(name, namespace)``
  returns a handle to it from any driver of the same cluster.
- ``RunSession``: the steps of one run on Ray that ``run_pipeline`` and the ``document-curation`` flow
  both take (start, end, stop, account, summary); ``end_policy(...)`` has the policy write its memory.
- ``run_pipeline(spec, out_dir, ...) -> RunSummary`` runs to the end, stops the runner and gives the
  run's summary and ``account`` (``control.account``).
- ``run_command(...)`` is the CLI ``run``; a bad option raises ``RuntimeConfigError`` saying what to change.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence, TypeVar

import numpy as np
import ray

from trident_flows.control.account import PolicyFigures, RunAccount, account_of_run, build_account, policy_figures
from trident_flows.control.account_plot import TIMELINE_PNG, timeline_png
from trident_flows.control.loop import ControlLoop
from trident_flows.control.ooms_avoided import OomsAvoided
from trident_flows.control.run_record import RunRecord
from trident_flows.control.start_estimate import Estimate
from trident_flows.core.output_errors import naming_the_path
from trident_flows.core.state import RunnerSettings, RunnerState, RuntimeConfigError
from trident_flows.core.types import BatchSample, ClusterSpec, OpConfig
from trident_flows.loop.run_summary import OutputCounts, RunSummary, run_summary
from trident_flows.pipelines import finish_pipeline, resume_pipeline
from trident_flows.pipelines.quality import output_note
from trident_flows.runtime import resume as resume_mod
from trident_flows.runtime.latency import Latencies
from trident_flows.runtime.runner import RunnerActor
from trident_flows.runtime.sink import account
from trident_flows.runtime.spec import PipelineSpec
from trident_flows.scheduler.policies import DEFAULT_POLICY, Policy, make_policy

if TYPE_CHECKING:  # the scaler reads the planner, which reads the simulator: only a run with a goal loads them
    from trident_flows.control.elastic import ElasticScaler


# How often ``trident-flows run`` restarts a pipeline runner that died (its process killed, its
# node lost) before giving up; each restart resumes from the committed shards.
RUNNER_RESTARTS = 2
# Attempts at starting the local Ray node: Ray gives its raylet a fixed 30 s, which a machine
# under heavy load (load average 60-140 on 2 cores here) misses now and then.
RAY_START_ATTEMPTS = 3
MEMORY_OFF = "off"  # --memory off: Trident neither reads nor writes a memory across runs
STOP_TIMEOUT_S = 60.0  # how long a runner asked to stop may take before its actor is killed all the same
T = TypeVar("T")


def cluster_totals() -> tuple[float, float]:
    res = ray.cluster_resources()
    return float(res.get("CPU", 0.0)), float(res.get("GPU", 0.0))


def check_pipeline(spec: PipelineSpec, settings: RunnerSettings, cpus: float, gpus: float) -> None:
    """Refuse (``RuntimeConfigError``), before anything starts, a pipeline whose initial replicas need more CPUs/GPUs
    than the cluster's ``cpus``/``gpus``."""
    if not isinstance(settings, RunnerSettings):
        raise RuntimeConfigError(f"settings must be a RunnerSettings, got {type(settings).__name__}")
    need_cpus = need_gpus = 0.0
    for op in spec.operators:
        c = op.config
        if c.gpus > gpus:
            raise RuntimeConfigError(f"operator {op.name!r}: one replica needs gpus={c.gpus:g} but the cluster has {gpus:g} GPUs; "
                                     "use device='cpu' or start Ray with more (logical) GPUs (--gpus)")
        if c.cpus > cpus:
            raise RuntimeConfigError(f"operator {op.name!r}: one replica needs cpus={c.cpus:g} but the cluster has {cpus:g} CPUs")
        need_cpus += c.cpus * op.replicas
        need_gpus += c.gpus * op.replicas
    if need_gpus > gpus + 1e-9:
        per_op = {o.name: o.config.gpus * o.replicas for o in spec.operators if o.config.gpus}
        raise RuntimeConfigError(f"pipeline {spec.name!r} needs {need_gpus:g} GPUs ({per_op}) but the cluster has {gpus:g}; "
                                 "lower the GPU replicas of those operators or start Ray with more (logical) GPUs (--gpus)")
    if need_cpus > cpus + 1e-9:
        per_op = {o.name: o.config.cpus * o.replicas for o in spec.operators}
        raise RuntimeConfigError(f"pipeline {spec.name!r} needs {need_cpus:g} CPUs ({per_op}) but the cluster has {cpus:g}; "
                                 "lower replicas or start Ray with more (logical) CPUs (--cpus)")


def start_runner(spec: PipelineSpec, out_dir: Path | str, *, name: str = "trident-runner", namespace: str = "trident",
                 settings: RunnerSettings | None = None, external_input: bool = False, detached: bool = False) -> Any:
    """Create and start the named runner actor; returns its handle (Ray must be initialised)."""
    if not ray.is_initialized():
        raise RuntimeError("Ray is not initialised: call ray.init(num_cpus=..., num_gpus=...) or ray.init(address=...) first")
    settings = settings or RunnerSettings()
    check_pipeline(spec, settings, *cluster_totals())
    try:
        ray.get_actor(name, namespace=namespace)
    except ValueError:
        pass
    else:
        raise RuntimeConfigError(f"a runner named {name!r} already exists in namespace {namespace!r}; pick another name or stop it")
    # the runner holds the queues and in-flight batches: it runs on the driver's node (the head, as a
    # rule), not on a worker node whose loss would cost every uncommitted shard. Hard affinity: it
    # reserves no resources, so the driver's node can always hold it (with soft affinity Ray placed it
    # on a worker node in a multi-node test run, and that node's loss took the run with it)
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    handle = RunnerActor.options(name=name, namespace=namespace, lifetime="detached" if detached else None,
                                 scheduling_strategy=here).remote(spec, str(out_dir), settings, name, namespace, external_input)
    ray.get(handle.start.remote())
    return handle


def find_runner(name: str = "trident-runner", namespace: str = "trident") -> Any:
    """The handle of a running runner, from any driver connected to the same cluster."""
    try:
        return ray.get_actor(name, namespace=namespace)
    except ValueError as exc:
        raise LookupError(f"no runner named {name!r} in namespace {namespace!r}") from exc


def stop_runner(handle: Any, loop: ControlLoop | None = None, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Stop the control loop (if any), let the runner stop cleanly, then kill its actor."""
    if loop is not None:
        loop.stop()
    try:
        ray.get(handle.stop.remote(), timeout=timeout_s)
    finally:
        ray.kill(handle)


def run_outputs(out: Path) -> list[Path]:
    """The Parquet files a run left in ``out`` (data and dead-letter tables)."""
    return [p for sub in ("data", "dead_letter") for p in (out / sub).glob("*.parquet")] if out.exists() else []


def refuse_used_out(out: Path) -> None:
    """Raise ``RuntimeConfigError`` when ``out`` holds another run's outputs (a run never mixes its rows into another's)."""
    old = run_outputs(out)
    if old:
        raise RuntimeConfigError(f"{out} already holds the outputs of a run ({len(old)} files): choose another output directory "
                                 "(--out), or delete this one")


@dataclass(frozen=True)
class RunEnd:
    """A finished run as its runner tells it, read while the runner is still up: the final state, the items' read
    and done times, the apply reports and the replicas that ran on each node."""

    state: RunnerState
    latencies: Latencies
    apply_reports: tuple[dict[str, Any], ...]
    replicas_by_node: dict[str, dict[str, int]]


def starting_configuration(spec: PipelineSpec) -> list[tuple[str, OpConfig, int]]:
    """Per operator of ``spec``: name, config, replicas (the configuration an account's estimate prices)."""
    return [(op.name, op.config, op.replicas) for op in spec.operators]


def end_policy(policy_name: str, policy: Policy | None, record: RunRecord | None, samples: Sequence[BatchSample], spec: PipelineSpec,
               state: RunnerState) -> PolicyFigures:
    """A policy's end of a finished run, where the policy lives: a policy with ``finish(state)`` writes what it keeps across
    runs (Trident's memory), then what only it can tell goes to the account (``control.account.policy_figures``)."""
    finish = getattr(policy, "finish", None)
    if finish is not None:
        finish(state)
    return policy_figures(policy_name, policy, record, samples, starting_configuration(spec), state)


class RunSession:
    """One run of ``spec`` on Ray into ``out_dir`` under the policy named ``policy_name``: the steps that ``run_pipeline``
    (its loop in a thread) and the ``document-curation`` flow (its loop the sidecar subflow) both take: ``start``,
    ``ended() -> RunEnd``, ``stop(end_loop)`` (the scaler's request cleared, failed or not), ``account`` and ``summary``
    (``loop.run_summary``)."""

    def __init__(self, spec: PipelineSpec, out_dir: Path | str, policy_name: str, *, runner_name: str, namespace: str = "trident",
                 settings: RunnerSettings | None = None, scaler: ElasticScaler | None = None) -> None:
        self.spec = spec
        self.out = Path(out_dir)
        self.policy_name = policy_name
        self.runner_name, self.namespace, self.settings, self.scaler = runner_name, namespace, settings, scaler
        self.handle: Any = None

    def start(self, starting: PipelineSpec | None = None, external_input: bool = False) -> Any:
        """Start the named runner in ``starting`` (default ``spec``) and return its handle; a start that fails releases the scaler."""
        try:
            self.handle = start_runner(starting or self.spec, self.out, name=self.runner_name, namespace=self.namespace,
                                       settings=self.settings, external_input=external_input)
        except BaseException:
            self._release_scaler()
            raise
        return self.handle

    def ended(self) -> RunEnd:
        """The finished run as the runner tells it (its runner still up)."""
        summary = ray.get(self.handle.summary.remote())
        return RunEnd(ray.get(self.handle.state.remote()), ray.get(self.handle.latencies.remote()), tuple(summary["apply_reports"]),
                      dict(summary.get("replicas_by_node", {})))

    def stop(self, end_loop: Callable[[], T]) -> T:
        """End the run: a runner not finished (a failed run) is stopped, so a loop that ticks until the end sees it; the loop
        ends (``end_loop``, whose result is returned); the runner stops and its actor is killed; the scaler's request is
        cleared, failed or not."""
        try:
            self._stop_unfinished()
            return end_loop()
        finally:
            try:
                stop_runner(self.handle)
            finally:
                self._release_scaler()

    def account(self, figures: PolicyFigures | None, end: RunEnd) -> tuple[RunAccount, bytes]:
        """The run's account from what the policy told (None: no loop told anything, the account is the run's alone), its
        timeline drawn into ``OUT/timeline.png``; and the PNG."""
        if figures is None:
            figures = policy_figures(self.policy_name, None, None, [], starting_configuration(self.spec), end.state)
        run_account = account_of_run(figures, end.latencies.read_t, end.latencies.done_t, end.state)
        path = self.out / TIMELINE_PNG
        png = timeline_png(run_account, list(figures.record.points) if figures.record is not None else [], end.latencies.done_t, path)
        return run_account.with_png(str(path)), png

    def summary(self, end: RunEnd, account: RunAccount, policy_figures: Mapping[str, Any] | None, *, decisions_made: int,
                resume: resume_mod.ResumePlan | None = None, outputs: OutputCounts | None = None,
                near_duplicates: int | None = None) -> RunSummary:
        """The run's summary (``loop.run_summary``) from the committed output (``outputs`` when read earlier: a corpus run's
        are published before this), earlier runs' committed shards counted from ``resume``; ``policy_figures``: the keys
        the policy reports of itself (``PolicyFigures.run_figures``)."""
        from trident_flows.planning.advice import advice_dict  # here: planning reads the simulator, which imports this module

        state = end.state
        return run_summary(self.spec.name, self.policy_name, str(self.out), state, outputs or output_counts(self.out),
                           items_in=state.items_in + (resume.items_skipped if resume is not None else 0), items_done=state.items_in,
                           decisions_made=decisions_made, apply_reports=end.apply_reports, policy_figures=policy_figures,
                           latency=end.latencies.percentiles(), output_note=output_note(self.spec),
                           shards_total=resume.shards_total if resume is not None else 0,
                           shards_skipped=resume.shards_skipped if resume is not None else 0, advice=advice_dict(state),
                           replicas_by_node=end.replicas_by_node, account=account,
                           elastic=self.scaler.summary() if self.scaler is not None else None, near_duplicates=near_duplicates)

    def _stop_unfinished(self) -> None:
        try:
            if not ray.get(self.handle.state.remote(), timeout=STOP_TIMEOUT_S).finished:
                ray.get(self.handle.stop.remote(), timeout=STOP_TIMEOUT_S)
        except ray.exceptions.RayError:  # a runner gone, or not answering in time: stop_runner kills it
            pass

    def _release_scaler(self) -> None:
        if self.scaler is not None:
            self.scaler.release()


def output_counts(out: Path) -> OutputCounts:
    """The committed output of ``out`` counted by input item (``runtime.sink.account``)."""
    acc = account(out)
    return OutputCounts(items_written=acc.items_written, items_dead_lettered=acc.items_dead_lettered, items_dropped=acc.items_dropped,
                        rows_written=acc.rows_written, duplicate_ids=acc.duplicate_ids)


def run_pipeline(spec: PipelineSpec, out_dir: Path | str, *, settings: RunnerSettings | None = None, policy: Policy | None = None,
                 progress: Callable[[RunnerState], None] | None = None, tick_s: float = 2.0, decision_log: Path | None = None,
                 name: str | None = None, namespace: str = "trident", overwrite: bool = False, poll_s: float = 0.5,
                 resume: resume_mod.ResumePlan | None = None, scaler: ElasticScaler | None = None) -> RunSummary:
    """Run ``spec`` to the end on the current Ray cluster and return its summary: with the control loop for a
    ``policy`` (in a thread), an ``ElasticScaler`` for a ``scaler``; stops the runner, reads the outputs back and
    gives the run's ``account`` (``control.account``).

    ``overwrite=False`` refuses an ``out_dir`` that already holds a run's outputs; ``True`` clears them.
    ``resume``: the directory was prepared by ``resume.open_run``; only its pending shards are fed."""
    out = Path(out_dir)
    if scaler is not None and policy is None:
        raise RuntimeConfigError("a scaler acts in the control loop: give a policy (trident places work on the nodes as they join)")
    old = run_outputs(out) if resume is None else []
    if old and not overwrite:
        refuse_used_out(out)
    for p in old:
        p.unlink()
    if resume is not None and resume.committed:
        resume_pipeline(spec, out)  # e.g. the near-duplicate index seeded with the committed documents
    feeder = resume_mod.ShardFeeder(resume.pending) if resume is not None else None
    policy_name = policy.name if policy is not None else "none"
    session = RunSession(spec, out, policy_name, runner_name=name or f"trident-runner-{uuid.uuid4().hex[:8]}", namespace=namespace,
                         settings=settings, scaler=scaler)
    starting = getattr(policy, "starting_spec", None)  # Trident may start in what its memory learned
    handle = session.start(starting(spec) if starting is not None else None, external_input=feeder is not None)
    loop = ControlLoop(handle, policy, tick_s, decision_log, scaler).start() if policy is not None else None
    try:
        while True:
            if feeder is not None:
                feeder.pump(handle)
            finished = ray.get(handle.wait.remote(poll_s))["finished"]
            if progress is not None:
                progress(ray.get(handle.state.remote()))
            if finished:
                break
        end = session.ended()
        samples = ray.get(handle.samples.remote(0)).samples
    finally:
        session.stop(loop.stop if loop is not None else lambda: None)
    figures = end_policy(policy_name, policy, loop.record if loop is not None else None, samples, spec, end.state)
    run_account, _ = session.account(figures, end)
    finish_pipeline(spec, out)  # e.g. near-duplicates found out of order, settled in the committed output
    return session.summary(end, run_account, figures.run_figures, decisions_made=loop.decisions if loop is not None else 0, resume=resume)


def _summary_table(summary: RunSummary) -> Any:
    from rich.table import Table

    table = Table(title=f"{summary.pipeline} ({summary.policy})")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key in ("shards_total", "shards_skipped", "items_in", "items_written", "items_dropped", "items_dead_lettered", "items_missing", "rows_written", "duplicate_ids",
                "wall_s", "throughput_items_per_s", "latency_s_p50", "latency_s_p99", "ooms", "reconfigurations", "rolling_update_dip",
                "memory_loaded", "memory_regimes_known", "reaction_s_median", "prepositioned_moves"):
        value = getattr(summary, key)
        if value is None and key.startswith(("memory_", "reaction_", "prepositioned_")):
            continue
        table.add_row(key, f"{value:.3f}" if isinstance(value, float) else str(value))
    for key, value in summary.corpus.items():
        table.add_row(key, str(value))
    ops = Table(title="operators")
    for col in ("operator", "replicas", "configs", "busy", "items", "errors", "ooms"):
        ops.add_column(col)
    for name, f in summary.operators.items():
        ops.add_row(name, str(f["replicas"]), ", ".join(f"{n}x {c}" for c, n in f["configs"].items()), f"{f['busy_fraction']:.2f}",
                    str(f["items_in"]), str(f["errors"]), str(f["ooms"]))
    return table, ops


def _check_reachable(address: str, timeout_s: float = 10.0) -> None:
    """Refuse an address where nothing listens (``ray.init`` would retry for minutes)."""
    import socket

    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except (OSError, ValueError) as exc:
        raise RuntimeConfigError(f"no Ray cluster answers at --address {address} ({exc}): give HOST:PORT of a running cluster "
                                 "(`ray status` on its head node), or leave --address out to start a local node") from None


def _committed_summary(pipeline: str, policy: str, plan: resume_mod.ResumePlan) -> RunSummary:
    """The summary of a run whose shards were all committed earlier (nothing to start)."""
    return run_summary(pipeline, policy, plan.out_dir, None, output_counts(Path(plan.out_dir)), items_in=plan.manifest.items, items_done=0,
                       decisions_made=0, shards_total=plan.shards_total, shards_skipped=plan.shards_skipped,
                       account=build_account(policy, None, np.empty(0), np.empty(0), OomsAvoided(None, (), "not counted: nothing ran"),
                                             Estimate(None, "no estimate: nothing ran"), 0.0,
                                             "nothing ran: an earlier run committed every shard"))


def run_command(*, pipeline: str, out: Path, policy: str = DEFAULT_POLICY, input: Path | str | None, synth: int | None, regimes: str | None,
                seed: int, cpus: float | None, gpus: float | None, address: str | None, summary_json: Path | None, tick_s: float,
                decision_log: Path | None, console: Any, quality: dict[str, str] | None = None,
                tune: dict[str, str] | None = None, restart: bool = False, memory: str | None = None, table: str | None = None,
                retry_dead_letters: bool = False, dataset_support: Any = None, deadline: str | None = None, budget: float | None = None,
                catalogue: Path | None = None) -> RunSummary:
    """The ``trident-flows run`` command: Ray, the pipeline sized and sharded (a re-run resumes; ``restart=True``
    starts over), progress, summary, ``--summary-json``; ``MODULE:FUNCTION`` through ``dataset_support``; corpus
    runs (``control.corpus_run``); a ``goal`` (``deadline``/``budget``) needs ``address``, trident and a
    ``catalogue``. A dead runner is restarted ``RUNNER_RESTARTS`` times. Raises ``RuntimeConfigError`` for a bad
    option (``resume.RunMismatch`` for an ``out`` holding another run) and ``resume.RunInterrupted`` (after
    shutting down, committed shards kept) on Ctrl-C."""
    from trident_flows.pipelines import build_pipeline

    if address in ("auto", "local"):
        raise RuntimeConfigError(f"--address {address} is not allowed ('auto' may attach to a stranger's cluster): give HOST:PORT "
                                 "of your cluster, or leave --address out to start a local Ray node")
    ray_data = ":" in pipeline  # MODULE:FUNCTION returning a user's Ray Data Dataset
    if ray_data and dataset_support is None:
        raise ValueError(f"{pipeline} is a Ray Data pipeline: give dataset_support=trident_flows.ray_data")
    elastic = _elastic_goal(deadline, budget, catalogue, address, policy)
    corpus = _corpus_run(pipeline, input, table, out, retry_dead_letters, quality, tune, console)
    try:  # options are checked (and a registry pipeline built) before Ray starts
        make_policy(policy)
        spec = (corpus.spec if corpus is not None else None if ray_data else
                build_pipeline(pipeline, input=input, synth=synth, seed=seed, regimes=regimes, work_dir=out / "_inputs", quality=quality,
                               tune=tune))
    except (ValueError, FileNotFoundError) as exc:
        raise RuntimeConfigError(str(exc)) from None
    if address:
        _check_reachable(address)
    # another run in --out is refused before Ray starts; a corpus run's --out is its staging area, replaced by a new night's work
    opened = None if spec is None else _open_run(spec, out, restart, console, "restart" if corpus is not None and corpus.table is not None else "refuse")
    with resume_mod.stop_on_first_interrupt(console.print):
        try:
            if corpus is not None and not corpus.work.items:
                summary = _committed_summary(spec.name, policy, opened[1])  # nothing new: no Ray node to start
                if corpus.table is not None:
                    summary = replace(summary, corpus=_publish(corpus, out, summary))
            else:
                _start_ray(address, cpus, gpus, console)
                try:
                    if spec is None:  # Ray Data reads the user's input, so its pipeline is built once Ray is up
                        spec = dataset_support.prepare_target(pipeline, out / "_inputs", input=input, synth=synth, seed=seed,
                                                              regimes=regimes)
                        opened = _open_run(spec, out, restart, console)
                    if corpus is not None:
                        corpus.seed()
                    shards, plan = opened
                    summary = (_run_resumable(spec, shards, plan, out=out, policy=policy, tick_s=tick_s, decision_log=decision_log,
                                              console=console, memory=memory_uri(memory, out, spec.name) if policy == "trident" else None,
                                              elastic=elastic)
                               if plan.pending else _committed_summary(spec.name, policy, plan))
                    if ray_data:
                        console.print(f"Ray Data output: {dataset_support.publish(out)['rows']} rows in {out / 'dataset'}")
                    if corpus is not None and corpus.table is not None and not summary.error:
                        summary = replace(summary, corpus=_publish(corpus, out, summary))
                    elif corpus is not None:
                        summary = replace(summary, corpus=corpus.figures())
                finally:
                    ray.shutdown()
        except KeyboardInterrupt:
            raise resume_mod.RunInterrupted(resume_mod.interrupted_message(out)) from None
    for table in _summary_table(summary):
        console.print(table)
    if summary.account is not None:
        for line in summary.account.lines():
            console.print(line, highlight=False, soft_wrap=True, markup=False)
    if summary.output_note:
        console.print(f"[yellow]{summary.output_note}")
    if summary.error:
        console.print(f"[red]run failed: {summary.error}")
    if summary_json:
        tmp = summary_json.with_suffix(".tmp")
        with naming_the_path(summary_json):
            summary_json.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(summary.to_dict(), indent=2, default=str) + "\n")
            tmp.replace(summary_json)
        console.print(f"summary: {summary_json}")
    return summary


def _elastic_goal(deadline: str | None, budget: float | None, catalogue: Path | None, address: str | None,
                  policy: str) -> tuple[Any, Any] | None:
    """``(NodePool, RunGoal)`` of a run with ``--deadline`` or ``--budget`` (None without one); every missing piece refused."""
    if deadline is None and budget is None:
        if catalogue is not None:
            raise RuntimeConfigError("--catalogue names the node classes trident may request for a goal: add --deadline or --budget")
        return None
    from trident_flows.planning.catalogue import PlanningError, load_catalogue
    from trident_flows.planning.scale import NodePool, RunGoal, parse_deadline

    goal_flag = "--deadline" if deadline is not None else "--budget"
    if not address:
        raise RuntimeConfigError(f"{goal_flag} asks Ray's autoscaler for nodes: give --address HOST:PORT of an autoscaling cluster "
                                 "(KubeRay with enableInTreeAutoscaling, or Ray's cluster launcher; docs/kuberay.md)")
    if policy != "trident":
        raise RuntimeConfigError(f"{goal_flag} needs --policy trident: it places work on the nodes as they join ({policy} does not)")
    if catalogue is None:
        raise RuntimeConfigError(f"{goal_flag} needs --catalogue FILE: the worker node types the autoscaler may start, each named as its "
                                 "Ray node type (and carrying a custom resource of that name), with prices and start-up minutes "
                                 "(format: planning/default_catalogue.toml; docs/kuberay.md)")
    try:
        goal = RunGoal(deadline_at=parse_deadline(deadline, time.time()) if deadline is not None else None, budget=budget)
        return NodePool.from_catalogue(load_catalogue(catalogue)), goal
    except PlanningError as exc:
        raise RuntimeConfigError(str(exc)) from None


def _corpus_run(pipeline: str, input: Path | str | None, table: str | None, out: Path, retry_dead_letters: bool,
                quality: dict[str, str] | None, tune: dict[str, str] | None, console: Any) -> Any:
    """The ``CorpusRun`` of a run with ``table`` or a URL ``input`` (None for any other run); its options checked."""
    url = input is not None and "://" in str(input) and not str(input).startswith("file://")
    if table is None and not url:
        if retry_dead_letters:
            raise RuntimeConfigError("--retry-dead-letters retries the files a --table remembers as dead-lettered; add --table TABLE_URI")
        return None
    if pipeline != "documents":
        raise RuntimeConfigError(f"--table and URL inputs are for the documents pipeline; {pipeline!r} reads a local --input directory")
    if input is None:
        raise RuntimeConfigError("--table needs --input DIR_OR_URL: the directory or URL where the documents land")
    from trident_flows.control.corpus_run import CorpusRun

    corpus = CorpusRun.prepare(input, table, out, retry_dead_letters, quality=quality, tune=tune)
    console.print(corpus.plan_line(table), soft_wrap=True, highlight=False)
    return corpus


def _publish(corpus: Any, out: Path, summary: RunSummary) -> dict[str, Any]:
    """Commit a corpus run to its table (``CorpusRun.publish``) with the summary's counts and decisions; its figures."""
    from trident_flows.control.corpus_run import decisions_of

    items = {"items_written": summary.items_written, "items_dead_lettered": summary.items_dead_lettered, "items_dropped": summary.items_dropped}
    decisions = {**decisions_of(summary.policy, summary.reconfigurations, summary.apply_reports), "decisions": summary.decisions_made}
    return corpus.publish(out, items, decisions)


def _open_run(spec: PipelineSpec, out: Path, restart: bool, console: Any,
              on_mismatch: str = "refuse") -> tuple[Any, resume_mod.ResumePlan]:
    """Cut the input into shards and prepare ``out`` for them (resume, restart, or refuse another run)."""
    rows = list(spec.source())
    shards = resume_mod.plan_shards(rows, resume_mod.default_shard_size(len(rows)))
    plan = resume_mod.open_run(out, spec.name, shards, restart=restart, on_mismatch=on_mismatch)
    if plan.message():
        console.print(plan.message())
    return shards, plan


def _start_ray(address: str | None, cpus: float | None, gpus: float | None, console: Any) -> None:
    """Join the cluster at ``address`` or start a local node (tried ``RAY_START_ATTEMPTS`` times on a busy machine)."""
    if address:
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        except ConnectionError as exc:
            raise RuntimeConfigError(f"cannot reach a Ray cluster at --address {address}: {exc}; check the address "
                                     "(`ray status` on the head node), and for a cluster with token authentication set "
                                     "RAY_AUTH_MODE=token and its token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token); "
                                     "or leave --address out to start a local node") from None
        return
    for attempt in range(RAY_START_ATTEMPTS):
        try:
            ray.init("local", num_cpus=int(cpus) if cpus else None, num_gpus=int(gpus) if gpus is not None else None,
                     include_dashboard=False, log_to_driver=False, configure_logging=False)
            return
        except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception when its raylet misses its fixed 30 s start-up wait
            ray.shutdown()
            if "timed out during startup" not in str(exc) or attempt == RAY_START_ATTEMPTS - 1:
                raise
            console.print("the local Ray node did not start within Ray's fixed 30 s (a busy machine?); trying again")


def memory_uri(given: str | None, out: Path, pipeline: str) -> str | None:
    """Where Trident's memory of this pipeline lives: ``given`` (a path or URI; ``off``: none), else
    ``trident-memory/PIPELINE.json`` beside the output directory, shared by the runs written next to it."""
    if given is not None and given.strip().lower() == MEMORY_OFF:
        return None
    if given:
        return given
    return str((out.resolve().parent / "trident-memory" / f"{pipeline}.json"))


def _run_resumable(spec: PipelineSpec, shards: Any, plan: resume_mod.ResumePlan, *, out: Path, policy: str, tick_s: float,
                   decision_log: Path | None, console: Any, memory: str | None = None, elastic: tuple[Any, Any] | None = None) -> RunSummary:
    """Size the pipeline to the running cluster and run the pending shards (a runner that dies is restarted)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from trident_flows.runtime.nodes import read_nodes
    from trident_flows.runtime.sizing import fit_to_nodes

    cpus_now, gpus_now = cluster_totals()
    sizing = fit_to_nodes(spec, read_nodes(ray.nodes()))
    spec = sizing.spec
    if sizing.notes:
        console.print(f"sized to the cluster ({cpus_now:g} CPUs, {gpus_now:g} GPUs): {'; '.join(sizing.notes)}")
    restarts = 0
    while True:
        options = {"memory": memory} if memory is not None else {}
        policy_obj = make_policy(policy, spec=spec, cluster=ClusterSpec.single_node(cpus_now, int(gpus_now)), **options)
        if memory is not None:
            console.print(f"trident memory: {memory}" + (f" ({policy_obj.memory.warning})" if policy_obj.memory.warning else
                                                          " (loaded)" if policy_obj.memory.loaded is not None else " (none yet: a cold start)"))
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
                      TimeElapsedColumn(), console=console, transient=False) as bar:
            task = bar.add_task(f"{spec.name} ({policy})", total=plan.manifest.items, completed=plan.items_skipped, rate="")

            def progress(state: RunnerState, bar=bar, task=task, plan=plan) -> None:  # this attempt's bar, task and plan
                bar.update(task, completed=plan.items_skipped + state.items_written + state.items_dead_lettered,
                           rate=f"{state.throughput:.1f} rows/s")
            scaler = None
            if elastic is not None:
                from trident_flows.control.elastic import ElasticScaler  # here: it reads the planner, which reads the simulator

                scaler = ElasticScaler(*elastic, items_total=plan.manifest.items - plan.items_skipped)
            try:
                return run_pipeline(spec, out, policy=policy_obj, progress=progress, tick_s=tick_s, decision_log=decision_log,
                                    resume=plan, scaler=scaler)
            except ray.exceptions.RayActorError as exc:
                restarts += 1
                if restarts > RUNNER_RESTARTS:
                    raise
                cause = str(exc).splitlines()[0][:200]
        plan = resume_mod.open_run(out, spec.name, shards)
        console.print(f"the pipeline runner died ({cause}); restarted it ({restarts} of {RUNNER_RESTARTS}): "
                      f"{plan.shards_skipped} of {plan.shards_total} shards already committed")
