"""Where and how a benchmark ran: the ``provenance`` object of every benchmark report.

Contract:
- ``ProvenanceRecorder.start()`` (the CLI's ``bench`` command, before ``run``) reads the git state, the
  date, the command line, the machine and the load average before the run, then samples the load average
  on a daemon thread; a start above the core count prints ``overload_warning`` first. ``finish()`` stops
  the sampler and returns the ``Provenance``.
- ``Provenance.at_write_time()`` is what can be recorded without a recorder (``recorded="write"``).
- ``git_state(repo)``: the commit and whether tracked files differ from it; where git is missing or the
  directory is no git checkout, ``commit`` and ``dirty`` are ``None`` and ``commit_note`` says why
  (nothing here raises for it). ``code_repo()`` is the checkout holding this package's source, or ``None``.
- ``ALONE=1`` in the environment marks a run as ``alone``.
- ``describe(provenance)``: one line for a human from the JSON form (``Provenance.to_dict()``).
"""

from __future__ import annotations

import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

INTERVAL_S = 10.0
RESULTS_DIR = "bench-results"  # never counts as uncommitted code


def load_average() -> float:
    """The 1-minute load average."""
    return os.getloadavg()[0]


def git(repo: Path, *args: str) -> str | None:
    """``git -C repo ARGS`` stdout stripped, or ``None`` where git is missing or exits non-zero."""
    try:
        done = subprocess.run(["git", "--no-optional-locks", "-C", str(repo), *args], capture_output=True, text=True, timeout=60)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


@dataclass(frozen=True)
class GitState:
    commit: str | None
    dirty: bool | None
    commit_note: str | None  # why commit is None


def git_state(repo: Path | None) -> GitState:
    """The commit of ``repo`` (``git rev-parse HEAD``) and whether its tracked files differ from it (``dirty``: staged
    or not; untracked files and ``bench-results/`` ignored). Where git is missing or the directory is no git checkout,
    ``commit`` and ``dirty`` are ``None`` and ``commit_note`` says why."""
    if repo is None:
        return GitState(None, None, "the code does not run from a git checkout")
    if shutil.which("git") is None:
        return GitState(None, None, "git is not installed")
    top = git(repo, "rev-parse", "--show-toplevel")
    if top is None:
        return GitState(None, None, f"{repo} is not in a git checkout")
    commit = git(Path(top), "rev-parse", "--verify", "HEAD")
    if commit is None:
        return GitState(None, None, f"{top} has no commit yet")
    changes = git(Path(top), "status", "--porcelain", "--untracked-files=no", "--", ".", f":(exclude){RESULTS_DIR}")
    return GitState(commit, None if changes is None else bool(changes), None)


def code_repo() -> Path | None:
    """The git checkout the ``trident_flows`` package running here is tracked in, or ``None`` (an installed wheel)."""
    import trident_flows

    package = Path(trident_flows.__file__).resolve()
    top = git(package.parent, "rev-parse", "--show-toplevel")
    if top is None or git(Path(top), "ls-files", "--error-unmatch", "--", str(package)) is None:
        return None
    return Path(top)


@dataclass(frozen=True)
class LoadDuring:
    """The load averages sampled while the benchmark ran (``None`` without samples)."""

    median: float | None
    max: float | None
    samples: int

    @classmethod
    def of(cls, samples: Sequence[float]) -> LoadDuring:
        if not samples:
            return cls(None, None, 0)
        return cls(round(statistics.median(samples), 2), round(max(samples), 2), len(samples))


class LoadSampler:
    """Samples ``load()`` every ``interval_s`` seconds on a daemon thread until ``stop()``."""

    def __init__(self, interval_s: float = INTERVAL_S, load: Callable[[], float] = load_average) -> None:
        self._interval_s, self._load = interval_s, load
        self._samples: list[float] = []
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="bench-load-sampler", daemon=True)

    def start(self) -> LoadSampler:
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stopped.wait(self._interval_s):
            self._samples.append(self._load())

    def stop(self) -> LoadDuring:
        self._stopped.set()
        self._thread.join()
        return LoadDuring.of(self._samples)


@dataclass(frozen=True)
class Provenance:
    """Where and how one benchmark ran (the report's ``provenance``): git state, date, command line, machine, the
    load average before (``load_before_from``), during and after the run, and whether it ran ``alone``."""

    recorded: str  # "run": from a recorder started before the run; "write": at write time only
    commit: str | None
    commit_note: str | None
    dirty: bool | None
    date_utc: str
    command: tuple[str, ...]
    hostname: str
    platform: str
    python: str
    processor: str
    cpus: int
    memory_gib: float
    load_before: float | None
    load_before_from: str | None  # "ALONE_LOAD_BEFORE" or "getloadavg"
    load_during: LoadDuring | None
    load_after: float
    wall_s: float | None
    time_scale: float | None
    alone: bool
    overloaded_at_start: bool | None

    @classmethod
    def at_write_time(cls, env: Mapping[str, str] = os.environ) -> Provenance:
        """What can be recorded without a recorder (``write_report`` called directly): ``recorded="write"``, no load
        before or during."""
        return _provenance("write", git_state(code_repo()), time.time(), tuple(sys.argv), None, None, None,
                           load_average(), None, env)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["command"] = list(self.command)
        return out


