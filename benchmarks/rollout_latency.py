"""Benchmark ``rollout-latency``: what does a rolling update cost an item's end-to-end latency?

Contract of ``run(quick) -> BenchResult``:
- Workload: the closed-loop suite's ``cpu-only`` pipeline (emulated documents, tesseract, ``CPUS`` CPUs, time scale
  ``TIME_SCALE``) in one stable regime (``REGIME``), fed open-loop: a driver thread adds a shard of
  ``OFFERED_ITEMS_PER_S`` x ``SHARD_S`` rows every ``SHARD_S`` seconds on schedule (``add_shard``), whatever the
  pipeline does, at a rate below the capacity of both configurations, so an item's latency is its trip through the
  pipeline, not a backlog.
- The moves: from ``static-default`` (A), the runtime's rolling update (``Runner.apply`` through
  ``loop.apply.apply_plan``) applies B, A, B, ... at fixed times (``Schedule``): B is the cost model's best static
  configuration for the regime at A's batch size (ocr replicas moved to embed: the move trident makes in this regime),
  and the way back is the move it makes when scans come. No policy runs: every update is one a user or trident would
  apply, carried out by the runtime's own rolling-update path.
- Measured per input item: offered (its shard's scheduled time), read, done and committed (its shard's atomic commit)
  from ``PipelineRunner.latencies()``; each apply's window from the runner's apply reports.
- ``summarise(offered_t, done_t, commit_t, windows, items_lost, warmup_end)`` (pure): items offered before
  ``warmup_end`` left out; steady against during-rollout (in flight during a rolling update) p50/p99 of the latency
  offered -> committed (the headline) and offered -> done; targets ``p99_during_rollout_over_steady`` <=
  ``TARGET_RATIO``, ``rollouts`` >= 3 and ``items_lost`` 0.
- ``raw``: the schedule, the plans, apply reports, per rolling update its steps, dip and the p99 of items done during
  it and ``LOCAL_S`` before and after; every item's (offered, read, done, committed). The figure plots every item's
  latency over its offered time, rolling updates shaded, with the replicas per operator below.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import ray

from benchmarks.closed_loop_workload import CPU_BATCH, Workload
from benchmarks.lineage import items_lost
from benchmarks.local_ray import start_local_ray
from benchmarks.report import BenchResult, Target
from benchmarks.suite_workloads import CPUS, DEVICE_MEMORY, SEED, TIME_SCALE, SuiteWorkload
from trident_flows.control.launch import start_runner, stop_runner
from trident_flows.core.state import RunnerSettings, RunnerState
from trident_flows.core.types import Plan, StepKind
from trident_flows.loop.apply import apply_plan
from trident_flows.pipelines.emulated_docs import LAYOUT as DOCS_LAYOUT
from trident_flows.runtime.costmodel import PipelineProfile
from trident_flows.runtime.latency import Latencies
from trident_flows.runtime.sink import read_ids
from trident_flows.runtime.spec import ID
from trident_flows.sim.static_search import StaticConfig, search_static

PROFILE, REGIME = "documents", "short"
NAMESPACE = "rollout-latency"
# About two thirds of what static-default, the smaller of the two configurations, moves of this regime at this time scale
# on this machine (about 18 items/s, closed loop): below both capacities, so the queues stay short and a latency change
# is the update's own, yet loaded enough that an update's lost capacity would show.
OFFERED_ITEMS_PER_S = 12.0
SHARD_S = 0.5  # one input shard per half second: an item's commit waits for at most this much of the stream after it
QUEUE_MAX_ITEMS = 64
LOCAL_S = 20.0  # the stretch before and after a rolling update its items are compared with
POLL_S = 1.0
TARGET_RATIO = 1.2


@dataclass(frozen=True)
class Schedule:
    """When the source runs and the updates start, in seconds since the first shard was offered: ``warmup_s`` of
    input first (the items offered in its first ``settle_s`` are left out: the pipeline filling from empty, replicas
    meeting their first batches), then one update every ``period_s`` (``updates`` of them), the source running
    ``period_s`` past the last one's start."""

    settle_s: float
    warmup_s: float
    period_s: float
    updates: int

    @property
    def feed_s(self) -> float:
        return self.warmup_s + self.updates * self.period_s

    def update_at(self) -> list[float]:
        return [self.warmup_s + k * self.period_s for k in range(self.updates)]


