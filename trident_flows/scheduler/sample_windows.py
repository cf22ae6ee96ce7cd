"""An operator's batch samples screened and cut into windows of sustainable throughput.

Contract (every sample set aside is appended to the caller's ``filtered`` list with its reason):
- ``screen`` sorts samples into filtered (invalid or not ok), ok, ok with a memory peak, and the
  configs that ran out of memory; ``quick_valid`` is its vectorised test of the common case.
- ``invalidate``: a sample re-measured in the current epoch with the same config and replica
  count is ``SUPERSEDED``, one over ``max_epoch_age`` epochs old ``STALE_EPOCH``; otherwise its
  group's age down-weights it.
- ``drop_spikes`` drops transient outliers of seconds per item over what the content explains,
  per (config, epoch) group (``anomaly.robust_filter``).
- ``make_windows`` cuts each group, in completion order, into ``Window``s of at least ``bin_size``
  batches and ``min_window_busy_s`` busy time (per replica the union of its busy intervals);
  ``subsample`` caps the training windows at ``max_gp_points`` and returns the rest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from trident_flows.core.types import CPU, BatchSample, OpConfig, Outcome
from trident_flows.scheduler.anomaly import Filtered, Reason, group_codes, robust_filter, span_slack, validate_sample
from trident_flows.scheduler.item_work import content_work


@dataclass(frozen=True)
class Window:
    """One aggregated window of batches of one (config, config_epoch) group."""

    indices: tuple[int, ...]
    config: OpConfig
    epoch: int
    replicas: int
    start: float
    end: float
    items: int
    busy_s: float
    per_replica_rate: float
    features: Mapping[str, float]
    utilisation: float

    @property
    def throughput(self) -> float:
        """Measured sustainable throughput of the operator in this window (items/s)."""
        return self.replicas * self.per_replica_rate


def quick_valid(samples: Sequence[BatchSample]) -> np.ndarray:
    """Vectorised version of ``validate_sample`` for the common case: True where the sample is surely valid
    (the rest go through ``validate_sample``, which names the bad field)."""
    try:
        a = np.array([(s.start, s.end, s.busy_s, s.items_in, s.peak_host_mem_bytes, s.peak_device_mem_bytes,
                       sum(s.features.values()) if s.features else 0.0, min(s.features.values(), default=0.0),
                       float(type(s.items_in) is int)) for s in samples], dtype=float).reshape(len(samples), 9)
    except (TypeError, ValueError):
        return np.zeros(len(samples), dtype=bool)
    with np.errstate(invalid="ignore"):
        return (np.isfinite(a).all(axis=1) & (a[:, 2] > 0) & (a[:, 1] >= a[:, 0]) & (a[:, 2] <= a[:, 1] - a[:, 0] + span_slack(a[:, 1] - a[:, 0], a[:, 1]))
                & (a[:, 3] >= 1) & (a[:, 4] >= 0) & (a[:, 5] >= 0) & (a[:, 7] >= 0) & (a[:, 8] == 1))


def screen(operator: str, samples: Sequence[BatchSample]) -> tuple[list[Filtered], list[int], list[int], set[OpConfig]]:
    """Sort the window's samples: (filtered with their reason, OK ones, OK ones with a memory peak, configs
    that ran out of memory). A sample that is not this operator's ``BatchSample`` raises."""
    for i, s in enumerate(samples):
        if not isinstance(s, BatchSample):
            raise TypeError(f"samples[{i}] is a {type(s).__name__}, expected BatchSample")
        if s.operator != operator:
            raise ValueError(f"samples[{i}] belongs to operator {s.operator!r}, this model is for {operator!r}")
    filtered: list[Filtered] = []
    ok: list[int] = []
    mem_ok: list[int] = []
    ooms: set[OpConfig] = set()
    valid = quick_valid(samples)
    for i, s in enumerate(samples):
        problem = None if valid[i] else validate_sample(s)
        if problem is not None:
            filtered.append(Filtered(i, Reason.INVALID, problem))
        elif s.outcome != Outcome.OK:
            filtered.append(Filtered(i, Reason.OUTCOME, f"outcome={s.outcome.value}" + (f": {s.error}" if s.error else "")))
            if s.outcome == Outcome.OOM:
                ooms.add(s.config)
        else:
            ok.append(i)
            if (s.peak_host_mem_bytes if s.config.device == CPU else s.peak_device_mem_bytes) > 0:
                mem_ok.append(i)
    return filtered, ok, mem_ok, ooms


