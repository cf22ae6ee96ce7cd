"""Resumable runs into one output directory: the run manifest, shard commit markers, and feeding
only the shards that are not committed yet.

Contract:
- ``plan_shards(rows, shard_size)`` cuts the input, in order, into shards named by position
  (``shard-00000``, ...), the naming of the ``document-curation`` flow.
- ``open_run(out_dir, pipeline, shards, restart=..., on_mismatch=...)`` returns a ``ResumePlan``
  (pending and committed shards). ``OUT/_run.json`` names the pipeline, its input's fingerprint
  and the shards; another pipeline, input or sharding raises ``RunMismatch``
  (``on_mismatch="refuse"``) or clears the directory (``"restart"``); ``restart=True`` clears
  first. A shard is committed when ``OUT/_committed/shard=<id>.json`` exists; a shard's files
  without a marker are removed, so it is run again, never duplicated.
- ``ShardFeeder(shards)`` hands the pending shards to a runner with ``external_input=True``
  (``pump(handle)``, a bounded number of items in flight), then closes its input.
- ``stop_on_first_interrupt()``: later Ctrl-Cs during shutdown are ignored, so cleanup finishes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import signal
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from trident_flows.core.state import RuntimeConfigError

MANIFEST = "_run.json"
COMMITTED = "_committed"
STAGING = "_staging"
OUTPUT_DIRS = ("data", "dead_letter")
# Input in flight from the driver to the runner (handed over, not yet admitted to its first
# queue): at least two shards, so the queue never runs dry between shards, and up to this many
# items, so the driver (which checks every poll, 0.5 s) can feed 2,000 items/s without shipping
# the whole input at once.
MIN_OUTSTANDING_SHARDS = 2
MAX_OUTSTANDING_ITEMS = 1024
# Default shard size: about this many shards per run (a Ctrl-C loses at most the in-flight ones),
# but never more than the runner's implicit shard size, and never below one item.
TARGET_SHARDS = 40
MAX_SHARD_ITEMS = 256


class RunMismatch(RuntimeConfigError):
    """The output directory holds another run (pipeline, input or sharding differ)."""


class RunInterrupted(Exception):
    """A run stopped by Ctrl-C after shutting down cleanly; the message says how to resume."""


def interrupted_message(out_dir: Path | str) -> str:
    """What a Ctrl-C'd run kept and how to resume it."""
    out = Path(out_dir)
    try:
        manifest = RunManifest.read(out / MANIFEST)
    except (OSError, ValueError, KeyError, TypeError):
        return f"interrupted before any shard was planned in {out}; nothing to resume"
    done = len(committed_shards(out) & {sid for sid, _ in manifest.shards})
    return (f"interrupted: {done} of {len(manifest.shards)} shards committed in {out} (in-flight batches abandoned); "
            "run the same command again to resume, or add --restart to start over")


@dataclass(frozen=True)
class InputShard:
    """A slice of the input: its id and rows (each row has a unique ``id``)."""

    shard_id: str
    rows: tuple[Mapping[str, Any], ...]


def default_shard_size(items: int) -> int:
    """Shard size for a run of ``items`` inputs (see ``TARGET_SHARDS``)."""
    return max(1, min(MAX_SHARD_ITEMS, math.ceil(items / TARGET_SHARDS)))


def plan_shards(rows: Iterable[Mapping[str, Any]], shard_size: int) -> list[InputShard]:
    """Cut the input rows into shards of ``shard_size`` rows named by position."""
    if not isinstance(shard_size, int) or shard_size < 1:
        raise RuntimeConfigError(f"shard_size must be an integer >= 1, got {shard_size!r}")
    rows = list(rows)
    return [InputShard(f"shard-{k // shard_size:05d}", tuple(rows[k:k + shard_size])) for k in range(0, len(rows), shard_size)]


def _canonical(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return {"ndarray": hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest(), "shape": value.shape}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, bytes):
        return {"bytes": hashlib.sha256(value).hexdigest()}
    return str(value) if not isinstance(value, (int, float, str, bool, type(None), list, tuple, dict)) else value


