"""The simulated input stream: input items as rows of a float matrix, made lazily.

Contract:
- A row is ``[source index, id crc, id length, attempts, memory_scale, feature_1 .. feature_k]``
  (columns ``SRC``, ``ID_CRC``, ``ID_LEN``, ``ATTEMPTS``, ``MEMSCALE``, then ``FEATURES``); the id
  columns are the id as the live runtime names it (``sim.ids``), so filters and splitters pick
  exactly the rows the emulated operators pick.
- ``Stream.from_rows(rows, features)`` takes the rows an emulated pipeline's source yields (one
  stream for simulator and live runtime); ``Stream.generate(workloads, regimes, items, seed)`` draws
  the same distributions vectorised, block by block (``items=None``: without end);
  ``Stream.from_trace(path)`` reads a per-item feature trace (CSV or Parquet).
- ``take(n)``: up to ``n`` next rows; ``regime_of(source index)``: an item's regime;
  ``uniform_memory``: no row so far has a ``memory_scale`` other than 1.
"""

from __future__ import annotations

import bisect
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from trident_flows.pipelines.emulated import MEMORY_SCALE, parse_regimes
from trident_flows.runtime.spec import ID
from trident_flows.sim.ids import id_columns, item_id_columns

SRC, ID_CRC, ID_LEN, ATTEMPTS, MEMSCALE = 0, 1, 2, 3, 4
FEATURES = 5
_CHUNK = 65536


class Stream:
    def __init__(self, features: Sequence[str], blocks: Iterable[tuple[str, int, np.ndarray | None]], items: int | None,
                 workloads: Mapping[str, Mapping[str, float]] | None = None, seed: int = 0, shape: float = 4.0) -> None:
        self.features = tuple(features)
        self.items = items
        self._blocks = iter(blocks)
        self._pending = self._chunks()
        self._workloads = workloads or {}
        self._rng = np.random.default_rng(seed)
        self._shape = shape
        self._buf = np.zeros((0, FEATURES + len(self.features)))
        self.taken = 0
        self._made = 0
        self._starts: list[int] = []
        self._regimes: list[str] = []
        self.exhausted = False
        self._spiky = False

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]], features: Sequence[str]) -> "Stream":
        rows = list(rows)
        data = np.zeros((len(rows), FEATURES + len(features)))
        data[:, SRC] = np.arange(len(rows))
        data[:, MEMSCALE] = [float(r.get(MEMORY_SCALE, 1.0)) for r in rows]
        data[:, ID_CRC], data[:, ID_LEN] = id_columns(str(r[ID]) if r.get(ID) is not None else _item_id(k) for k, r in enumerate(rows))
        for j, f in enumerate(features):
            data[:, FEATURES + j] = [float(r.get(f, 0.0) or 0.0) for r in rows]
        regimes = [str(r.get("regime", "default")) for r in rows]
        blocks: list[tuple[str, int, np.ndarray | None]] = []
        start = 0
        for k in range(1, len(rows) + 1):
            if k == len(rows) or regimes[k] != regimes[start]:
                blocks.append((regimes[start], k - start, data[start:k]))
                start = k
        return cls(features, blocks, len(rows))

    @classmethod
    def generate(cls, workloads: Mapping[str, Mapping[str, float]], regimes: str, items: int | None, features: Sequence[str],
                 seed: int = 0) -> "Stream":
        schedule = parse_regimes(regimes)
        unknown = [r for r, _ in schedule if r not in workloads]
        if unknown:
            raise ValueError(f"unknown regime(s) {unknown} in {regimes!r}; this profile has {sorted(workloads)}")

        def blocks() -> Iterable[tuple[str, int, None]]:
            left = items
            while left is None or left > 0:
                for regime, count in schedule:
                    take = count if left is None else min(count, left)
                    yield regime, take, None
                    if left is not None:
                        left -= take
                        if left == 0:
                            return

        return cls(features, blocks(), items, workloads, seed)

    @classmethod
    def from_trace(cls, path: Path, features: Sequence[str]) -> "Stream":
        import pandas as pd

        path = Path(path)
        frame = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
        missing = [f for f in features if f not in frame.columns]
        if missing:
            raise ValueError(f"trace {path} lacks feature column(s) {missing}; the pipeline's features are {list(features)}")
        return cls.from_rows(frame.to_dict("records"), features)

    # ------------------------------------------------------------------ reading
    def _make(self, regime: str, count: int, data: np.ndarray | None) -> np.ndarray:
        if data is None:
            data = np.zeros((count, FEATURES + len(self.features)))
            data[:, SRC] = np.arange(self._made, self._made + count)
            data[:, MEMSCALE] = 1.0
            for f, mean in self._workloads.get(regime, {}).items():
                if f in self.features and mean > 0:
                    data[:, FEATURES + self.features.index(f)] = np.round(self._rng.gamma(self._shape, mean / self._shape, count), 3)
            data[:, ID_CRC], data[:, ID_LEN] = item_id_columns(self._made, count)
        else:
            data = data.copy()
            self._spiky = self._spiky or bool((data[:, MEMSCALE] != 1.0).any())
        self._starts.append(self._made)
        self._regimes.append(regime)
        self._made += count
        return data

    def _chunks(self) -> Iterator[tuple[str, int, np.ndarray | None]]:
        for regime, count, data in self._blocks:
            for lo in range(0, count, _CHUNK):
                yield regime, min(_CHUNK, count - lo), None if data is None else data[lo:lo + _CHUNK]

    def take(self, n: int) -> np.ndarray:
        # one chunk at a time, as rows are needed: making a whole block at once (a 20-minute block on 8
        # nodes is 1.6M rows) and growing the buffer chunk by chunk copied it ~25 times (5% of a run)
        while len(self._buf) < n and not self.exhausted:
            chunk = next(self._pending, None)
            if chunk is None:
                self.exhausted = True
                break
            self._buf = np.concatenate([self._buf, self._make(*chunk)])
        out, self._buf = self._buf[:n], self._buf[n:]
        self.taken += len(out)
        return out

    @property
    def done(self) -> bool:
        return self.exhausted and len(self._buf) == 0

    def regime_of(self, source: int) -> str:
        k = bisect.bisect_right(self._starts, source) - 1
        return self._regimes[k] if k >= 0 else ""

    @property
    def uniform_memory(self) -> bool:
        """No row so far has a ``memory_scale`` other than 1 (a batch's bytes are then its feature sums')."""
        return self._spiky is False


def _item_id(k: int) -> str:
    """The id ``synthetic_rows`` gives input item ``k``."""
    return f"item-{k:07d}"