FULL, QUICK = Schedule(10.0, 30.0, 60.0, 4), Schedule(10.0, 20.0, 40.0, 3)


@dataclass(frozen=True)
class Window:
    """One apply's steps, from ``start`` to ``end`` (wall clock); ``rolling``: it started and retired replicas."""

    start: float
    end: float
    rolling: bool
    steps: tuple[str, ...] = ()
    reason: str = ""
    dip: float = 0.0  # the apply's throughput dip (ApplyReport.dip)


def windows_of(apply_reports: Sequence[Mapping[str, Any]]) -> list[Window]:
    """The windows of the applies that did at least one step (``ApplyReport.to_dict()`` forms)."""
    out = []
    for r in apply_reports:
        steps = r.get("steps_done") or ()
        if not steps or not r.get("started_at"):
            continue
        kinds = {s["kind"] for s in steps}
        out.append(Window(float(r["started_at"]), float(r["started_at"]) + float(r["seconds"]),
                          StepKind.START.value in kinds and StepKind.RETIRE.value in kinds,
                          tuple(f"{s['kind']} {s['count']} {s['operator']}" for s in steps), str(r.get("reason", ""))[:300],
                          float(r.get("dip", 0.0))))
    return out


GROUPINGS = ("in_flight", "completion")


def _touches(start_t: np.ndarray, end_t: np.ndarray, windows: Sequence[Window], by: str) -> np.ndarray:
    """Items in flight during any of ``windows`` (``by="in_flight"``: offered before its end, finished after its start)
    or finished inside one (``by="completion"``)."""
    mask = np.zeros(len(start_t), dtype=bool)
    for w in windows:
        mask |= ((start_t < w.end) & (end_t > w.start)) if by == "in_flight" else ((end_t >= w.start) & (end_t <= w.end))
    return mask


def groups(start_t: np.ndarray, end_t: np.ndarray, windows: Sequence[Window], warmup_end: float = -np.inf,
           by: str = "in_flight") -> dict[str, np.ndarray]:
    """Masks over the items: ``warmup`` (offered before ``warmup_end``), ``during_rollout``, ``during_other_apply``,
    ``steady`` (items finished only), an item being during a window when it was in flight then or, ``by="completion"``,
    finished then (see ``summarise``)."""
    done = ~np.isnan(end_t)
    warmup = done & (start_t < warmup_end)
    rolling = done & ~warmup & _touches(start_t, end_t, [w for w in windows if w.rolling], by)
    other = done & ~warmup & ~rolling & _touches(start_t, end_t, [w for w in windows if not w.rolling], by)
    return {"warmup": warmup, "during_rollout": rolling, "during_other_apply": other, "steady": done & ~warmup & ~rolling & ~other}