def fingerprint(shards: Sequence[InputShard]) -> str:
    """sha256 of every input row's content, in order (a changed, added or removed input changes it)."""
    digest = hashlib.sha256()
    for shard in shards:
        for row in shard.rows:
            digest.update(json.dumps({str(k): _canonical(v) for k, v in row.items()}, sort_keys=True, default=_canonical).encode())
            digest.update(b"\n")
    return digest.hexdigest()


@dataclass(frozen=True)
class RunManifest:
    """What an output directory holds: the pipeline, its input's fingerprint, and the shards."""

    pipeline: str
    input_fingerprint: str
    items: int
    shard_size: int
    shards: tuple[tuple[str, int], ...]

    @staticmethod
    def of(pipeline: str, shards: Sequence[InputShard]) -> "RunManifest":
        size = max((len(s.rows) for s in shards), default=1)
        return RunManifest(pipeline, fingerprint(shards), sum(len(s.rows) for s in shards), size,
                           tuple((s.shard_id, len(s.rows)) for s in shards))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["shards"] = [list(s) for s in self.shards]
        return data

    @staticmethod
    def read(path: Path) -> "RunManifest":
        data = json.loads(path.read_text())
        return RunManifest(str(data["pipeline"]), str(data["input_fingerprint"]), int(data["items"]), int(data["shard_size"]),
                           tuple((str(a), int(b)) for a, b in data["shards"]))

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        os.replace(tmp, path)

    def difference(self, other: "RunManifest") -> str:
        """What differs from ``other`` (the directory's manifest), in words; '' when the same run."""
        if self.pipeline != other.pipeline:
            return f"it holds pipeline {other.pipeline!r}, this run is {self.pipeline!r}"
        if self.input_fingerprint != other.input_fingerprint or self.items != other.items:
            return (f"it holds a run over a different input ({other.items} items, fingerprint {other.input_fingerprint[:12]}), "
                    f"this run has {self.items} items (fingerprint {self.input_fingerprint[:12]})")
        if self.shards != other.shards:
            return f"it was cut into {len(other.shards)} shards of up to {other.shard_size}, this run into " \
                   f"{len(self.shards)} of up to {self.shard_size}"
        return ""


def marker_path(out_dir: Path | str, shard_id: str) -> Path:
    return Path(out_dir) / COMMITTED / f"shard={shard_id}.json"


