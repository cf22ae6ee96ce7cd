"""Regime detection for one operator.

Contract:
- ``RegimeDetector.observe(sample, model, replicas)`` (``observe_many`` for a tick's samples, or
  the lower-level ``update(sample, residual)``) consumes the operator's samples in completion order
  and returns ``None`` or a ``regime_change.RegimeChange``; applying it (refit, recall) is the
  caller's step.
- Two tests: online clustering of per-item features says which regime the input is in (stable ids:
  a recurring regime gets its old id); a persisting two-sided CUSUM on throughput residuals says the
  operator behaves differently. A change is ``ChangeKind.FEATURES`` (another regime) or
  ``ChangeKind.RESIDUAL`` (``old == new``: drop samples before ``change_point`` and refit).
- Residuals of the pipeline's fill (``warmup_s``), transients and load shifts are no evidence; a
  refit or a new ``config_epoch`` re-baselines the residual test rather than looking like a shift.
- Regimes that keep ending within ``flap_samples`` samples or ``flap_s`` seconds are one mixed
  workload (items whose costs span decades, arriving in short runs): they merge into one regime,
  listed in ``merges``, and alternating between them is no change (a lasting shift in cost still
  shows in the residuals).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, deque
from dataclasses import dataclass, field
from itertools import islice
from typing import Mapping, Sequence

import numpy as np
from scipy.signal import lfilter

from trident_flows.core.types import BatchSample
from trident_flows.scheduler.anomaly import MAD_TO_SIGMA
from trident_flows.scheduler.operator_model import OperatorModel
from trident_flows.scheduler.regime_change import ChangeKind, Regime, RegimeChange

# samples ``_quiet_run`` considers at once: its array work is over the candidates, and a run cut short
# early (an outlier) would otherwise redo it over the whole tick's samples
QUIET_CHUNK = 256


@dataclass
class _Cusum:
    reference: float = 0.0
    sigma: float = 1.0
    calibration: list[float] = field(default_factory=list)
    recent: deque = field(default_factory=lambda: deque(maxlen=3))
    history: deque = field(default_factory=lambda: deque(maxlen=256))   # (sample number, standardised residual)
    up: float = 0.0
    down: float = 0.0
    up_start: int = 0
    down_start: int = 0
    up_since: float = 0.0     # end time of the sample each side's current build-up began at
    down_since: float = 0.0
    last_at: float = -math.inf  # end time of the previous sample the CUSUM took



class RegimeDetector:
    """Online feature clustering plus a CUSUM change-point test, for one operator.

    Which regime the input is in: online leader clustering of each batch's per-item features
    (``log1p(features / items_in) / scale``). A sample within the radius of a regime's centroid belongs
    to it; the current regime changes when ``confirm`` of the last ``vote_window`` samples belong to
    another regime, or are novel and close together (a new regime from their mean). The radius is
    ``radius`` or, when the stream is noisier, ``noise_z`` times the RMS distance of recent samples to
    the current centroid. Regime ids are stable, so a recurring regime gets its old id (``recurring``).
    For ``dwell`` samples after a switch, votes for the regime just left (stragglers) do not switch back.
    When ``flaps`` regimes in a row ended within ``flap_samples`` samples or ``flap_s`` seconds of starting
    (too short for any decision to use: the evidence gate alone waits for 16 samples), the switch that
    would end the last one merges the two regimes instead: the merged regime keeps both centroids, a
    sample nearest either belongs to it, and ``merges`` records it.

    Whether the operator behaves differently: a two-sided CUSUM (``cusum_k``, ``cusum_h``) on throughput
    residuals (``OperatorModel.log_residual``), standardised by a median and MAD-based sigma calibrated
    on ``calibration`` residuals after every reset; each step takes the median of the last three, clipped
    at ``clip``. An alarm must persist: the median of the last ``persist`` residuals beyond ``2k``, a
    shift of at least ``min_shift`` (log units) and a build-up lasting ``persist_s`` seconds. A build-up
    already over, or cut short by a gap in the samples, is counted in ``transients`` and reset.
    Residuals of samples ending within ``warmup_s`` of the first (the pipeline's fill) are no evidence.
    A residual shift with unchanged features that the operator's concurrency explains (moved against it
    by ``load_share`` of the shift) is load: counted in ``load_shifts``, the baseline recalibrates.

    ``observe`` computes residuals under a snapshot of the caller's model and takes a newer fit only
    when the CUSUM is calm, re-basing on up to ``rebase_samples`` recent samples, so a refit never looks
    like a shift; a higher ``config_epoch`` re-baselines the residual test by itself. On an alarm the
    samples since the change point decide the kind (features in another regime: ``FEATURES``; else
    ``RESIDUAL``). Runs of quiet samples are consumed vectorised with the same result."""

    def __init__(self, operator: str, features: Sequence[str] | None = None, *, scales: Mapping[str, float] | None = None,
                 radius: float = 0.8, vote_window: int = 8, confirm: int = 6, calibration: int = 30, cusum_k: float = 0.5,
                 cusum_h: float = 8.0, clip: float = 3.0, persist: int = 24, persist_s: float = 1.0, min_shift: float = 0.3, dwell: int = 10,
                 min_sigma: float = 0.01, centroid_memory: int = 200, rebase_samples: int = 100, noise_z: float = 2.0,
                 noise_memory: int = 100, load_share: float = 0.5, warmup_s: float = 15.0, flap_samples: int = 16, flap_s: float = 10.0,
                 flaps: int = 2) -> None:
        if confirm > vote_window or confirm < 1:
            raise ValueError(f"confirm must be in 1..vote_window ({vote_window}), got {confirm}")
        if radius <= 0 or cusum_h <= 0 or calibration < 3:
            raise ValueError("radius and cusum_h must be > 0 and calibration >= 3")
        if load_share <= 0:
            raise ValueError(f"load_share must be > 0 (the share of a residual shift concurrency must explain), got {load_share}")
        if warmup_s < 0:
            raise ValueError(f"warmup_s must be >= 0 (seconds of the pipeline's fill before residuals count), got {warmup_s}")
        if flaps < 1 or flap_samples < 1 or flap_s < 0:
            raise ValueError(f"flaps and flap_samples must be >= 1 and flap_s >= 0 (short regimes in a row that merge, and how short), "
                             f"got {flaps}, {flap_samples}, {flap_s}")
        self.operator = operator
        self.features: tuple[str, ...] | None = tuple(features) if features is not None else None
        self.scales = dict(scales or {})
        self.radius = radius
        self.vote_window = vote_window
        self.confirm = confirm
        self.calibration = calibration
        self.k = cusum_k
        self.h = cusum_h
        self.clip = clip
        self.persist = persist
        self.persist_s = persist_s
        self.min_shift = min_shift
        self.dwell = dwell
        self.warmup_s = warmup_s
        self._warm_until = -math.inf         # residuals of samples ending before this are not evidence (the fill)
        self._previous: int | None = None
        self._switched_at = -10**9
        self._since = 0                      # sample number of the last change / config change
        self._epoch: int | None = None
        self._residual_model: OperatorModel | None = None
        self._residual_report = None
        self._recent: deque = deque(maxlen=rebase_samples)  # (sample number, sample, replicas)
        self.transients = 0
        self.load_share = load_share
        self.load_shifts = 0
        self._busy: deque = deque(maxlen=256)   # (sample number, busy start, end) for concurrency
        self.min_sigma = min_sigma
        self.centroid_memory = centroid_memory
        self.noise_z = noise_z
        self.noise_memory = noise_memory
        self._noise_ms = 0.0                 # EWMA of squared distances to the current centroid
        self._noise_n = 0
        self.regimes: dict[int, Regime] = {}
        self.current: int | None = None
        self.n = 0
        self.changes: list[RegimeChange] = []
        self._votes: deque = deque(maxlen=vote_window)          # (label or None, vector)
        self._history: deque = deque(maxlen=256)                 # (sample number, vector)
        self.flap_samples = flap_samples
        self.flaps = flaps
        self.flap_s = flap_s
        self._last_end = -math.inf                               # end time of the latest sample taken
        self._switched_end = -math.inf                           # end time of the sample the current regime began at
        self._short_regimes = 0                                  # regimes in a row that ended within flap_samples or flap_s
        self._merged_into: dict[int, int] = {}                   # a merged regime's id -> the id it is part of
        self.merges: list[tuple[int, int]] = []                  # (regime, the regime it merged into), in order
        self._cusum = _Cusum()
        self._cal_left = calibration

    # ---------------------------------------------------------------- features
    def vector(self, sample: BatchSample) -> np.ndarray:
        """The sample's point in regime space: log1p(per-item feature) / scale."""
        if self.features is None:
            self.features = tuple(sorted(sample.features))
        if sample.items_in < 1:
            raise ValueError(f"operator {self.operator!r}: sample from {sample.replica_id!r} has items_in={sample.items_in}; need >= 1")
        out = []
        for f in self.features:
            v = sample.features.get(f, 0.0)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"operator {self.operator!r}: sample from {sample.replica_id!r} has features[{f!r}]={v!r}; need a finite number >= 0")
            out.append(math.log1p(v / sample.items_in) / self.scales.get(f, 1.0))
        return np.array(out)

    @property
    def effective_radius(self) -> float:
        """``radius``, or ``noise_z`` x the RMS scatter of recent samples when that is larger."""
        if self._noise_n < 10:
            return self.radius
        return max(self.radius, self.noise_z * math.sqrt(self._noise_ms))

    def _track_noise(self, vector: np.ndarray) -> None:
        if self.current is None:
            return
        d2 = min(float(np.sum((vector - self.regimes[rid].centroid) ** 2)) for rid in self._members(self.current))
        d2 = min(d2, (3 * self.effective_radius) ** 2)
        self._noise_n += 1
        self._noise_ms += (d2 - self._noise_ms) / min(self._noise_n, self.noise_memory)

    def classify(self, vector: np.ndarray) -> tuple[int | None, float]:
        """The regime of the nearest centroid within the effective radius (or None) and the distance to it."""
        nearest, dist = self._nearest(vector)
        return (None if nearest is None else self.regime_of(nearest)), dist

    def regime_of(self, rid: int) -> int:
        """The regime that centroid ``rid`` is part of (itself unless merged)."""
        while rid in self._merged_into:
            rid = self._merged_into[rid]
        return rid

    def _members(self, rid: int) -> list[int]:
        return [r for r in self.regimes if self.regime_of(r) == rid]

    def _nearest(self, vector: np.ndarray) -> tuple[int | None, float]:
        """Nearest centroid within the effective radius (or None) and the distance to the nearest centroid."""
        if not self.regimes:
            return None, math.inf
        ids = list(self.regimes)
        d = np.linalg.norm(np.array([self.regimes[i].centroid for i in ids]) - vector, axis=1)
        j = int(np.argmin(d))
        return (ids[j] if d[j] <= self.effective_radius else None), float(d[j])

    # ---------------------------------------------------------------- residuals
    @property
    def calm(self) -> bool:
        """True when the residual baseline is calibrated and neither CUSUM side is building up
        (a safe moment to swap the residual model and ``recalibrate``)."""
        return self._cal_left == 0 and max(self._cusum.up, self._cusum.down) < 2.0 * self.k + 1.0

    def reset_baseline(self) -> None:
        """Forget the residual reference; the next ``calibration`` residuals calibrate it (e.g. after a config change)."""
        self._cusum = _Cusum()
        self._cal_left = self.calibration

    def recalibrate(self, residuals: Sequence[float]) -> None:
        """Set the residual reference from residuals of recent samples under a new model (e.g. after a refit)."""
        r = np.asarray([x for x in residuals if x is not None and math.isfinite(x)], dtype=float)
        if r.size < 3:
            self.reset_baseline()
            return
        self._cusum = _Cusum()
        self._set_reference(r)

    def _set_reference(self, r: np.ndarray) -> None:
        med = float(np.median(r))
        self._cusum.reference = med
        self._cusum.sigma = max(MAD_TO_SIGMA * float(np.median(np.abs(r - med))), self.min_sigma)
        self._cusum.up_start = self._cusum.down_start = self.n
        self._cal_left = 0
        # the calibration residuals are history under this reference: the persistence test need not wait for new ones
        tail = r[-self.persist:]
        self._cusum.history.extend((self.n - len(tail) + k, (x - med) / self._cusum.sigma) for k, x in enumerate(tail))

    def _cusum_step(self, residual: float, at: float) -> tuple[float, int] | None:
        if at < self._warm_until:
            return None
        c = self._cusum
        if self._cal_left > 0:
            c.calibration.append(residual)
            self._cal_left -= 1
            if self._cal_left == 0:
                self._set_reference(np.array(c.calibration))
                c.calibration = []
            return None
        self._burst_over(c, self.n, at)
        raw = (residual - c.reference) / c.sigma
        c.recent.append(raw)
        c.history.append((self.n, raw))
        # statistics.median: the same value as np.median, 50x cheaper on three numbers (this runs once a sample)
        z = max(-self.clip, min(self.clip, float(statistics.median(c.recent))))
        if c.up == 0.0:
            c.up_start, c.up_since = self.n, at
        if c.down == 0.0:
            c.down_start, c.down_since = self.n, at
        c.up = max(0.0, c.up + z - self.k)
        c.down = max(0.0, c.down - z - self.k)
        if max(c.up, c.down) <= self.h:
            return None
        # the last ``persist`` standardised residuals, newest last; statistics.median as above (this runs on
        # every sample while a side stays above h without the shift persisting)
        window = [z for _, z in islice(reversed(c.history), self.persist)][::-1]
        level = float(statistics.median(window)) if len(window) >= self.persist else 0.0
        needed = max(2 * self.k, self.min_shift / c.sigma)
        if c.up > self.h and level >= needed:
            return (c.up, c.up_start) if at - c.up_since >= self.persist_s else None
        if c.down > self.h and level <= -needed:
            return (-c.down, c.down_start) if at - c.down_since >= self.persist_s else None
        if abs(float(statistics.median(window[-5:]))) < self.k:
            # the shift is already over: a transient (a neighbour's burst), not a regime
            c.up = c.down = 0.0
            self.transients += 1
        return None

    def _burst_over(self, c: "_Cusum", n: int, at: float) -> None:
        """Reset a build-up that a gap ended before it persisted (class docstring): the sample numbered ``n``
        ends at ``at``, more than ``persist_s`` and ten of the build-up's mean spacings after the one before,
        and the build-up (three samples or more) had lasted less than ``persist_s`` by then."""
        prev_at, c.last_at = c.last_at, at
        if c.up == 0.0 and c.down == 0.0:
            return
        for size, start, since in ((c.up, c.up_start, c.up_since), (c.down, c.down_start, c.down_since)):
            taken, lasted = n - start, prev_at - since
            if size > 0 and taken >= 3 and lasted < self.persist_s and at - prev_at > max(self.persist_s, 10 * lasted / (taken - 1)):
                c.up = c.down = 0.0
                self.transients += 1
                return

    # ---------------------------------------------------------------- update
    def observe(self, sample: BatchSample, model: OperatorModel | None, replicas: int) -> RegimeChange | None:
        """``update`` with the residual of ``sample`` under a snapshot of ``model`` (see the class docstring)."""
        return self.observe_many([sample], model, replicas)[0]

    def observe_many(self, samples: Sequence[BatchSample], model: OperatorModel | None, replicas: int) -> list[RegimeChange | None]:
        """``observe`` of each sample in order (one result per sample), with the residuals of all of
        them under the snapshot in one GP prediction: one prediction per sample made this the
        controller's largest cost (video: ~1 ms a sample, 100+ samples a tick). A newer fit is taken at
        most once per call (at the first sample where the swap is allowed), so re-basing is not retried
        on every sample while too few residuals exist. Runs of quiet samples go through ``_quiet_run``."""
        out: list[RegimeChange | None] = []
        tried_rebase = False
        snapshot, residuals = None, {}
        vectors = self._vectors(samples)
        i = 0
        while i < len(samples):
            sample = samples[i]
            self._recent.append((self.n, sample, replicas))
            if not tried_rebase and self._may_rebase(model):
                tried_rebase = True
                self._rebase(model)
            if self._residual_model is not None and self._residual_model is not snapshot:
                snapshot = self._residual_model
                rest = samples[i:]
                residuals = dict(enumerate(snapshot.log_residuals(rest, [replicas] * len(rest)), start=i))
            rebase_due = not tried_rebase and model is not None and model.ready and model.report is not self._residual_report
            taken = self._quiet_run(samples, vectors, residuals, i, rebase_due, replicas) if vectors is not None else []
            if taken:
                out.extend(taken)
                i += len(taken)
                continue
            out.append(self._update(sample, residuals.get(i), None if vectors is None else vectors[i]))  # no snapshot: no residuals, None
            i += 1
        return out

    def update_many(self, samples: Sequence[BatchSample], residuals: Sequence[float | None] | None = None) -> list[RegimeChange | None]:
        """``update`` of each sample in order with its residual (one result per sample), quiet runs vectorised."""
        if residuals is not None and len(residuals) != len(samples):
            raise ValueError(f"operator {self.operator!r}: {len(samples)} samples but {len(residuals)} residuals; give one per sample")
        table = dict(enumerate(residuals)) if residuals is not None else {}
        vectors = self._vectors(samples)
        out: list[RegimeChange | None] = []
        i = 0
        while i < len(samples):
            taken = self._quiet_run(samples, vectors, table, i, False, None) if vectors is not None else []
            if taken:
                out.extend(taken)
                i += len(taken)
                continue
            out.append(self._update(samples[i], table.get(i), None if vectors is None else vectors[i]))
            i += 1
        return out

    def _vectors(self, samples: Sequence[BatchSample]) -> np.ndarray | None:
        """Every sample's ``vector`` in one array, or None when a sample is invalid (then ``vector``,
        sample by sample, raises its error at that sample, after the samples before it were consumed)."""
        if not samples:
            return None
        if self.features is None:
            self.features = tuple(sorted(samples[0].features))
        rows = [[s.features.get(f, 0.0) for f in self.features] for s in samples]
        if any(not issubclass(t, (int, float)) for t in {type(v) for row in rows for v in row}):
            return None
        raw = np.array(rows, dtype=float).reshape(len(samples), len(self.features))
        items = np.array([s.items_in for s in samples], dtype=float)
        if not (np.all(items >= 1) and np.all(np.isfinite(raw)) and np.all(raw >= 0)):
            return None
        scales = np.array([self.scales.get(f, 1.0) for f in self.features], dtype=float)
        return np.log1p(raw / items[:, None]) / scales

    def _quiet_run(self, samples: Sequence[BatchSample], vectors: np.ndarray, residuals: Mapping[int, float | None], i: int,
                   rebase_due: bool, replicas: int | None) -> list[RegimeChange | None]:
        """Consume the samples from ``i`` that are *quiet* at once, with the same result as ``update`` one
        by one: at 256 nodes a tick brings ~10,000 samples, and per-sample Python was half the tick.

        A sample is quiet when its nearest regime is the current one, within the effective radius, while
        no other regime (nor the novel samples) has ``confirm`` votes in the window and its configuration
        epoch is not new: then no vote can switch (quiet samples only add votes for the current regime), noise tracking never clips (the distance is within one radius, the clip is at
        three) and only the current centroid and the noise EWMA move, both linear recurrences with a
        constant gain once ``centroid_memory`` and ``noise_memory`` samples were seen (before that, and
        after any change, samples go one by one). Those recurrences run as ``scipy.signal.lfilter`` over
        the candidate samples, their classification as arrays; the CUSUM still steps sample by sample (a
        clipped, reset recursion) and the run ends before a sample where a newer fit may be taken
        (``rebase_due``, ``observe_many`` takes it) or after one that raises an alarm (decided here as
        ``update`` does). Returns one result per sample consumed; empty when sample ``i`` is not quiet.
        ``replicas`` (from ``observe_many``) records the consumed samples after ``i`` for re-basing."""
        cur = self.current
        if cur is None or self._epoch is None or len(self._members(cur)) > 1:
            return []
        # quiet samples vote for the current regime, so no other regime's votes (nor the novel ones) can grow
        if max(Counter(lab for lab, _ in self._votes if lab != cur).values(), default=0) >= self.confirm:
            return []
        reg = self.regimes[cur]
        if reg.count < self.centroid_memory - 1 or self._noise_n < max(self.noise_memory - 1, 10):
            return []
        stop = i
        while stop < min(len(samples), i + QUIET_CHUNK) and samples[stop].config_epoch <= self._epoch:
            stop += 1
        if stop == i:
            return []
        x = vectors[i:stop]
        m = len(x)
        a = 1.0 / self.centroid_memory
        b = 1.0 / self.noise_memory
        # the current centroid before each sample: c[k+1] = c[k] + (x[k] - c[k]) a
        after = lfilter([a], [1.0, a - 1.0], x, axis=0, zi=((1.0 - a) * reg.centroid)[None, :])[0]
        before = np.vstack([reg.centroid[None, :], after[:-1]])
        d2 = np.sum((x - before) ** 2, axis=1)
        ms_after = lfilter([b], [1.0, b - 1.0], d2, zi=[(1.0 - b) * self._noise_ms])[0]
        ms_before = np.concatenate([[self._noise_ms], ms_after[:-1]])
        radius = np.maximum(self.radius, self.noise_z * np.sqrt(ms_before))
        d = np.sqrt(d2)
        quiet = d <= radius
        order = list(self.regimes)
        for pos, rid in enumerate(order):
            if rid == cur:
                continue
            other = np.linalg.norm(x - self.regimes[rid].centroid, axis=1)
            # np.argmin in classify picks the first of equal distances, in the regimes' order
            quiet &= (d < other) if pos < order.index(cur) else (d <= other)
        length = m if quiet.all() else int(np.argmin(quiet))
        if length == 0:
            return []
        n0 = self.n
        alarm, used = self._cusum_run(samples, residuals, i, length, rebase_due)
        self.n = n0
        self._commit_quiet(samples, x, before, ms_before, after, ms_after, i, used, replicas)
        out: list[RegimeChange | None] = [None] * used
        if alarm is not None:
            # sample ``used`` raised the alarm: the rest of ``update`` for it, its CUSUM step already done
            k = used
            if k > 0 and replicas is not None:
                self._recent.append((self.n, samples[i + k], replicas))
            self._record(x[k], cur, samples[i + k])
            out.append(self._conclude(x[k], cur, float(d[k]), alarm))
        return out

    def _cusum_run(self, samples: Sequence[BatchSample], residuals: Mapping[int, float | None], i: int, length: int,
                   rebase_due: bool) -> tuple[tuple[float, int] | None, int]:
        """The CUSUM steps of ``length`` quiet samples from ``i``: ``(alarm, used)``, ``used`` the samples
        consumed (up to the one that raised ``alarm``, or before the one where a newer fit may be taken).
        A step that stays calibrated, with three recent residuals and both sides at most ``h``, is
        ``_cusum_step``'s arithmetic inline (its Python call per sample was a third of the detector's
        time); any other step is ``_cusum_step`` itself, from the same state."""
        c = self._cusum
        n0 = self.n
        for k in range(length):
            n = n0 + k  # the CUSUM numbers its history by sample
            if k > 0 and rebase_due and (not (self._residual_model is not None and self._cal_left == 0) or self.calm):
                return None, k
            r = residuals.get(i + k)
            if r is None or not math.isfinite(r):
                continue
            end = samples[i + k].end
            if end < self._warm_until:
                continue
            if self._cal_left == 0 and len(c.recent) == 3:
                self._burst_over(c, n, end)
                raw = (r - c.reference) / c.sigma
                a, b = c.recent[1], c.recent[2]
                median = max(min(a, b), min(max(a, b), raw))  # the median of the last three, as statistics.median
                z = max(-self.clip, min(self.clip, float(median)))
                up = max(0.0, c.up + z - self.k)
                down = max(0.0, c.down - z - self.k)
                if max(up, down) <= self.h:
                    c.recent.append(raw)
                    c.history.append((n, raw))
                    if c.up == 0.0:
                        c.up_start, c.up_since = n, end
                    if c.down == 0.0:
                        c.down_start, c.down_since = n, end
                    c.up, c.down = up, down
                    continue
            self.n = n
            alarm = self._cusum_step(r, end)
            c = self._cusum
            if alarm is not None:
                return alarm, k
        return None, length

    def _commit_quiet(self, samples: Sequence[BatchSample], x: np.ndarray, before: np.ndarray, ms_before: np.ndarray, after: np.ndarray,
                      ms_after: np.ndarray, i: int, used: int, replicas: int | None) -> None:
        """The state after ``used`` quiet samples from ``i`` (``_quiet_run``), as ``update`` leaves it."""
        if used == 0:
            return
        reg = self.regimes[self.current]
        n0 = self.n
        if replicas is not None:
            self._recent.extend((n0 + k, samples[i + k], replicas) for k in range(1, used))
        tail = range(max(0, used - self._history.maxlen), used)
        self._votes.extend((self.current, x[k]) for k in range(max(0, used - self.vote_window), used))
        self._history.extend((n0 + k, x[k]) for k in tail)
        self._busy.extend((n0 + k, samples[i + k].end - samples[i + k].busy_s, samples[i + k].end) for k in tail)
        self._last_end = samples[i + used - 1].end
        reg.centroid = after[used - 1].copy()
        reg.count += used
        reg.last_seen = n0 + used - 1
        self._noise_ms = float(ms_after[used - 1])
        self._noise_n += used
        self.n = n0 + used

    def _may_rebase(self, model: OperatorModel | None) -> bool:
        settled = self._residual_model is not None and self._cal_left == 0
        return model is not None and model.ready and model.report is not self._residual_report and (not settled or self.calm)

    def _rebase(self, model: OperatorModel) -> None:
        """Take ``model``'s fit for residuals when enough recent samples (since the last change) have one under it."""
        recent = [(s, r) for n, s, r in self._recent if n >= self._since and s.end >= self._warm_until]
        residuals = [r for r in model.log_residuals([s for s, _ in recent], [r for _, r in recent]) if r is not None]
        if len(residuals) >= min(20, self._recent.maxlen):
            self._residual_model, self._residual_report = model.snapshot(), model.report
            self.recalibrate(residuals)

    def update(self, sample: BatchSample, residual: float | None = None) -> RegimeChange | None:
        """Consume one sample (and its throughput residual, if a model exists)."""
        return self._update(sample, residual, None)

    def _update(self, sample: BatchSample, residual: float | None, x: np.ndarray | None) -> RegimeChange | None:
        if x is None:
            x = self.vector(sample)
        if self._epoch is None:
            self._warm_until = sample.end + self.warmup_s
        if self._epoch is None or sample.config_epoch > self._epoch:
            if self._epoch is not None:
                self.reset_baseline()        # a configuration change moves residual levels
                self._since = self.n
            self._epoch = sample.config_epoch
        nearest, dist = self._nearest(x)
        label = None if nearest is None else self.regime_of(nearest)
        self._record(x, label, sample)
        alarm = None
        if residual is not None and math.isfinite(residual):
            alarm = self._cusum_step(residual, sample.end)
        return self._conclude(x, label, dist, alarm, nearest)

    def _record(self, x: np.ndarray, label: int | None, sample: BatchSample) -> None:
        self._last_end = sample.end
        self._votes.append((label, x))
        self._history.append((self.n, x))
        self._busy.append((self.n, sample.end - sample.busy_s, sample.end))

    def _conclude(self, x: np.ndarray, label: int | None, dist: float, alarm: tuple[float, int] | None,
                  nearest: int | None = None) -> RegimeChange | None:
        """The rest of ``update`` once the sample is recorded and its CUSUM step taken; ``nearest``: the
        centroid the sample is nearest (default ``label``'s own), which moves towards it."""
        change = self._on_alarm(*alarm) if alarm is not None else None
        if change is None:
            change = self._on_votes(dist)
        if change is None:
            self._track_noise(x)
        if change is None and label is not None and label == self.current:
            reg = self.regimes[label if nearest is None else nearest]
            reg.count += 1
            reg.centroid += (x - reg.centroid) / min(reg.count, self.centroid_memory)
            reg.last_seen = self.n
        self.n += 1
        if change is not None:
            self.changes.append(change)
        return change

    def _new_regime(self, centroid: np.ndarray) -> int:
        rid = len(self.regimes)
        self.regimes[rid] = Regime(rid, centroid.copy(), 1, self.n, self.n)
        return rid

    def _switch(self, new: int, kind: ChangeKind, change_point: int, evidence: dict, reason: str, recurring: bool) -> RegimeChange | None:
        old = self.current
        if old is not None and self._flapping(self.n - self._switched_at, self._last_end - self._switched_end):
            self._merged_into[new] = old
            self.merges.append((new, old))
            self._votes.clear()
            return None
        self.current = new
        self._previous, self._switched_at, self._switched_end = old, self.n, self._last_end
        self._since = self.n
        self.regimes[new].last_seen = self.n
        self._votes.clear()
        self.reset_baseline()
        if old is None:
            return None  # the first regime is an initialisation, not a change
        return RegimeChange(self.operator, old, new, kind, recurring, self.n, change_point, evidence, reason)

    def _flapping(self, lasted: int, lasted_s: float) -> bool:
        """Count the current regime, ending after ``lasted`` samples and ``lasted_s`` seconds; True (and the
        count restarts) when it is the ``flaps``-th in a row to end that soon (the class docstring)."""
        short = lasted < self.flap_samples or lasted_s < self.flap_s
        self._short_regimes = self._short_regimes + 1 if short else 0
        if self._short_regimes < self.flaps:
            return False
        self._short_regimes = 0
        return True

    def _on_votes(self, dist: float) -> RegimeChange | None:
        labels = [lab for lab, _ in self._votes]
        novel = [x for lab, x in self._votes if lab is None]
        stragglers = self.regime_of(self._previous) if self._previous is not None and self.n - self._switched_at < self.dwell else None
        if len(novel) >= self.confirm:
            centre = np.mean(novel, axis=0)
            if max(np.linalg.norm(x - centre) for x in novel) <= self.effective_radius:
                label, _ = self.classify(centre)
                recurring = label is not None
                rid = label if recurring else self._new_regime(centre)
                if rid != self.current and rid != stragglers:
                    return self._switch(rid, ChangeKind.FEATURES, self.n - len(novel) + 1,
                                        {"votes": float(len(novel)), "distance": float(dist)},
                                        f"{len(novel)} of the last {len(labels)} samples have features of {'regime ' + str(rid) if recurring else 'a new regime ' + str(rid)}",
                                        recurring)
        for rid in set(lab for lab in labels if lab is not None and lab != self.current and lab != stragglers):
            votes = labels.count(rid)
            if votes >= self.confirm:
                return self._switch(rid, ChangeKind.FEATURES, self.n - votes + 1, {"votes": float(votes), "distance": float(dist)},
                                    f"{votes} of the last {len(labels)} samples have features of regime {rid}", True)
        return None

    def _load_explains(self, start: int, shift: float) -> bool:
        """True when the operator's concurrency since sample ``start`` moved against ``shift`` by at least
        ``load_share`` of it, compared with the ``persist`` samples before (see the class docstring)."""
        rows = np.array([(n, a, b) for n, a, b in self._busy], dtype=float).reshape(-1, 3)
        before = (rows[:, 0] < start) & (rows[:, 0] >= start - self.persist)
        after = rows[:, 0] >= start
        if before.sum() < 3 or after.sum() < 3:
            return False
        a, b = rows[:, 1], rows[:, 2]
        overlap = np.clip(np.minimum(b[:, None], b[None, :]) - np.maximum(a[:, None], a[None, :]), 0.0, None)
        concurrency = overlap.sum(axis=1) / np.maximum(b - a, 1e-9)   # the batch's own interval counts 1
        moved = float(np.median(np.log(concurrency[after])) - np.median(np.log(concurrency[before])))
        return moved * shift < 0 and abs(moved) >= self.load_share * abs(shift)

    def _on_alarm(self, stat: float, start: int) -> RegimeChange | None:
        shift = self._cusum.sigma * float(np.median([z for n, z in self._cusum.history if n >= start] or [0.0]))
        since = [x for n, x in self._history if n >= start] or [self._history[-1][1]]
        centre = np.mean(since, axis=0)
        label, dist = self.classify(centre)
        evidence = {"cusum": float(stat), "threshold": self.h, "sigma": self._cusum.sigma, "shift_log": shift, "samples_since": float(len(since))}
        if self.current is not None and label == self.current:
            self.reset_baseline()
            self._votes.clear()
            self._since = self.n
            if self._load_explains(start, shift):
                self.load_shifts += 1
                return None
            change = RegimeChange(self.operator, self.current, self.current, ChangeKind.RESIDUAL, True, self.n, start, evidence,
                                  f"throughput residual shifted by {math.expm1(shift):+.0%} (CUSUM {abs(stat):.1f} > {self.h}) with unchanged workload features")
            return change
        recurring = label is not None
        rid = label if recurring else self._new_regime(centre)
        return self._switch(rid, ChangeKind.FEATURES, start, {**evidence, "distance": dist},
                            f"throughput residual shifted by {math.expm1(shift):+.0%} and the features since sample {start} are "
                            f"{'those of regime ' + str(rid) if recurring else 'a new regime ' + str(rid)}", recurring)
