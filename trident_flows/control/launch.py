"""Starting and finding runners, running a pipeline to the end, and the ``trident-flows run`` glue.

Contract:
- ``check_pipeline(spec, settings, cpus, gpus)`` refuses, before anything starts, a pipeline whose
  initial replicas need more CPUs/GPUs than the cluster has (``RuntimeConfigError``).
- ``start_runner(...)`` creates and starts the named runner actor; ``find_runner(name, namespace)``
  returns a handle to it from any driver of the same cluster.
- ``run_pipeline(spec, out_dir, ...) -> RunSummary`` runs to the end (with the control loop for a
  policy, an ``ElasticScaler`` for a ``scaler``, resuming with ``resume=``), stops the runner, reads
  the outputs back and gives the run's ``account`` (``control.account``).
- ``run_command(...)`` is the CLI ``run``: Ray, the pipeline sized and sharded (a re-run resumes;
  ``restart=True`` starts over), progress, summary, ``--summary-json``; ``MODULE:FUNCTION`` through
  ``dataset_support``; corpus runs (``control.corpus_run``); a ``goal`` needs ``address``, trident
  and a catalogue. A bad option raises ``RuntimeConfigError`` saying what to change; Ctrl-C keeps
  committed shards; a dead runner is restarted ``RUNNER_RESTARTS`` times.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import ray

from trident_flows.control.account import RunAccount, account_of_run, build_account, policy_figures
from trident_flows.control.account_plot import TIMELINE_PNG, timeline_png
from trident_flows.control.loop import ControlLoop
from trident_flows.control.ooms_avoided import OomsAvoided
from trident_flows.control.start_estimate import Estimate
from trident_flows.core.state import RunnerSettings, RunnerState, RuntimeConfigError
from trident_flows.core.types import ClusterSpec
from trident_flows.loop.figures import operator_figures
from trident_flows.pipelines import finish_pipeline, resume_pipeline
from trident_flows.pipelines.quality import output_note
from trident_flows.runtime import resume as resume_mod
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


def cluster_totals() -> tuple[float, float]:
    res = ray.cluster_resources()
    return float(res.get("CPU", 0.0)), float(res.get("GPU", 0.0))


def check_pipeline(spec: PipelineSpec, settings: RunnerSettings, cpus: float, gpus: float) -> None:
    """Refuse a pipeline whose initial placement does not fit the cluster (see module docstring)."""
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


@dataclass(frozen=True)
class RunSummary:
    """A finished run. ``items_written`` counts input items with rows in the data table (kept or
    ``_drop``-marked; ``items_dropped`` of them were filtered), ``items_dead_lettered`` those only
    in the dead-letter table; ``items_missing`` = items_in - written - dead-lettered (0 = none lost).
    ``rolling_update_dip`` is the largest throughput dip of an apply that started and retired replicas.
    ``decisions_made`` counts the plans handed to the runner; ``account`` says what they were and did
    (``to_dict`` puts its keys, ``decisions`` the list of them, at the top level).
    ``latency_s_p50`` / ``latency_s_p99``: seconds from an input item's read to done (``runtime.latency``),
    over the items this run read (None when it read none). Under Trident: ``memory_loaded`` (a memory of
    an earlier run was read), ``memory_regimes_known`` (the regimes it held), ``memory_warning`` (why a
    memory was ignored or rescaled), ``reaction_s_median`` (seconds from a regime recognised at the
    source to the first rollout after it) and ``prepositioned_moves`` (operators moved ahead of a known
    regime's items); None under other policies."""

    pipeline: str
    policy: str
    out_dir: str
    items_in: int
    items_written: int
    items_dead_lettered: int
    items_dropped: int
    items_missing: int
    rows_written: int
    duplicate_ids: int
    wall_s: float
    throughput_items_per_s: float
    ooms: int
    reconfigurations: int
    rolling_update_dip: float
    decisions_made: int
    operators: dict[str, dict[str, Any]]
    apply_reports: tuple[dict[str, Any], ...]
    error: str = ""
    output_note: str = ""  # set when a quality knob is tunable: outputs can differ by configuration
    shards_total: int = 0
    shards_skipped: int = 0
    advice: dict[str, Any] = field(default_factory=dict)  # binding resource, gain of one more node per class (planning.advice)
    replicas_by_node: dict[str, dict[str, int]] = field(default_factory=dict)  # node id -> operator -> replicas that ran there
    latency_s_p50: float | None = None
    latency_s_p99: float | None = None
    # Trident's memory across runs and its regimes recognised at the source (None: another policy)
    memory_loaded: bool | None = None
    memory_regimes_known: int | None = None
    memory_warning: str | None = None
    reaction_s_median: float | None = None
    prepositioned_moves: int | None = None
    account: RunAccount | None = None
    elastic: dict[str, Any] = field(default_factory=dict)  # the scaler's summary (control.elastic) of a run with a goal
    corpus: dict[str, Any] = field(default_factory=dict)  # a corpus run's figures (control.corpus_run.FIGURES), top-level in to_dict

    def to_dict(self) -> dict[str, Any]:
        data = asdict(replace(self, account=None))
        del data["account"]
        data["apply_reports"] = list(self.apply_reports)
        if self.account is not None:
            data.update(self.account.to_dict())
        data.update(data.pop("corpus"))
        return data


def stop_runner(handle: Any, loop: ControlLoop | None = None, timeout_s: float = 60.0) -> None:
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


def run_pipeline(spec: PipelineSpec, out_dir: Path | str, *, settings: RunnerSettings | None = None, policy: Policy | None = None,
                 progress: Callable[[RunnerState], None] | None = None, tick_s: float = 2.0, decision_log: Path | None = None,
                 name: str | None = None, namespace: str = "trident", overwrite: bool = False, poll_s: float = 0.5,
                 resume: resume_mod.ResumePlan | None = None, scaler: ElasticScaler | None = None) -> RunSummary:
    """Run ``spec`` to the end on the current Ray cluster and return its summary (see module docstring).

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
    name = name or f"trident-runner-{uuid.uuid4().hex[:8]}"
    if resume is not None and resume.committed:
        resume_pipeline(spec, out)  # e.g. the near-duplicate index seeded with the committed documents
    feeder = resume_mod.ShardFeeder(resume.pending) if resume is not None else None
    starting = getattr(policy, "starting_spec", None)
    started = starting(spec) if starting is not None else spec  # Trident may start in what its memory learned
    try:
        handle = start_runner(started, out, name=name, namespace=namespace, settings=settings, external_input=feeder is not None)
    except BaseException:
        if scaler is not None:
            scaler.release()
        raise
    loop = ControlLoop(handle, policy, tick_s, decision_log, scaler).start() if policy is not None else None
    try:
        while True:
            if feeder is not None:
                feeder.pump(handle)
            summary = ray.get(handle.wait.remote(poll_s))
            if progress is not None:
                progress(ray.get(handle.state.remote()))
            if summary["finished"]:
                break
        final_state: RunnerState = ray.get(handle.state.remote())
        latencies = ray.get(handle.latencies.remote())
        samples = ray.get(handle.samples.remote(0)).samples
    finally:
        stop_runner(handle, loop)
    finish = getattr(policy, "finish", None)
    if finish is not None:
        finish(final_state)  # a policy that keeps something across runs (Trident's memory) writes it now
    start = [(op.name, op.config, op.replicas) for op in spec.operators]
    figures = policy_figures(policy.name if policy is not None else "none", policy, loop.record if loop is not None else None, samples,
                             start, final_state)
    run_account = account_of_run(figures, latencies.read_t, latencies.done_t, final_state)
    timeline = out / TIMELINE_PNG
    timeline_png(run_account, list(loop.record.points) if loop is not None else [], latencies.done_t, timeline)
    run_account = run_account.with_png(str(timeline))
    finish_pipeline(spec, out)  # e.g. near-duplicates found out of order, settled in the committed output
    from trident_flows.planning.advice import advice_dict  # here: planning reads the simulator, which imports this module
    acc = account(out)
    items_in = final_state.items_in + (resume.items_skipped if resume is not None else 0)
    return RunSummary(
        pipeline=spec.name, policy=policy.name if policy is not None else "none", out_dir=str(out), items_in=items_in,
        items_written=acc.items_written, items_dead_lettered=acc.items_dead_lettered, items_dropped=acc.items_dropped,
        items_missing=items_in - acc.items_written - acc.items_dead_lettered, rows_written=acc.rows_written,
        duplicate_ids=acc.duplicate_ids, wall_s=final_state.wall_s,
        throughput_items_per_s=final_state.items_in / final_state.wall_s if final_state.wall_s > 0 else 0.0,
        ooms=final_state.ooms, reconfigurations=final_state.reconfigurations, rolling_update_dip=float(summary["rolling_update_dip"]),
        decisions_made=loop.decisions if loop is not None else 0, operators=operator_figures(final_state),
        apply_reports=tuple(summary["apply_reports"]), error=final_state.error, output_note=output_note(spec),
        shards_total=resume.shards_total if resume is not None else 0, shards_skipped=resume.shards_skipped if resume is not None else 0,
        advice=advice_dict(final_state), replicas_by_node=dict(summary.get("replicas_by_node", {})), **latencies.percentiles(),
        account=run_account, elastic=scaler.summary() if scaler is not None else {}, **_policy_figures(policy))


def _policy_figures(policy: Policy | None) -> dict[str, Any]:
    """The ``RunSummary`` fields a policy reports of itself (Trident: its memory and source regimes)."""
    figures = getattr(policy, "run_figures", None)
    return figures() if figures is not None else {}


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
    acc = account(plan.out_dir)
    items = plan.manifest.items
    return RunSummary(pipeline=pipeline, policy=policy, out_dir=plan.out_dir, items_in=items, items_written=acc.items_written,
                      items_dead_lettered=acc.items_dead_lettered, items_dropped=acc.items_dropped,
                      items_missing=items - acc.items_written - acc.items_dead_lettered, rows_written=acc.rows_written,
                      duplicate_ids=acc.duplicate_ids, wall_s=0.0, throughput_items_per_s=0.0, ooms=0, reconfigurations=0,
                      rolling_update_dip=0.0, decisions_made=0, operators={}, apply_reports=(), shards_total=plan.shards_total,
                      shards_skipped=plan.shards_skipped,
                      account=build_account(policy, None, np.empty(0), np.empty(0), OomsAvoided(None, (), "not counted: nothing ran"),
                                            Estimate(None, "no estimate: nothing ran"), 0.0,
                                            "nothing ran: an earlier run committed every shard"))


def run_command(*, pipeline: str, out: Path, policy: str = DEFAULT_POLICY, input: Path | str | None, synth: int | None, regimes: str | None,
                seed: int, cpus: float | None, gpus: float | None, address: str | None, summary_json: Path | None, tick_s: float,
                decision_log: Path | None, console: Any, quality: dict[str, str] | None = None,
                tune: dict[str, str] | None = None, restart: bool = False, memory: str | None = None, table: str | None = None,
                retry_dead_letters: bool = False, dataset_support: Any = None, deadline: str | None = None, budget: float | None = None,
                catalogue: Path | None = None) -> RunSummary:
    """The ``trident-flows run`` command (see the module docstring). Raises ``RuntimeConfigError`` for a bad
    option (``resume.RunMismatch`` for an ``out`` holding another run) and ``resume.RunInterrupted`` (after
    shutting down) on Ctrl-C."""
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
        summary_json.parent.mkdir(parents=True, exist_ok=True)
        tmp = summary_json.with_suffix(".tmp")
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
