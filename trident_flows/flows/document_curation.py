"""The ``document-curation`` flow: run a curation pipeline on Ray, one task run per input shard.

Contract:
- Connects to the ``RayClusterBlock``'s cluster (or starts a local node), sizes the starting replicas to
  the live nodes (a cluster too small is refused saying what to change) and runs each input shard as a
  task run through prefect-ray's ``RayTaskRunner``, with retries (``pipeline.ray_data_pipeline``: a
  user's Ray Data pipeline instead, published to ``OUTPUT/dataset``).
- Idempotent per shard: a re-run replaces a shard's partition; a flow-run retry skips committed shards.
- Unless ``policy="static"``, the ``trident-sidecar`` flow runs as its subflow for the pipeline's life;
  a table or URL input makes it a corpus run (``control.corpus_run``).
- Returns the run's summary (``loop.run_summary.RunSummary.to_dict``) and publishes progress, summary,
  account and corpus artifacts; bad ``credentials`` or locations fail before the pipeline starts.
"""

from __future__ import annotations

import contextvars
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

import ray
from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, create_table_artifact, update_progress_artifact
from prefect.context import get_run_context
from prefect_ray.context import remote_options

from trident_flows import ray_data
from trident_flows.blocks import PipelineSettingsBlock, RayClusterBlock, TridentSettingsBlock
from trident_flows.blocks.s3_credentials import load_credentials
from trident_flows.control.account import PolicyFigures, RunAccount
from trident_flows.control.corpus_run import CorpusRun, decisions_of, describe
from trident_flows.control.launch import RunSession, memory_uri, output_counts
from trident_flows.core.state import RuntimeConfigError
from trident_flows.flows.prefect_env import worker_env
from trident_flows.loop.run_summary import OutputCounts, RunSummary, run_summary
from trident_flows.pipelines import build_pipeline, finish_pipeline, resume_pipeline
from trident_flows.pipelines.quality import output_note
from trident_flows.runtime.nodes import read_nodes
from trident_flows.runtime.resume import open_run
from trident_flows.runtime.sizing import fit_to_nodes
from trident_flows.tasks.curation import count_near_duplicates, curate_shard, plan_shards, summary_table


