"""What a run measured: the batch samples a policy reads, per-operator counts, the completion
history throughput windows are read from, and what the runner process itself cost.

Contract:
- ``RunMetrics.record(sample)`` numbers a ``BatchSample``; ``page(since)`` returns the samples
  numbered after ``since`` (oldest first; only the newest ``keep`` are kept) and the next cursor.
- ``completed()`` counts one row done (written or dead-lettered) in its 0.1 s bucket;
  ``rate(start, end)`` is rows done per second in ``[start, end)``; ``trim(horizon)`` forgets the
  buckets before ``horizon``.
- ``runner_bytes`` (bytes this process serialised for replicas and the writer, sent and received),
  ``bytes_from_other_nodes`` (stored batches replicas fetched from another node) and ``rows_lost``
  (rows whose stored object was lost with its node, each produced again) are counted by the
  runner; ``process()`` reports them with this process's pid, CPU seconds and peak RSS (since the
  runner started where ``peak_memory`` could reset the mark: ``peak_rss_since_start``).
- ``OpCounters``: one operator's items in/out/forwarded, errors and OOMs (``OperatorState``'s).
"""

from __future__ import annotations

import collections
import os
import resource
import time
from dataclasses import dataclass
from typing import Any

from trident_flows.core.state import SamplePage
from trident_flows.core.types import BatchSample
from trident_flows.runtime import peak_memory

# Completions are counted in buckets of 1/_BUCKETS_PER_S seconds: fine enough for the 0.5 s window a
# rolling update's throughput is read over, coarse enough to keep the history short.
_BUCKETS_PER_S = 10


@dataclass
class OpCounters:
    items_in: int = 0
    items_out: int = 0
    items_forwarded: int = 0
    errors: int = 0
    ooms: int = 0


class RunMetrics:
    """The samples, completions and process costs of one run (see the module docstring)."""

    def __init__(self, keep: int, peak_since_start: bool = False) -> None:
        self.peak_since_start = peak_since_start  # whether ``peak_memory`` could reset the high-water mark at the start
        self.samples: collections.deque[tuple[int, BatchSample]] = collections.deque(maxlen=keep)
        self.seq = 0
        self.completions: collections.deque[list] = collections.deque()  # [bucket start, rows done]
        self.runner_bytes = 0
        self.bytes_from_other_nodes = 0
        self.rows_lost = 0

    def record(self, sample: BatchSample) -> None:
        self.seq += 1
        self.samples.append((self.seq, sample))

    def page(self, since: int) -> SamplePage:
        return SamplePage(tuple(s for seq, s in self.samples if seq > since), self.seq)

    def completed(self) -> None:
        bucket = int(time.time() * _BUCKETS_PER_S) / _BUCKETS_PER_S
        if self.completions and self.completions[-1][0] == bucket:
            self.completions[-1][1] += 1
        else:
            self.completions.append([bucket, 1])

    def rate(self, start: float, end: float) -> float:
        if end <= start:
            return 0.0
        return sum(n for t, n in self.completions if start <= t < end) / (end - start)

    def trim(self, horizon: float) -> None:
        while self.completions and self.completions[0][0] < horizon:
            self.completions.popleft()

    def process(self) -> dict[str, Any]:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return {"pid": os.getpid(), "bytes_serialised": self.runner_bytes, "bytes_from_other_nodes": self.bytes_from_other_nodes,
                "rows_lost": self.rows_lost, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_bytes": peak_memory.peak_rss_bytes(),
                "peak_rss_since_start": self.peak_since_start}