def _pct(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _compared(lat: np.ndarray, g: Mapping[str, np.ndarray], prefix: str = "") -> dict[str, Any]:
    """p50/p99 of ``lat`` steady and during rolling updates and their ratios, keys prefixed with ``prefix``."""
    p = {f"{prefix}latency_s_p{q}_{name}": _pct(lat[g[name]], q) for name in ("steady", "during_rollout") for q in (50, 99)}
    return {**p, **{f"{prefix}p{q}_during_rollout_over_steady": _ratio(p[f"{prefix}latency_s_p{q}_during_rollout"],
                                                                       p[f"{prefix}latency_s_p{q}_steady"]) for q in (99, 50)}}


def summarise(offered_t: np.ndarray, done_t: np.ndarray, commit_t: np.ndarray, windows: Sequence[Window], items_lost: int,
              warmup_end: float = -np.inf) -> dict[str, Any]:
    """The benchmark's summary from every item's offered, done and commit times and the apply windows.

    The headline latency runs from an item's offer at the source to its shard's commit at the sink (``latency_s_*``);
    ``done_latency_s_*`` runs to its last row written (the commit adds the wait for the rest of its shard and the
    commit itself). Items finished (committed) are sorted into *warmup* (offered before ``warmup_end``), *during
    rollout* (in flight during a rolling update, an apply that started and retired replicas: offered before its window
    ended and committed after it began), *during other apply* (in flight only during applies that only started or only
    retired replicas, canaries included: in neither group compared) and *steady* (the rest); the done latency's groups
    are the same with done for committed. ``by_completion``: an item is during a window when it was committed inside it
    (what an observer of the outputs sees). Figures: ``rollouts``, ``other_applies``, p50/p99 steady and during
    rollouts and their ratios, the counts per group and ``items_lost``; None where a group is empty."""
    commit_lat, done_lat = commit_t - offered_t, done_t - offered_t
    g = groups(offered_t, commit_t, windows, warmup_end)
    return {
        "rollouts": sum(w.rolling for w in windows),
        "other_applies": sum(not w.rolling for w in windows),
        **_compared(commit_lat, g),
        **_compared(done_lat, groups(offered_t, done_t, windows, warmup_end), "done_"),
        **{f"items_{name}": int(mask.sum()) for name, mask in g.items()},
        "by_completion": _compared(commit_lat, groups(offered_t, commit_t, windows, warmup_end, "completion")),
        "items_lost": items_lost,
    }


def per_rollout(offered_t: np.ndarray, end_t: np.ndarray, windows: Sequence[Window], t0: float,
                warmup_end: float = -np.inf) -> list[dict[str, Any]]:
    """Per rolling update: its steps and dip; the items in flight during it; and the items finished during it against
    those finished in the ``LOCAL_S`` seconds before it began and after it ended (warm-up left out)."""
    warmup = offered_t < warmup_end
    lat = end_t - offered_t
    out = []
    for w in (w for w in windows if w.rolling):
        spans = {"in_flight": _touches(offered_t, end_t, [w], "in_flight"),
                 "done_before": (end_t >= w.start - LOCAL_S) & (end_t < w.start),
                 "done_during": (end_t >= w.start) & (end_t <= w.end),
                 "done_after": (end_t > w.end) & (end_t <= w.end + LOCAL_S)}
        out.append({"start_s": w.start - t0, "seconds": w.end - w.start, "steps": list(w.steps), "dip": w.dip, "reason": w.reason,
                    **{f"{name}_{key}": value for name, mask in spans.items()
                       for key, value in (("items", int((mask & ~warmup).sum())),
                                          ("latency_s_p99", _pct(lat[mask & ~warmup], 99)))}})
    return out


def offered_times(shard_t: Sequence[float], shard_items: Sequence[int]) -> np.ndarray:
    """Each item's offered time, in read order: its shard's (shards are fed one after another, so read order is shard
    order)."""
    return np.repeat(np.asarray(shard_t, dtype=float), np.asarray(shard_items, dtype=int))


def plans(profile: PipelineProfile, rows: Sequence[Mapping[str, Any]], start: StaticConfig) -> tuple[StaticConfig, StaticConfig]:
    """A (``start``) and B: the cost model's best static configuration for ``rows`` at A's CPU batch size."""
    names = sorted({f for m in profile.workloads.values() for f in m})
    features = {f: float(np.mean([float(r.get(f, 0.0)) for r in rows])) for f in names}
    batch = max((c.batch_size for _, c, _ in start.assignment), default=CPU_BATCH)
    best = search_static(profile, features, cpus=CPUS, gpus=0, device_memory_bytes=DEVICE_MEMORY, cpu_batch=batch)
    return start, best


@dataclass
class Measured:
    """One run's per-item times, apply reports, replica counts over time and outcome."""

    offered_t: np.ndarray
    latencies: Latencies
    apply_reports: list[dict[str, Any]]
    apply_errors: list[str]
    replicas: dict[str, list[tuple[float, int]]]
    t0: float
    late_shards: int
    wall_s: float
    items_lost: int
    error: str


def _feed(handle: Any, rows: Sequence[Mapping[str, Any]], per_shard: int, t0: float, shard_t: list[float], sizes: list[int],
          late: list[int]) -> None:
    """Add ``rows`` in shards of ``per_shard`` rows, shard k at ``t0 + k * SHARD_S`` (on schedule, open loop; a shard
    whose turn came while the previous one still waited for room goes at once and counts in ``late``)."""
    for k, first in enumerate(range(0, len(rows), per_shard)):
        due = t0 + k * SHARD_S
        wait = due - time.time()
        if wait > 0:
            time.sleep(wait)
        elif wait < -SHARD_S / 2:
            late[0] += 1
        chunk = [dict(r) for r in rows[first:first + per_shard]]
        shard_t.append(due)
        sizes.append(len(chunk))
        ray.get(handle.add_shard.remote(f"s{k:06d}", chunk))
    ray.get(handle.close_input.remote())


def _apply_all(handle: Any, sequence: Sequence[tuple[float, Plan]], errors: list[str]) -> None:
    """Apply each plan at its time through the runtime's rolling update (``loop.apply.apply_plan``)."""
    for at, plan in sequence:
        wait = at - time.time()
        if wait > 0:
            time.sleep(wait)
        applied = apply_plan(lambda p: ray.get(handle.apply.remote(p)), plan)
        if applied.error:
            errors.append(applied.error)


def run_updates(spec: Any, rows: Sequence[Mapping[str, Any]], sequence: Sequence[tuple[float, Plan]], out: Path) -> Measured:
    """Run ``spec`` fed ``rows`` open loop, applying ``sequence`` ((seconds after the first offer, plan)) on schedule."""
    handle = start_runner(spec, out, name=f"rl-{uuid.uuid4().hex[:6]}", namespace=NAMESPACE, external_input=True,
                          settings=RunnerSettings(device_memory_bytes=DEVICE_MEMORY, queue_max_items=QUEUE_MAX_ITEMS))
    t0 = time.time() + 1.0
    shard_t: list[float] = []
    sizes: list[int] = []
    late, errors = [0], []
    per_shard = max(1, round(OFFERED_ITEMS_PER_S * SHARD_S))
    feeder = threading.Thread(target=_feed, args=(handle, rows, per_shard, t0, shard_t, sizes, late), daemon=True)
    applier = threading.Thread(target=_apply_all, args=(handle, [(t0 + at, p) for at, p in sequence], errors), daemon=True)
    replicas: dict[str, list[tuple[float, int]]] = {}
    try:
        feeder.start()
        applier.start()
        while True:
            summary = ray.get(handle.wait.remote(POLL_S))
            state: RunnerState = ray.get(handle.state.remote())
            for op in state.operators:
                replicas.setdefault(op.name, []).append((round(time.time() - t0, 2), len(op.active)))
            if summary["finished"]:
                break
        feeder.join()
        applier.join()
        latencies: Latencies = ray.get(handle.latencies.remote())
    finally:
        stop_runner(handle)
    data_ids, dead_ids = read_ids(out)
    lost = items_lost((r[ID] for r in rows), data_ids, dead_ids)
    return Measured(offered_times(shard_t, sizes), latencies, list(summary["apply_reports"]), errors, replicas, t0, late[0],
                    time.time() - t0, len(lost), state.error)


def run(quick: bool = False, log: Any = print) -> BenchResult:
    """The benchmark (see the module docstring)."""
    schedule = QUICK if quick else FULL
    profile = PipelineProfile.load(PROFILE)
    items = int(OFFERED_ITEMS_PER_S * schedule.feed_s)
    stream = Workload("regimes", f"{REGIME}:{items}", seed=SEED, time_scale=TIME_SCALE)
    rows = stream.rows(profile)
    suite = SuiteWorkload("cpu-only", PROFILE, DOCS_LAYOUT, 0, stream.regimes, TIME_SCALE,
                          f"documents (tesseract) on {CPUS} CPUs, no GPU, one regime ({REGIME}), time scale {TIME_SCALE:g}")
    a, b = plans(profile, rows, suite.baselines(profile, stream, rows).start("static-default"))
    sequence = [(at, (b if k % 2 == 0 else a).plan(f"forced update {k + 1}: to {'B' if k % 2 == 0 else 'A'}"))
                for k, at in enumerate(schedule.update_at())]
    spec = stream.spec(profile, a, "rollout-latency-cpu-only")
    log(f"rollout-latency: {items} items of {REGIME} offered at {OFFERED_ITEMS_PER_S:g}/s for {schedule.feed_s:g} s; "
        f"A {a.label()}; B {b.label()}; updates at {schedule.update_at()} s")
    own_ray = not ray.is_initialized()
    logging.getLogger("ray").setLevel(logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix="trident-rollout-latency-"))
    t_bench = time.perf_counter()
    try:
        if own_ray:
            start_local_ray(CPUS, 0, attempts=3)
        measured = run_updates(spec, rows, sequence, work / "run")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if own_ray:
            ray.shutdown()
    lat, t0 = measured.latencies, measured.t0
    offered = measured.offered_t
    if len(offered) != len(lat.read_t):
        raise RuntimeError(f"{len(offered)} items offered but {len(lat.read_t)} read: the read order cannot be matched to the offers")
    windows = windows_of(measured.apply_reports)
    warmup_end = t0 + schedule.settle_s
    summary = summarise(offered, lat.done_t, lat.committed_t, windows, measured.items_lost, warmup_end)
    log(f"rollout-latency: {summary['rollouts']} rolling updates, p99 steady {summary['latency_s_p99_steady']} s, "
        f"during {summary['latency_s_p99_during_rollout']} s (ratio {summary['p99_during_rollout_over_steady']}), "
        f"lost {summary['items_lost']}{', error ' + measured.error if measured.error else ''}")
    raw = {
        "workload": {"name": suite.name, "profile": PROFILE, "regime": REGIME, "items": items, "note": suite.note, "seed": SEED},
        "offered_items_per_s": OFFERED_ITEMS_PER_S, "shard_s": SHARD_S, "time_scale": TIME_SCALE, "queue_max_items": QUEUE_MAX_ITEMS,
        "local_s": LOCAL_S, "schedule": {"settle_s": schedule.settle_s, "warmup_s": schedule.warmup_s, "period_s": schedule.period_s, "updates": schedule.updates,
                                         "update_at_s": schedule.update_at(), "warmup_end_s": warmup_end - t0},
        "plans": {"A": {"label": a.label(), **a.to_dict()}, "B": {"label": b.label(), **b.to_dict()}},
        "late_shards": measured.late_shards, "apply_errors": measured.apply_errors,
        "admission_wait_s_p99": _pct((lat.read_t - offered)[~np.isnan(lat.read_t)], 99),
        "bench_seconds": time.perf_counter() - t_bench, "wall_s": measured.wall_s, "error": measured.error,
        "windows": [{"start_s": w.start - t0, "end_s": w.end - t0, "rolling": w.rolling, "steps": list(w.steps), "reason": w.reason}
                    for w in windows],
        "per_rollout": per_rollout(offered, lat.committed_t, windows, t0, warmup_end),
        "per_rollout_done": per_rollout(offered, lat.done_t, windows, t0, warmup_end),
        "apply_reports": measured.apply_reports,
        "items": {name: _seconds(values - t0) for name, values in
                  (("offered_s", offered), ("read_s", lat.read_t), ("done_s", lat.done_t), ("committed_s", lat.committed_t))},
    }
    targets = {"p99_during_rollout_over_steady": Target("<=", TARGET_RATIO), "items_lost": Target("==", 0), "rollouts": Target(">=", 3)}
    return BenchResult("rollout-latency", summary, targets=targets, raw=raw,
                       figure=figure(offered, lat, windows, measured, summary, warmup_end),
                       notes=_notes(quick, suite, a, b, schedule))


