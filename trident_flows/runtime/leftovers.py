"""Nothing left running: stop the Ray processes a command started when it ends, normally or on Ctrl-C.

Contract:
- ``RayProcessGuard().start()`` samples this process's descendants every ``interval_s`` while a
  command runs and remembers the Ray ones that were not there when it started (``is_ray_process``:
  workers ``ray::...``, raylet, GCS, dashboard, log monitor; a Ray cluster the caller already ran,
  e.g. a test session's, is never touched). ``finish()`` takes a last sample, waits up to ``grace_s`` for them to
  exit (``ray.shutdown`` normally ends them), then SIGKILLs the survivors and returns their
  descriptions. A survivor is recognised by pid *and* creation time, so a recycled pid is never
  killed, and only processes that descended from this one are ever touched.
- Why it is needed: a Ray worker exits when its raylet goes away only if no non-daemon thread
  keeps its Python process alive; cosmos-xenna's ``NodeResourceMonitor`` runs such a thread and
  its ``StageWorker`` can survive ``ray.kill``, so both were left re-parented to init after
  ``bench closed-loop``.
- ``ray_descendants(pid)``: the Ray processes below ``pid`` now (for tests and benchmarks).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import psutil

_RAY_NAMES = ("raylet", "gcs_server", "ray::", "dashboard", "log_monitor", "monitor.py", "runtime_env_agent", "ray/_private")


def is_ray_process(proc: psutil.Process) -> bool:
    """A process Ray started: a worker (``ray::...`` title) or one of Ray's node services."""
    try:
        text = proc.name() + " " + " ".join(proc.cmdline()[:3])
    except (psutil.Error, OSError):
        return False
    return any(name in text for name in _RAY_NAMES)


@dataclass(frozen=True)
class ProcessRecord:
    pid: int
    create_time: float
    name: str

    def alive(self) -> bool:
        try:
            proc = psutil.Process(self.pid)
            return proc.create_time() == self.create_time and proc.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def describe(self) -> str:
        return f"{self.name} (pid {self.pid})"


def ray_descendants(pid: int | None = None) -> list[ProcessRecord]:
    """The Ray processes below ``pid`` (default: this process) now."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    found = []
    for proc in children:
        if is_ray_process(proc):
            try:
                found.append(ProcessRecord(proc.pid, proc.create_time(), proc.name()))
            except psutil.Error:
                continue
    return found


class RayProcessGuard:
    """Remembers the Ray processes below this one and stops the survivors at the end (see module docstring)."""

    def __init__(self, interval_s: float = 1.0, grace_s: float = 10.0) -> None:
        self.interval_s = interval_s
        self.grace_s = grace_s
        self.seen: dict[tuple[int, float], ProcessRecord] = {}
        self._before: set[tuple[int, float]] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        for record in ray_descendants():
            key = (record.pid, record.create_time)
            if key not in self._before:
                self.seen[key] = record

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def start(self) -> "RayProcessGuard":
        self._before = {(r.pid, r.create_time) for r in ray_descendants()}
        self._thread = threading.Thread(target=self._loop, name="ray-process-guard", daemon=True)
        self._thread.start()
        return self

    def finish(self) -> list[str]:
        """Stop sampling; kill the Ray processes still alive after ``grace_s``; return what was killed."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 1.0)
        self.sample()
        deadline = time.monotonic() + self.grace_s
        alive = [r for r in self.seen.values() if r.alive()]
        while alive and time.monotonic() < deadline:
            time.sleep(0.2)
            alive = [r for r in alive if r.alive()]
        killed = []
        for record in alive:
            try:
                psutil.Process(record.pid).kill()
                killed.append(record.describe())
            except psutil.Error:
                continue
        return killed

    def __enter__(self) -> "RayProcessGuard":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.finish()
