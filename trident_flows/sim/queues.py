"""An operator's bounded input queue in the simulator (the twin of the runner's ``Queue``).

Contract: rows (``workload`` matrix rows) are pushed at the back; a retried unit (a batch
that failed and was kept whole or split) goes to the front and is taken whole, never merged
with other rows (as the live runner does). ``take(n)`` returns the next unit, or up to ``n``
rows. ``oldest`` is when the oldest waiting row arrived (for the linger rule). Bounds are the
caller's: the runner checks ``n_items`` against ``queue_max_items`` before sending work here.
"""

from __future__ import annotations

import collections

import numpy as np


class SimQueue:
    def __init__(self, width: int) -> None:
        self.width = width
        self.chunks: collections.deque[np.ndarray] = collections.deque()
        self.units: collections.deque[np.ndarray] = collections.deque()
        self.n_items = 0
        self.oldest = 0.0

    def __len__(self) -> int:
        return self.n_items

    def push(self, rows: np.ndarray, now: float) -> None:
        if len(rows) == 0:
            return
        if self.n_items == 0:
            self.oldest = now
        self.chunks.append(rows)
        self.n_items += len(rows)

    def push_unit(self, unit: np.ndarray, now: float) -> None:
        if self.n_items == 0:
            self.oldest = now
        self.units.appendleft(unit)
        self.n_items += len(unit)

    def peek_size(self, n: int) -> int:
        """How many rows ``take(n)`` would return."""
        return len(self.units[0]) if self.units else min(n, self.n_items)

    def take(self, n: int, now: float) -> np.ndarray:
        if self.units:
            out = self.units.popleft()
        else:
            parts, need = [], n
            while need > 0 and self.chunks:
                head = self.chunks[0]
                if len(head) <= need:
                    parts.append(self.chunks.popleft())
                    need -= len(head)
                else:
                    parts.append(head[:need])
                    self.chunks[0] = head[need:]
                    need = 0
            out = parts[0] if len(parts) == 1 else (np.concatenate(parts) if parts else np.zeros((0, self.width)))
        self.n_items -= len(out)
        if self.n_items:
            self.oldest = now
        return out