def _seconds(values: np.ndarray) -> list[float | None]:
    """Seconds rounded to the millisecond, None where not stamped (JSON has no NaN)."""
    return [None if np.isnan(v) else round(float(v), 3) for v in values]


def _notes(quick: bool, suite: SuiteWorkload, a: StaticConfig, b: StaticConfig, schedule: Schedule) -> str:
    return (f"{'QUICK run (shorter schedule). ' if quick else ''}One live run of the emulated {suite.note}, on one logical node of "
            f"{CPUS} CPUs hosted by this machine's 2 cores, each operator queue bounded at {QUEUE_MAX_ITEMS} items. Open-loop "
            f"source: a shard of {OFFERED_ITEMS_PER_S * SHARD_S:g} items offered every {SHARD_S:g} s on schedule "
            f"({OFFERED_ITEMS_PER_S:g} items/s, below what either configuration moves), so latency is not a backlog's. The "
            f"updates are forced, not trident's decisions: in a stable regime below capacity trident would move once and stay, "
            f"so the runtime's rolling update (Runner.apply through loop.apply.apply_plan, the path trident's plans take) "
            f"applies B, A, B, ... every {schedule.period_s:g} s after {schedule.warmup_s:g} s: A = static-default "
            f"({a.label()}), B = the cost model's best static configuration for this regime at A's batch size ({b.label()}), "
            "the move trident makes in this regime and, back, the one it makes when scans come. Both fill the node, so each "
            "update interleaves retires and starts. Latency (headline): an item's offer (its shard's scheduled time) to its "
            "shard's atomic commit at the sink, so a wait for room at admission counts; done_latency: to its last row written "
            f"(the commit adds the wait for the rest of its {OFFERED_ITEMS_PER_S * SHARD_S:g}-item shard, whose items share "
            "one commit time, and the commit itself). Steady: items offered after the "
            "warm-up and in flight during no apply; during rollout: items in flight (offered before the end, committed after "
            "the start) during a rolling update; by_completion: items committed inside one.")


