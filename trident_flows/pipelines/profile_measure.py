"""How the profilers measure an operator's batch and record where, when and at what load they did.

Shared by ``profile_documents``, ``profile_rapidocr`` and ``profile_video``. Contract:
- ``PeakRss``: a context that samples the RSS of this process and its children every 2 ms;
  ``peak`` is the highest seen, ``cpu_s`` the CPU seconds its own sampling thread took (to be
  subtracted from a measured operator's, which ``cpu_seconds`` would otherwise include).
- ``cpu_seconds()``: CPU seconds of this process and its reaped children, from getrusage
  (microseconds, not ``os.times``' 10 ms ticks).
- ``measured_here()``: the ``machine`` and ``date`` entries of a profile's ``measured_on``.
- ``LoadWatch``: the 1-minute load average when entered and sampled while inside; ``run_load``
  the ``measured_on["load"]`` entry (before the run: ``ALONE_LOAD_BEFORE`` where the wrapper of
  heavy runs set it), ``entry_record`` one ``measured_on["entries"]`` value (machine, date, load
  before and during, and the batches measured by regime), ``warn_if_loaded`` a console warning
  when the machine is busier than its cores at the start.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import resource
import statistics
import threading
import time
from typing import Any, Iterable, Mapping

LOAD_INTERVAL_S = 5.0  # load average sampled this often while an operator is measured


class PeakRss:
    """Samples the RSS of this process and its children every 2 ms while active; ``cpu_s``: the CPU seconds its
    sampling thread took (about a third of a core: subtracted from the operator's CPU seconds)."""

    def __init__(self) -> None:
        import psutil

        self._proc = psutil.Process()
        self.peak = 0
        self.cpu_s = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def rss(self) -> int:
        total = self._proc.memory_info().rss
        for child in self._proc.children(recursive=True):
            try:
                total += child.memory_info().rss
            except Exception:
                pass
        return total

    def __enter__(self) -> "PeakRss":
        self.peak = self.rss()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        start = time.thread_time()
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, self.rss())
        self.cpu_s = time.thread_time() - start

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()
        self.peak = max(self.peak, self.rss())


def cpu_seconds() -> float:
    """CPU seconds of this process and its reaped children (getrusage: microseconds, not os.times' 10 ms ticks,
    so a batch that skips its work shows what it costs)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def measured_here() -> dict[str, str]:
    """The ``machine`` and ``date`` entries of a profile's ``measured_on``: this machine, now (UTC)."""
    return {"machine": (f"{platform.node()} ({platform.machine()}, {os.cpu_count()} CPUs, "
                        f"{platform.python_implementation()} {platform.python_version()})"),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}


class LoadWatch:
    """The 1-minute load average when entered and every ``LOAD_INTERVAL_S`` while inside (a daemon thread)."""

    def __init__(self, interval_s: float = LOAD_INTERVAL_S) -> None:
        self._interval_s = interval_s
        self.before = 0.0
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self) -> "LoadWatch":
        self.before = os.getloadavg()[0]
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        if not self.samples:
            self.samples.append(os.getloadavg()[0])

    def during(self) -> dict[str, Any]:
        return {"median": round(statistics.median(self.samples), 2), "max": round(max(self.samples), 2), "samples": len(self.samples)}


def run_load(watch: LoadWatch, env: Any = os.environ) -> dict[str, Any]:
    """The ``load`` entry of a profile's ``measured_on``: the load average before the whole run (``ALONE_LOAD_BEFORE``,
    what the wrapper of heavy runs read, where set) and during it, the cores, and whether it ran alone."""
    given = env.get("ALONE_LOAD_BEFORE")
    before, source = (float(given), "ALONE_LOAD_BEFORE") if given else (watch.before, "getloadavg")
    return {"before": round(before, 2), "before_from": source, "during": watch.during(), "cpus": os.cpu_count(),
            "alone": env.get("ALONE") == "1", "overloaded": before > (os.cpu_count() or 1)}


def entry_record(watch: LoadWatch, samples: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """What ``measured_on["entries"]`` records of one operator and device: where, when and at what load it was measured,
    and the batches it was measured on (``samples``: each with ``regime``, ``items`` and ``features``) by regime
    (count, items and summed features)."""
    inputs: dict[str, dict[str, float]] = {}
    for s in samples:
        row = inputs.setdefault(s["regime"], {"batches": 0, "items": 0})
        row["batches"] += 1
        row["items"] += s["items"]
        for f, v in s["features"].items():
            row[f] = round(row.get(f, 0.0) + float(v), 2)
    return {**measured_here(), "load_before": round(watch.before, 2), "load_during": watch.during(), "inputs": inputs}


def warn_if_loaded(watch: LoadWatch, console: Any) -> None:
    """Say so when the machine is busier than its cores at the start: the profile records it, but its seconds suffer."""
    if watch.before >= (os.cpu_count() or 1):
        console.print(f"WARNING: load average {watch.before:.2f} on {os.cpu_count()} cores at the start of this profile: its "
                      f"timings share the machine (recorded in measured_on.load); profile on a quiet machine")
