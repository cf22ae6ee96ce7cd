"""Task functions of the ``document-curation`` flow: cut the input into shards, feed one shard to
the pipeline runner and wait until it is committed, and summarise the committed output.

Contract:
- A shard is named by its position in the input order (``shard-00000``, ``shard-00001``, ...).
  The runner's sink writes one partition per shard id and replaces it when the same id is
  committed again, so a retried task run or a re-run of the whole flow never duplicates rows.
- ``curate_shard`` is idempotent: it asks the runner whether the shard is already done before
  (re-)adding it, and fails (so Prefect retries it) if the shard is not done within its timeout
  or the runner reports a failure.
- ``count_near_duplicates`` counts the committed rows dropped as near-duplicates (the run summary's
  ``near_duplicates``, ``loop.run_summary``); ``summary_table`` is the run summary's table artifact:
  kept, near-duplicate, quality-filtered and dead-lettered items, duplicate ids (must be 0) and throughput.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import pyarrow.parquet as pq
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from trident_flows.loop.run_summary import RunSummary
from trident_flows.runtime.spec import DROP

# ``_drop`` reasons of near-duplicates: the documents pipeline's dedup operator
# ("duplicate-of:<id>") and its emulated stand-in ("dedup:filtered").
NEAR_DUPLICATE_MARKS = ("duplicate-of:", "dedup:")


@dataclass(frozen=True)
class Shard:
    """A slice of the input: its id and rows (each row has a unique ``id``)."""

    shard_id: str
    rows: tuple[Mapping[str, Any], ...]


def plan_shards(rows: Iterable[Mapping[str, Any]], shard_size: int) -> list[Shard]:
    """Cut the input rows into shards of ``shard_size`` rows named by position."""
    if shard_size < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size}")
    rows = list(rows)
    return [Shard(f"shard-{k // shard_size:05d}", tuple(rows[k:k + shard_size])) for k in range(0, len(rows), shard_size)]


@task(name="curate-shard", task_run_name="curate {shard_id}", retries=2, retry_delay_seconds=2, cache_policy=NO_CACHE)
def curate_shard(runner_name: str, namespace: str, shard_id: str, rows: list[dict[str, Any]], timeout_s: float = 3600.0,
                 poll_s: float = 0.25) -> dict[str, Any]:
    """Hand one shard to the named pipeline runner and wait until its partition is committed.

    A shard the runner already finished is not re-run; one it is still running is waited for
    (a retry after a timeout); an unknown one is added."""
    import ray

    from trident_flows.control.launch import find_runner

    logger = get_run_logger()
    runner = find_runner(runner_name, namespace)
    if _status(runner, shard_id) is None:
        ray.get(runner.add_shard.remote(shard_id, rows))
        logger.info("%s: %d items handed to the pipeline", shard_id, len(rows))
    else:
        logger.info("%s: already known to the pipeline (a retry): waiting for it", shard_id)
    deadline = time.monotonic() + timeout_s
    while True:
        status = _status(runner, shard_id)
        if status is not None and status.done:
            logger.info("%s", shard_counts(status))
            return status.to_dict()
        failure = ray.get(runner.state.remote()).error
        if failure:
            raise RuntimeError(f"runner {runner_name!r} failed while shard {shard_id} was running: {failure}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"shard {shard_id} of runner {runner_name!r} not done after {timeout_s:.0f} s: "
                               f"{status.to_dict() if status else 'unknown to the runner'}")
        time.sleep(poll_s)


def shard_counts(status: Any) -> str:
    """The log line of a committed shard: items in, kept, filtered, dead-lettered."""
    kept = status.items_written - status.items_dropped
    return (f"{status.shard_id} committed: {status.items_in} items in, {kept} kept, {status.items_dropped} filtered "
            f"(quality, language, near-duplicates), {status.items_dead_lettered} dead-lettered")


def _status(runner: Any, shard_id: str) -> Any:
    """The runner's ShardStatus of ``shard_id``, or None when the runner does not know it."""
    import ray

    try:
        return ray.get(runner.shard_status.remote(shard_id))
    except ray.exceptions.RayTaskError as exc:
        if isinstance(exc.cause, KeyError):
            return None
        raise


SUMMARY_LABELS = {"items_in": "input items", "kept": "kept", "near_duplicates": "near-duplicates removed",
                  "filtered": "filtered (quality, language, ...)", "dead_lettered": "dead-lettered (bad input)",
                  "duplicate_ids": "duplicate ids in output (must be 0)", "shards": "shards", "wall_s": "wall time (s)",
                  "throughput_items_per_s": "throughput (items/s)"}


def summary_table(summary: RunSummary) -> list[dict[str, Any]]:
    """Rows of the run summary's Prefect table artifact (``SUMMARY_LABELS``)."""
    data = summary.to_dict()
    return [{"figure": label, "value": round(data[k], 2) if isinstance(data[k], float) else data[k]} for k, label in SUMMARY_LABELS.items()]


def count_near_duplicates(out_dir: Path) -> int:
    """Rows of the committed data table dropped as near-duplicates (``NEAR_DUPLICATE_MARKS``)."""
    count = 0
    for path in sorted((out_dir / "data").glob("shard=*.parquet")):
        table = pq.read_table(path)
        if DROP in table.column_names:
            count += sum(1 for r in table.column(DROP).to_pylist() if r and r.startswith(NEAR_DUPLICATE_MARKS))
    return count
