"""What a corpus model is made of: cited figures, the arrangement of sources in time, and feature rows.

Contract:
- ``Figure(what, value, kind, source, says)``: one number a corpus model uses, ``PUBLISHED`` (its
  page and what exactly it states), ``DERIVED`` (the arithmetic) or ``ASSUMED`` (the assumption and
  why); a model never holds an unlabelled number. ``sources_of``: every page a model's figures name.
- ``arrange``: the (source, items) blocks of a stream ingested shard by shard, one source per
  shard, shards in a source-blind order; ``mean_block_items`` follows from the mixture.
- ``lognormal_params(median=..., sigma=...)`` and the quantile helpers turn published medians,
  means and quantiles into distribution parameters.
- ``rows(blocks, draw, seed)``: a stream's input rows ``{id, regime, <features>}`` (ids as
  ``emulated.synthetic_rows`` names them, so the simulator and the emulated runtime read the same
  items). ``regime_means(rows, features)``: each source's mean item, a profile's ``workloads``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from trident_flows.runtime.spec import ID

PUBLISHED, DERIVED, ASSUMED = "published", "derived", "assumed"
_Z = NormalDist()


@dataclass(frozen=True)
class Figure:
    """One number of a corpus model and where it comes from (see the module docstring)."""

    what: str
    value: float
    kind: str
    source: str
    says: str

    def __post_init__(self) -> None:
        if self.kind not in (PUBLISHED, DERIVED, ASSUMED):
            raise ValueError(f"figure {self.what!r}: kind must be {PUBLISHED}, {DERIVED} or {ASSUMED}, not {self.kind!r}")
        if self.kind == PUBLISHED and not self.source.startswith("http"):
            raise ValueError(f"figure {self.what!r}: a published figure names the page that states it (a URL)")

    def to_dict(self) -> dict[str, Any]:
        return {"what": self.what, "value": self.value, "kind": self.kind, "source": self.source, "says": self.says}


def sources_of(figures: Sequence[Figure]) -> tuple[str, ...]:
    """The distinct pages the figures come from (published ones and those derived or assumed from a page), in order."""
    return tuple(dict.fromkeys(f.source for f in figures if f.source.startswith("http")))


# ---------------------------------------------------------------------------- distributions
def z(p: float) -> float:
    """The standard normal quantile of ``p``."""
    return _Z.inv_cdf(p)


def lognormal_params(*, median: float, sigma: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal with this median and log-sd."""
    return math.log(median), sigma


def sigma_from_quantiles(median: float, q: float, p: float) -> float:
    """The log-sd of a lognormal whose median is ``median`` and whose ``p`` quantile is ``q``."""
    return math.log(q / median) / z(p)


def median_from_mean(mean: float, sigma: float) -> float:
    """The median of the lognormal of log-sd ``sigma`` whose mean is ``mean``."""
    return mean / math.exp(sigma**2 / 2)


def lognormal_quantile(median: float, sigma: float, p: float) -> float:
    return median * math.exp(sigma * z(p))


# ---------------------------------------------------------------------------- arrangement
def mean_block_items(share: float, shard_items: int) -> float:
    """Mean items in a block of a source holding ``share`` of the items, shards of ``shard_items`` read in a source-blind order."""
    if not 0 < share < 1:
        raise ValueError(f"a source's share must be in (0, 1), got {share}")
    return shard_items / (1.0 - share)


def arrange(shares: Mapping[str, float], shard_items: int, shards: int, seed: int) -> list[tuple[str, int]]:
    """``shards`` shards of ``shard_items`` items, each of a source drawn by ``shares``, consecutive shards of one source
    merged: the (source, items) blocks of the stream.

    Every shard holds items of one source, and shards are read in an order that does not depend on their source
    (the shard order a loader shuffles). With ``q_s`` the share of items from source ``s`` and ``n`` items per
    shard, a block of ``s`` is a run of shards of geometric length, so its mean length is ``n / (1 - q_s)`` items
    (``mean_block_items``) and a block of ``s`` starts at a share ``q_s * (1 - q_s)`` of shard boundaries: the
    block lengths follow from the mixture and the shard size; nothing else picks them."""
    names = list(shares)
    p = np.array([shares[n] for n in names], dtype=float)
    if (p <= 0).any() or abs(p.sum() - 1.0) > 1e-6:
        raise ValueError(f"source shares must be positive and sum to 1, got {dict(shares)}")
    drawn = np.random.default_rng(seed).choice(len(names), size=shards, p=p)
    blocks: list[tuple[str, int]] = []
    for k in drawn:
        if blocks and blocks[-1][0] == names[k]:
            blocks[-1] = (names[k], blocks[-1][1] + shard_items)
        else:
            blocks.append((names[k], shard_items))
    return blocks


# ---------------------------------------------------------------------------- rows
Draw = Callable[[str, int, np.random.Generator], Mapping[str, np.ndarray]]


def rows(blocks: Sequence[tuple[str, int]], draw: Draw, seed: int) -> Iterator[dict[str, Any]]:
    """The input rows of the blocks, in order (module docstring)."""
    rng = np.random.default_rng(seed)
    k = 0
    for source, count in blocks:
        features = draw(source, count, rng)
        for i in range(count):
            row: dict[str, Any] = {ID: f"item-{k:07d}", "regime": source}
            row.update({f: float(v[i]) for f, v in features.items()})
            yield row
            k += 1


def regime_means(sample: Sequence[Mapping[str, Any]], features: Sequence[str]) -> dict[str, dict[str, float]]:
    """The mean features of each source's rows."""
    out: dict[str, dict[str, float]] = {}
    for regime in dict.fromkeys(str(r["regime"]) for r in sample):
        mine = [r for r in sample if r["regime"] == regime]
        out[regime] = {f: float(np.mean([float(r.get(f, 0.0)) for r in mine])) for f in features}
    return out