def overload_warning(load_before: float, cpus: int) -> str:
    return (f"WARNING: load average {load_before:.2f} above the {cpus} cores at the start of this benchmark: its timings share "
            f"the machine (recorded as provenance.overloaded_at_start)")


class ProvenanceRecorder:
    """Records a benchmark's provenance from before its run to its end, sampling the load average every ``interval_s``
    seconds on a daemon thread."""

    def __init__(self, git_now: GitState, started: float, command: tuple[str, ...], load_before: float,
                 load_before_from: str, load: Callable[[], float], interval_s: float, env: Mapping[str, str]) -> None:
        self._git, self._started, self._command = git_now, started, command
        self._load_before, self._load_before_from = load_before, load_before_from
        self._load, self._sampler, self._env = load, LoadSampler(interval_s, load), env

    @classmethod
    def start(cls, command: Sequence[str] | None = None, *, repo: Path | None = None, interval_s: float = INTERVAL_S,
              env: Mapping[str, str] = os.environ, say: Callable[[str], None] = lambda line: print(line, flush=True),
              load: Callable[[], float] = load_average) -> ProvenanceRecorder:
        """Read the load and git state now and start sampling; ``repo`` defaults to ``code_repo()``; ``say``
        prints the overload warning (``overload_warning``, the first line of output when the load average before is
        above the core count). The load before is ``ALONE_LOAD_BEFORE`` when the wrapper of heavy runs exported it,
        else ``os.getloadavg()[0]`` (``_load_before``)."""
        load_before, source = _load_before(env, load)
        if load_before > _cpus():
            say(overload_warning(load_before, _cpus()))
        recorder = cls(git_state(repo if repo is not None else code_repo()), time.time(),
                       tuple(command if command is not None else sys.argv), load_before, source, load, interval_s, env)
        recorder._sampler.start()
        return recorder

    def finish(self) -> Provenance:
        """Stop sampling and return the provenance (the load after is read now)."""
        during = self._sampler.stop()
        return _provenance("run", self._git, self._started, self._command, self._load_before, self._load_before_from,
                           during, self._load(), time.time() - self._started, self._env)


def _load_before(env: Mapping[str, str], load: Callable[[], float]) -> tuple[float, str]:
    """``ALONE_LOAD_BEFORE`` where exported (a malformed one is a ``ValueError`` saying what to export), else ``load()``."""
    given = env.get("ALONE_LOAD_BEFORE")
    if given is None:
        return load(), "getloadavg"
    try:
        value = float(given)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"ALONE_LOAD_BEFORE={given!r} is no load average: export the 1-minute load average before the run "
                         f"(a number >= 0, e.g. ALONE_LOAD_BEFORE=0.42), or unset it")
    return value, "ALONE_LOAD_BEFORE"


def _cpus() -> int:
    return os.cpu_count() or 1


def _provenance(recorded: str, git_now: GitState, started: float, command: tuple[str, ...], load_before: float | None,
                load_before_from: str | None, during: LoadDuring | None, load_after: float, wall_s: float | None,
                env: Mapping[str, str]) -> Provenance:
    import psutil

    cpus = _cpus()
    return Provenance(
        recorded=recorded, commit=git_now.commit, commit_note=git_now.commit_note, dirty=git_now.dirty,
        date_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)), command=command,
        hostname=platform.node(), platform=platform.platform(), python=sys.version.split()[0],
        processor=platform.processor() or platform.machine(), cpus=cpus,
        memory_gib=round(psutil.virtual_memory().total / 2**30, 1),
        load_before=None if load_before is None else round(load_before, 2), load_before_from=load_before_from,
        load_during=during, load_after=round(load_after, 2), wall_s=None if wall_s is None else round(wall_s, 1),
        time_scale=None, alone=env.get("ALONE") == "1",
        overloaded_at_start=None if load_before is None else load_before > cpus)


def describe(provenance: Mapping[str, Any]) -> str:
    """One line for a human from a report's ``provenance`` (as its JSON holds it)."""
    commit = provenance.get("commit")
    parts = [f"commit {commit[:10]}" + {True: " (dirty tree)", False: " (clean)"}.get(provenance.get("dirty"), "")
             if commit else f"no commit ({provenance.get('commit_note')})",
             f"started {provenance.get('date_utc')}"]
    if provenance.get("wall_s") is not None:
        parts.append(f"ran {provenance['wall_s'] / 60:.1f} min")
    during = provenance.get("load_during") or {}
    parts.append(f"load before {_load(provenance.get('load_before'))}"
                 + (" (ALONE_LOAD_BEFORE)" if provenance.get("load_before_from") == "ALONE_LOAD_BEFORE" else "")
                 + (f", during median {_load(during.get('median'))} max {_load(during.get('max'))} ({during.get('samples', 0)} samples)"
                    if provenance.get("load_during") is not None else ", during not sampled")
                 + f", after {_load(provenance.get('load_after'))}")
    parts.append(f"{provenance.get('cpus')} cores, {provenance.get('memory_gib')} GiB")
    if provenance.get("overloaded_at_start"):
        parts.append("OVERLOADED at start")
    parts.append("alone" if provenance.get("alone") else "not alone")
    if provenance.get("time_scale") is not None:
        parts.append(f"time scale {provenance['time_scale']:g}")
    if provenance.get("recorded") == "write":
        parts.append("recorded at write time only")
    return "; ".join(parts)


def _load(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"