def figure(offered: np.ndarray, lat: Latencies, windows: Sequence[Window], measured: Measured, summary: Mapping[str, Any],
           warmup_end: float) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = measured.t0
    g = groups(offered, lat.committed_t, windows, warmup_end)
    fig, (ax, ax_rep) = plt.subplots(2, 1, figsize=(13, 7.5), sharex=True, gridspec_kw={"height_ratios": [2.2, 1]})
    for w in windows:
        for a in (ax, ax_rep):
            a.axvspan(w.start - t0, w.end - t0, color="#f4a3a3" if w.rolling else "#fde4c8", alpha=0.7, lw=0)
    styles = {"warmup": ("#bbbbbb", "warm-up"), "steady": ("#3b6fb6", "steady"), "during_other_apply": ("#e69f00", "during another apply"),
              "during_rollout": ("#c0392b", "in flight during a rolling update")}
    commit_s = lat.committed_t - offered
    ax.scatter(offered - t0, lat.done_t - offered, s=2, color="#999999", label="offered -> done", rasterized=True)
    for name, (color, label) in styles.items():
        mask = g[name]
        ax.scatter(offered[mask] - t0, commit_s[mask], s=4, color=color, label=f"{label} ({int(mask.sum())})", rasterized=True)
    for key, color in (("latency_s_p99_steady", "#3b6fb6"), ("latency_s_p99_during_rollout", "#c0392b")):
        if summary.get(key) is not None:
            ax.axhline(summary[key], color=color, ls="--", lw=1, label=f"{key} {summary[key]:.2f} s")

    def shown(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.2f}"
    ax.set_title(f"rollout-latency: item latency (offered -> committed) over offered time, {OFFERED_ITEMS_PER_S:g} items/s open loop; "
                 f"{summary['rollouts']} rolling updates shaded; p99 during / steady: {shown(summary.get('p99_during_rollout_over_steady'))} "
                 f"(offered -> done {shown(summary.get('done_p99_during_rollout_over_steady'))})", fontsize=9)
    ax.set_ylabel("latency (s)")
    ax.legend(fontsize=7, loc="upper left", markerscale=3)
    for op, series in measured.replicas.items():
        ax_rep.step([p[0] for p in series], [p[1] for p in series], where="post", label=op)
    ax_rep.set_ylabel("replicas")
    ax_rep.set_xlabel("seconds since the first shard was offered")
    ax_rep.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    return fig