def invalidate(samples: Sequence[BatchSample], ok: list[int], epoch: int, filtered: list[Filtered],
               max_epoch_age: int) -> tuple[list[int], dict[tuple[OpConfig, int], int]]:
    """Apply the config-epoch rule; return the surviving indices and each (config, epoch) group's age."""
    replicas: dict[tuple[OpConfig, int], set[str]] = {}
    for i in ok:
        replicas.setdefault((samples[i].config, samples[i].config_epoch), set()).add(samples[i].replica_id)
    fresh = {(c, len(r)) for (c, e), r in replicas.items() if e >= epoch}
    kept, age = [], {}
    for i in ok:
        s = samples[i]
        a = max(0, epoch - s.config_epoch)
        n = len(replicas[(s.config, s.config_epoch)])
        if a > 0 and (s.config, n) in fresh:
            filtered.append(Filtered(i, Reason.SUPERSEDED, f"config_epoch {s.config_epoch} < {epoch} and {s.config.label()} x{n} was re-measured since"))
        elif a > max_epoch_age:
            filtered.append(Filtered(i, Reason.STALE_EPOCH, f"config_epoch {s.config_epoch} is {a} epochs old (max {max_epoch_age})"))
        else:
            kept.append(i)
            age[(s.config, s.config_epoch)] = a
    return kept, age