def _artifact_key(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")


def _wait_some(pending: list[Any], timeout_s: float) -> tuple[list[Any], list[Any]]:
    """Wait up to ``timeout_s`` for some shard task runs on Ray; return (done, still pending)."""
    ready, _ = ray.wait([f.wrapped_future for f in pending], num_returns=1, timeout=timeout_s)
    ready_ids = {r.hex() for r in ready}
    done = [f for f in pending if f.wrapped_future.hex() in ready_ids]
    for future in done:
        future.wait()
    return done, [f for f in pending if f.wrapped_future.hex() not in ready_ids]


def _remove_stale_shards(out_dir: Path, shard_ids: set[str]) -> list[Path]:
    """Delete committed partitions of shards this run does not have (an earlier run cut its input
    into more shards), so the output location holds exactly this run's shards."""
    stale = [p for sub in ("data", "dead_letter") for p in sorted((out_dir / sub).glob("shard=*.parquet"))
             if p.stem.removeprefix("shard=") not in shard_ids]
    for path in stale:
        path.unlink()
    return stale


def _release_shared_state(spec: Any) -> None:
    """Remove what a pipeline keeps in the cluster beyond its runner (the documents dedup index)."""
    if spec.name == "documents":
        from trident_flows.pipelines.doc_dedup import release_index
        from trident_flows.pipelines.documents import dedup_index_name

        release_index(dedup_index_name(spec))


def _progress(runner: Any, items_in: int) -> tuple[float, str]:
    state = ray.get(runner.state.remote())
    done = state.items_written + state.items_dead_lettered
    return (100.0 * done / items_in if items_in else 100.0,
            f"{done}/{items_in} items accounted for ({state.items_written} written, {state.items_dead_lettered} dead-lettered), "
            f"{state.throughput:.1f} items/s")


def _ray_origin(cluster: RayClusterBlock, connection: Any) -> str:
    """Say truthfully where the run's Ray cluster came from."""
    resources = connection.resources
    size = f"{resources.get('CPU', 0):g} CPUs, {resources.get('GPU', 0):g} GPUs"
    if connection.started_by_us and not cluster.address:
        return f"started a local Ray node for this run at {connection.address} ({size}, namespace {connection.namespace})"
    if connection.started_by_us:
        return f"joined the existing Ray cluster at {cluster.address} ({size}, namespace {connection.namespace})"
    return f"using the Ray cluster this process is already connected to, {connection.address} ({size}, namespace {connection.namespace})"


def sidecar_settings(trident: Optional[TridentSettingsBlock]) -> Optional[TridentSettingsBlock]:
    """The settings of the run's ``trident-sidecar`` subflow: the given ones, the block's defaults (the Trident policy)
    when none are given, and ``None`` (no sidecar) for the ``static`` policy, which never changes anything."""
    settings = trident if trident is not None else TridentSettingsBlock()
    return None if settings.policy == "static" else settings


@flow(name="document-curation", description="Run a curation pipeline on Ray, one task run per input shard, tuned by Trident "
                                            "for the whole run (trident settings with policy static: not tuned).")
def document_curation(pipeline: PipelineSettingsBlock, cluster: Optional[RayClusterBlock] = None, max_parallel_shards: int = 3,
                      shard_timeout_s: float = 3600.0, trident: Optional[TridentSettingsBlock] = None, input: Optional[str] = None,
                      table: Optional[str] = None, credentials: Optional[str] = None) -> dict[str, Any]:
    """Curate ``pipeline``'s input into its output location on ``cluster`` (default: a local Ray node),
    tuned by a ``trident-sidecar`` subflow under the ``trident`` settings (default: the Trident policy;
    ``{"policy": "static"}``: no sidecar, the pipeline runs as configured). ``input`` (a directory or
    URL where the documents land) and ``table`` (a table location: only new or changed files are
    curated, into it) replace the block's locations when given, ``credentials`` (the name of a saved
    Trident S3 Credentials block, for s3:// locations) the block's credentials.

    The starting replicas are sized to the live nodes by ``runtime.sizing.fit_to_nodes``; the runner is a
    named actor whose lifecycle, account and summary are ``control.launch.RunSession``'s, as for
    ``trident-flows run``. A flow-run retry restores what the pipeline needs from the committed shards
    before skipping them. Returns ``RunSummary.to_dict()``: ``--summary-json``'s keys, ``replicas_by_node``,
    the curation figures (``kept``, ``near_duplicates``, ``filtered``, ``dead_lettered``, ``shards``) and, for
    a corpus run, the corpus figures."""
    logger = get_run_logger()
    pipeline = pipeline.with_locations(input, table, credentials)
    cluster = cluster or RayClusterBlock()
    env = worker_env()
    connection = cluster.connect(env_vars=env)
    logger.info("%s", _ray_origin(cluster, connection))
    try:
        summary = _curate(pipeline, cluster, connection.namespace, env, max_parallel_shards, shard_timeout_s, trident)
    finally:
        if connection.started_by_us:
            ray.shutdown()
    return summary.to_dict()


class _Sidecar:
    """The ``trident-sidecar`` subflow of this curation run, in a thread of this process."""

    def __init__(self, runner_name: str, trident: TridentSettingsBlock, items_total: int) -> None:
        from trident_flows.flows.trident_sidecar import trident_sidecar

        run = get_run_context().flow_run
        self.outcome: dict[str, Any] = {}
        subflow = trident_sidecar.with_options(flow_run_name=f"tune {run.name}")

        def body() -> None:
            self.outcome["state"] = subflow(trident=trident, runner_name=runner_name, until_finished=True,
                                            tuned_flow_run_id=str(run.id), items_total=items_total, return_state=True)

        # Prefect's run context lives in context variables, which a new thread does not inherit:
        # copying them makes the sidecar a subflow of this run, reporting to the same server.
        self.thread = threading.Thread(target=contextvars.copy_context().run, args=(body,), name=f"trident-sidecar-{runner_name}",
                                       daemon=True)
        self.thread.start()

    def join(self, timeout_s: float) -> Optional[PolicyFigures]:
        """Wait for the sidecar to end (it ends within a tick of the pipeline), log how it ended and return the
        account figures it took at the pipeline's end (None when it did not end well)."""
        logger = get_run_logger()
        self.thread.join(timeout_s)
        state = self.outcome.get("state")
        if self.thread.is_alive() or state is None:
            logger.warning("the trident-sidecar subflow did not end within %.0f s of the pipeline", timeout_s)
        elif not state.is_completed():
            logger.warning("the trident-sidecar subflow ended %s: %s", state.type.value, state.message)
        else:
            result = state.result()
            logger.info("trident-sidecar ended with the pipeline: %d ticks, %d decisions, %d applied",
                        result["ticks"], result["decisions"], result["plans_applied"])
            return result.get("account_figures")
        return None


def _corpus_run(pipeline: PipelineSettingsBlock, out_dir: Path) -> Optional[CorpusRun]:
    """The corpus run of a block with a table location or a URL input (None otherwise), its work logged."""
    url = pipeline.input_location is not None and "://" in pipeline.input_location
    if pipeline.table_location is None and not url:
        if pipeline.credentials:
            raise RuntimeConfigError(f"credentials={pipeline.credentials!r} are for s3:// locations, and this run has neither a table nor a "
                                     f"URL input ({pipeline.input_location}): give no credentials, or an s3:// input or table")
        return None
    try:
        credentials = load_credentials(pipeline.credentials) if pipeline.credentials else None
    except ValueError as exc:
        raise RuntimeConfigError(str(exc)) from None
    corpus = CorpusRun.prepare(pipeline.input_location, pipeline.table_location, out_dir, pipeline.retry_dead_letters,
                               quality=dict(pipeline.quality), tune=dict(pipeline.tune), credentials=credentials)
    get_run_logger().info("%s", corpus.plan_line(pipeline.table_location))
    return corpus


def _corpus_figures(corpus: CorpusRun, out_dir: Path, key: str, outputs: OutputCounts, decisions: dict[str, Any]) -> dict[str, Any]:
    """Commit a corpus run to its table (``CorpusRun.publish``; none without a table) and show its figures on the run's page."""
    logger = get_run_logger()
    if corpus.table is None:
        figures = corpus.figures()
    else:
        items = {"items_written": outputs.items_written, "items_dead_lettered": outputs.items_dead_lettered,
                 "items_dropped": outputs.items_dropped}
        figures = corpus.publish(out_dir, items, decisions, flow_run_id=str(get_run_context().flow_run.id))
        logger.info("committed version %d of %s", figures["table_version"], corpus.table.location.uri)
    labels = {"files_new": "new files", "files_changed": "changed files", "files_unchanged": "unchanged files", "files_deleted": "deleted files",
              "files_retried": "dead letters retried", "files_requeued": "near-duplicates of changed files, curated again",
              "near_duplicates_of_earlier_runs": "near-duplicates of earlier runs", "earlier_rows_revised": "earlier rows revised",
              "table_version": "table version written"}
    create_table_artifact([{"figure": labels[k], "value": figures[k]} for k in labels], key=f"{key}-corpus",
                          description=f"{describe(figures)}; input {corpus.source.uri}")
    return figures


def _prepare_inputs(pipeline: PipelineSettingsBlock, out_dir: Path, corpus: Optional[CorpusRun]) -> Any:
    """Build the pipeline (a corpus run's: over its new and changed files), generating synthetic inputs first when asked
    to (logged: it can take a while)."""
    logger = get_run_logger()
    work_dir = out_dir.parent / f".{out_dir.name}-inputs"
    if pipeline.input_location:
        logger.info("reading inputs from %s", pipeline.input_location)
    elif pipeline.synth:
        logger.info("preparing %d synthetic inputs for %s (generated under %s, or reused when already there)",
                    pipeline.synth, pipeline.ray_data_pipeline or pipeline.pipeline, work_dir)
    start = time.monotonic()
    options = pipeline.build_options(work_dir=work_dir)
    spec = (corpus.spec if corpus is not None else ray_data.prepare_target(pipeline.ray_data_pipeline, **options)
            if pipeline.ray_data_pipeline else build_pipeline(pipeline.pipeline, **options))
    shards = plan_shards(spec.source(), pipeline.shard_size)
    logger.info("inputs ready in %.1f s: %d items", time.monotonic() - start, sum(len(s.rows) for s in shards))
    nodes = read_nodes(ray.nodes())
    sizing = fit_to_nodes(spec, nodes)
    if sizing.notes:
        logger.info("sized to the cluster (%d nodes, %g CPUs, %g GPUs): %s", len(nodes), sum(n.cpus for n in nodes),
                    sum(n.gpus for n in nodes), "; ".join(sizing.notes))
    return sizing.spec, shards


def _curate(pipeline: PipelineSettingsBlock, cluster: RayClusterBlock, namespace: str, env: dict[str, str], max_parallel_shards: int,
            shard_timeout_s: float, trident: Optional[TridentSettingsBlock] = None) -> RunSummary:
    """The body of ``document_curation`` once connected to Ray: the run's summary (with no account when a corpus run had
    nothing to curate; with a corpus run's figures)."""
    logger = get_run_logger()
    out_dir = Path(pipeline.output_location).resolve()
    corpus = _corpus_run(pipeline, out_dir)
    key = _artifact_key(f"curation-{pipeline.runner_name}")
    trident = sidecar_settings(trident)
    policy_name = trident.policy if trident is not None else "static"
    if corpus is not None and not corpus.work.items:
        logger.info("no new or changed file: nothing to curate")
        outputs = output_counts(out_dir)
        summary = run_summary(corpus.spec.name, policy_name, str(out_dir), None, outputs, items_in=0, items_done=0, decisions_made=0,
                              near_duplicates=count_near_duplicates(out_dir))
        return replace(summary, corpus=_corpus_figures(corpus, out_dir, key, outputs, {"policy": "none", "reconfigurations": 0, "plans": []}))
    spec, shards = _prepare_inputs(pipeline, out_dir, corpus)
    items_in = sum(len(s.rows) for s in shards)
    logger.info("pipeline %s: %d items in %d shards of up to %d", spec.name, items_in, len(shards), pipeline.shard_size)
    if output_note(spec):
        logger.warning("%s", output_note(spec))

    # a flow-run retry (or re-run over the same input) skips the shards an earlier run committed
    plan = open_run(out_dir, spec.name, shards, on_mismatch="restart", restart_hint="a new output_location")
    logger.info(plan.message() or (f"output location held another run ({plan.restarted}): starting over" if plan.restarted else "fresh run"))
    todo = [s for s in shards if s.shard_id not in plan.committed]
    stale = _remove_stale_shards(out_dir, {s.shard_id for s in shards})
    if stale:
        logger.info("removed %d partitions of an earlier run's shards that this run does not have", len(stale))
    if plan.committed:  # e.g. the near-duplicate index seeded with the committed documents
        restored = resume_pipeline(spec, out_dir)
        if restored:
            logger.info("restored from the committed shards: %s", restored)
    if corpus is not None:
        logger.info("near-duplicate index seeded with %d documents of earlier runs", corpus.seed())
    progress_id = create_progress_artifact(0.0, key=f"{key}-progress", description=f"{spec.name}: 0/{items_in} items")
    session = RunSession(spec, out_dir, policy_name, runner_name=pipeline.runner_name, namespace=namespace)
    start = time.monotonic()
    logger.info("starting the pipeline runner %r (its operators' replicas start on the Ray cluster)", pipeline.runner_name)
    runner = session.start(external_input=True)
    logger.info("pipeline runner %r up in %.1f s", pipeline.runner_name, time.monotonic() - start)
    if trident is not None and trident.policy == "trident" and trident.memory is None:
        # what earlier runs of the pipeline learned, beside the output (as ``trident-flows run`` keeps it)
        trident = trident.model_copy(update={"memory": memory_uri(None, out_dir, spec.name)})
    if trident is None:
        logger.info("policy static: the pipeline runs as configured, with no trident-sidecar")
    sidecar = _Sidecar(pipeline.runner_name, trident, sum(len(s.rows) for s in todo)) if trident is not None else None
    corpus_figures: dict[str, Any] = {}
    try:
        with cluster.task_runner(env_vars=env) as ray_runner, remote_options(num_cpus=0, runtime_env={"env_vars": env}):
            pending: list[Any] = []
            finished: list[Any] = []
            for shard in todo:
                while len(pending) >= max_parallel_shards:
                    done, pending = _wait_some(pending, 2.0)
                    finished.extend(done)
                    update_progress_artifact(progress_id, *_progress(runner, items_in))
                pending.append(ray_runner.submit(curate_shard, parameters={
                    "runner_name": pipeline.runner_name, "namespace": namespace, "shard_id": shard.shard_id,
                    "rows": [dict(r) for r in shard.rows], "timeout_s": shard_timeout_s}))
            while pending:
                done, pending = _wait_some(pending, 2.0)
                finished.extend(done)
                update_progress_artifact(progress_id, *_progress(runner, items_in))
            for future in finished:
                future.result()  # raises if a shard failed after its retries
        ray.get(runner.close_input.remote())
        while not (final := ray.get(runner.state.remote())).finished:
            time.sleep(0.2)
        if final.error:
            raise RuntimeError(f"pipeline {spec.name} failed: {final.error}")
        finish_pipeline(spec, out_dir)  # e.g. near-duplicates found out of order, settled in the committed output
        end = session.ended()
        outputs, near_duplicates = output_counts(out_dir), count_near_duplicates(out_dir)
        _log_replicas_by_node(end.replicas_by_node)
        update_progress_artifact(progress_id, *_progress(runner, items_in))
        if corpus is not None:  # while the near-duplicate index lives: the table gets the index the run ends with
            decisions = decisions_of(policy_name, end.state.reconfigurations, end.apply_reports)
            corpus_figures = _corpus_figures(corpus, out_dir, key, outputs, decisions)
    finally:
        # the sidecar ends within a tick of the pipeline's end (a failed run's runner is stopped first, which ends it)
        figures = session.stop(lambda: sidecar.join(timeout_s=trident.tick_interval_s + 120.0) if sidecar is not None else None)
        _release_shared_state(spec)
    if pipeline.ray_data_pipeline:
        logger.info("Ray Data output: %d rows in %s", ray_data.publish(out_dir)["rows"], out_dir / "dataset")
    if figures is None and trident is not None:
        logger.warning("the account has no figures of the %s policy: its sidecar did not see the pipeline's end", policy_name)
    account, png = session.account(figures, end)
    decisions_made = len(figures.record.decisions) if figures is not None and figures.record is not None else 0
    summary = replace(session.summary(end, account, figures.run_figures if figures is not None else None, decisions_made=decisions_made,
                                      resume=plan, outputs=outputs, near_duplicates=near_duplicates), corpus=corpus_figures)
    create_table_artifact(summary_table(summary), key=f"{key}-summary",
                          description=f"{spec.name} into {out_dir}: kept, removed, dead-lettered items and throughput")
    _publish_account(account, png, key)
    curated = summary.curation
    logger.info("curated %d items: %d kept, %d near-duplicates, %d filtered, %d dead-lettered, %.3g items/s",
                summary.items_in, curated.kept, curated.near_duplicates, curated.filtered, curated.dead_lettered,
                summary.throughput_items_per_s)
    return summary


def _publish_account(account: RunAccount, png: bytes, key: str) -> None:
    """The run's account as the markdown artifact on this run (its timeline inlined), and its lines in the log."""
    create_markdown_artifact(account.markdown(png), key=f"{key}-account",
                             description=f"What {account.policy} did: {len(account.decisions)} decision(s), OOMs avoided, "
                                         "the ESTIMATE of the starting configuration's rate, the throughput timeline")
    for line in account.lines():
        get_run_logger().info("%s", line)


def _log_replicas_by_node(replicas_by_node: dict[str, dict[str, int]]) -> None:
    """One log line: on how many nodes the replicas ran, and which operators ran on each (node id, class)."""
    classes = {n.node_id: n.node_class for n in read_nodes(ray.nodes())}
    where = "; ".join(f"{node_id[:8]} ({classes.get(node_id, 'gone')}): " + ", ".join(f"{op} {n}" for op, n in sorted(ops.items()))
                      for node_id, ops in sorted(replicas_by_node.items()))
    get_run_logger().info("replicas ran on %d node(s): %s", len(replicas_by_node), where or "none")