def write_marker(out_dir: Path | str, shard_id: str, counts: Mapping[str, int]) -> None:
    """Mark a shard committed (called by the sink after its partition files are in place)."""
    path = marker_path(out_dir, shard_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(json.dumps(dict(counts)) + "\n")
    os.replace(tmp, path)


def remove_marker(out_dir: Path | str, shard_id: str) -> None:
    marker_path(out_dir, shard_id).unlink(missing_ok=True)


def committed_shards(out_dir: Path | str) -> set[str]:
    """Ids of the shards whose commit finished (their marker exists)."""
    folder = Path(out_dir) / COMMITTED
    return {p.name.removeprefix("shard=").removesuffix(".json") for p in folder.glob("shard=*.json")} if folder.exists() else set()


def _partition_files(out: Path) -> list[Path]:
    return [p for sub in OUTPUT_DIRS for p in sorted((out / sub).glob("*.parquet"))] if out.exists() else []


def clear_run(out_dir: Path | str) -> None:
    """Remove a run's outputs, markers, staging parts and manifest (inputs cached under OUT are kept)."""
    out = Path(out_dir)
    for sub in (*OUTPUT_DIRS, COMMITTED, STAGING):
        shutil.rmtree(out / sub, ignore_errors=True)
    (out / MANIFEST).unlink(missing_ok=True)


@dataclass(frozen=True)
class ResumePlan:
    """An output directory made ready: ``pending`` shards to run, ``committed`` ids to skip."""

    out_dir: str
    manifest: RunManifest
    pending: tuple[InputShard, ...]
    committed: frozenset[str]
    restarted: str = ""  # why an earlier run's output was cleared ('' when it was not)

    @property
    def shards_total(self) -> int:
        return len(self.manifest.shards)

    @property
    def shards_skipped(self) -> int:
        return len(self.committed)

    @property
    def items_skipped(self) -> int:
        return sum(n for sid, n in self.manifest.shards if sid in self.committed)

    def message(self) -> str:
        """The console line about resuming ('' for a fresh run)."""
        if not self.committed:
            return ""
        return f"resuming: {self.shards_skipped} of {self.shards_total} shards already committed in {self.out_dir}"


def open_run(out_dir: Path | str, pipeline: str, shards: Sequence[InputShard], *, restart: bool = False,
             on_mismatch: str = "refuse", restart_hint: str = "--restart") -> ResumePlan:
    """Make ``out_dir`` ready for this run (see the module docstring)."""
    if on_mismatch not in ("refuse", "restart"):
        raise ValueError(f"on_mismatch must be 'refuse' or 'restart', got {on_mismatch!r}")
    out = Path(out_dir)
    manifest = RunManifest.of(pipeline, shards)
    path = out / MANIFEST
    reason = "asked to restart" if restart else ""
    if not restart and path.exists():
        try:
            old = RunManifest.read(path)
        except (ValueError, KeyError, TypeError) as exc:
            raise RunMismatch(f"{path} is not a readable run manifest ({exc}); use another --out or {restart_hint} to discard "
                              "that directory's outputs") from exc
        difference = manifest.difference(old)
        if difference:
            if on_mismatch == "refuse":
                raise RunMismatch(f"{out} holds another run: {difference}; use another --out, or {restart_hint} to discard it")
            reason = difference
    elif not restart and _partition_files(out):
        if on_mismatch == "refuse":
            raise RunMismatch(f"{out} holds outputs of a run without a run manifest ({len(_partition_files(out))} files); "
                              f"use another --out, or {restart_hint} to discard them")
        reason = "outputs without a run manifest"
    if reason:
        clear_run(out)
    shutil.rmtree(out / STAGING, ignore_errors=True)  # parts of shards an earlier run did not commit
    manifest.write(path)
    ids = {s.shard_id for s in shards}
    committed = committed_shards(out) & ids
    for p in _partition_files(out):
        if p.stem.removeprefix("shard=") not in committed:
            p.unlink()  # half a commit, or a shard this manifest does not have
    for stale in committed_shards(out) - ids:
        remove_marker(out, stale)
    pending = tuple(s for s in shards if s.shard_id not in committed)
    return ResumePlan(str(out), manifest, pending, frozenset(committed), restarted=reason if reason and not restart else "")


class ShardFeeder:
    """Feeds pending shards to a runner with ``external_input=True`` (see the module docstring)."""

    def __init__(self, shards: Sequence[InputShard]) -> None:
        self._queue: Iterator[InputShard] = iter(shards)
        self._outstanding: dict[Any, int] = {}  # add_shard call -> its items
        self._exhausted = False
        self.closed = False

    def pump(self, handle: Any) -> None:
        """Hand over shards while little input is in flight (see the constants); close the input at the end.
        Raises the runner's error if adding a shard failed."""
        import ray

        if self.closed:
            return
        if self._outstanding:
            ready, _ = ray.wait(list(self._outstanding), num_returns=len(self._outstanding), timeout=0)
            ray.get(ready)
            for ref in ready:
                del self._outstanding[ref]
        while not self._exhausted and (len(self._outstanding) < MIN_OUTSTANDING_SHARDS
                                       or sum(self._outstanding.values()) < MAX_OUTSTANDING_ITEMS):
            shard = next(self._queue, None)
            if shard is None:
                self._exhausted = True
                break
            self._outstanding[handle.add_shard.remote(shard.shard_id, [dict(r) for r in shard.rows])] = len(shard.rows)
        if self._exhausted and not self._outstanding:
            ray.get(handle.close_input.remote())
            self.closed = True


@contextlib.contextmanager
def stop_on_first_interrupt(notice: Callable[[str], None]) -> Iterator[None]:
    """The first SIGINT raises ``KeyboardInterrupt``; later ones print ``notice`` and are ignored, so the
    shutdown the first one started (runner stop, ``ray.shutdown``) is not cut short."""
    previous = signal.getsignal(signal.SIGINT)
    interrupted = False

    def handler(signum: int, frame: Any) -> None:
        nonlocal interrupted
        if interrupted:
            notice("still stopping (committed shards are kept); please wait")
            return
        interrupted = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