def drop_spikes(samples: Sequence[BatchSample], ok: list[int], sums: np.ndarray, filtered: list[Filtered],
                spike_k: float) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Drop transient outliers of busy time per item within each (config, epoch) group (``robust_filter``)
    after what each batch's content (``sums``: its feature sums, a row per index of ``ok``) explains
    (``item_work.content_work``: a batch of heavy items is work, not a spike). Returns the kept indices, their group
    codes and their rows of ``sums``."""
    cfg_code: dict[OpConfig, int] = {}
    items = np.array([samples[i].items_in for i in ok], dtype=float)
    busy = np.array([samples[i].busy_s for i in ok], dtype=float)
    end = np.array([samples[i].end for i in ok], dtype=float)
    groups = group_codes([(cfg_code.setdefault(samples[i].config, len(cfg_code)), samples[i].config_epoch) for i in ok])
    per_item = busy / items
    if sums.shape[1]:
        per_item = per_item / content_work(sums / items[:, None], per_item, groups)
    spikes = robust_filter(np.log(per_item), groups, end, k=spike_k)
    for j in np.flatnonzero(spikes):
        filtered.append(Filtered(ok[j], Reason.SPIKE, f"busy_s={busy[j]:.4g} for {int(items[j])} items is a transient outlier"))
    keep = np.flatnonzero(~spikes)
    return [ok[j] for j in keep], groups[keep], sums[keep]


def make_windows(samples: Sequence[BatchSample], ok: list[int], groups: np.ndarray, feature_sums: np.ndarray,
                 feature_names: tuple[str, ...], filtered: list[Filtered], *, holdout_every: int, max_gp_points: int,
                 min_window_busy_s: float) -> tuple[list[Window], int]:
    """The windows of the ``ok`` samples (``groups``: their (config, epoch) group codes; ``feature_sums``: a row
    per sample) and the number of batches a window holds: ``max(4, ceil(n * (1 - 1/holdout_every) / max_gp_points))``,
    so every batch counts and about ``max_gp_points`` windows train the GP."""
    n = len(ok)
    bin_size = max(4, math.ceil(n * (1 - 1 / holdout_every) / max_gp_points)) if n >= 16 else max(1, n // 4)
    end = np.array([samples[i].end for i in ok])
    busy = np.array([samples[i].busy_s for i in ok])
    first = end - busy
    replica = group_codes([samples[i].replica_id for i in ok])
    items_in = np.array([samples[i].items_in for i in ok], dtype=float)
    # busy time each batch adds to its replica's union of busy intervals, one (group, replica) run at a
    # time in start order (a 256-node window holds hundreds of replicas: masks per replica were most of a fit)
    contrib = np.zeros(n)
    order = np.lexsort((first, replica, groups))
    run_starts = np.flatnonzero(np.r_[True, (np.diff(groups[order]) != 0) | (np.diff(replica[order]) != 0)])
    spans: dict[int, tuple[list[float], list[float]]] = {}  # group -> its replicas' (first starts, last ends)
    for a, b in zip(run_starts, np.r_[run_starts[1:], n]):
        idx = order[a:b]
        prev_end = np.concatenate([[-np.inf], np.maximum.accumulate(end[idx])[:-1]])
        contrib[idx] = np.maximum(0.0, end[idx] - np.maximum(first[idx], prev_end))
        lo, hi = spans.setdefault(int(groups[idx[0]]), ([], []))
        lo.append(float(first[idx].min()))
        hi.append(float(end[idx].max()))
    windows = []
    for g in np.unique(groups):
        idx = np.flatnonzero(groups == g)
        idx = idx[np.argsort(end[idx], kind="stable")]
        span_lo, span_hi = (np.array(v) for v in spans[int(g)])
        cuts = _cuts(contrib[idx], bin_size, min_window_busy_s)
        for a, b in zip(cuts, cuts[1:] + [idx.size]):
            part = idx[a:b]
            busy_total = float(contrib[part].sum())
            items = int(items_in[part].sum())
            if busy_total <= 0:
                filtered += [Filtered(ok[j], Reason.INVALID, "busy interval lies inside another batch's of the same replica") for j in part]
                continue
            w0, w1 = float(first[part].min()), float(end[part].max())
            reps = int(np.count_nonzero((span_lo < w1) & (span_hi > w0))) or 1
            s0 = samples[ok[part[0]]]
            feats = dict(zip(feature_names, (feature_sums[part].sum(axis=0) / items).tolist()))
            windows.append(Window(tuple(ok[j] for j in part), s0.config, s0.config_epoch, reps, w0, w1, items, busy_total,
                                  items / busy_total, feats, min(1.0, busy_total / (reps * max(w1 - w0, 1e-9)))))
    return windows, bin_size


def _cuts(busy: np.ndarray, bin_size: int, min_window_busy_s: float) -> list[int]:
    """Window starts over one group's batches (completion order): ``bin_size`` batches and at least
    ``min_window_busy_s`` of busy time each (a sixteenth of the group's busy time while it has
    less than sixteen times that, so a new operator gets windows, if noisy ones, at once); a short tail
    joins the window before it."""
    least = min(min_window_busy_s, float(busy.sum()) / 16)
    cuts, count, acc = [0], 0, 0.0
    for k, b in enumerate(busy):
        count += 1
        acc += float(b)
        if count >= bin_size and acc >= least and k + 1 < busy.size:
            cuts.append(k + 1)
            count, acc = 0, 0.0
    if len(cuts) > 1 and (count < max(1, bin_size // 2) or acc < least / 2):
        cuts.pop()
    return cuts


def subsample(train: list[Window], max_gp_points: int) -> tuple[list[Window], list[Window]]:
    """At most ``max_gp_points`` windows: the recent half and a stride sample of older ones; and the rest."""
    if len(train) <= max_gp_points:
        return train, []
    recent = max_gp_points // 2
    old = train[:-recent]
    pick = set(np.linspace(0, len(old) - 1, max_gp_points - recent).round().astype(int).tolist())
    return [w for k, w in enumerate(old) if k in pick] + train[-recent:], [w for k, w in enumerate(old) if k not in pick]
