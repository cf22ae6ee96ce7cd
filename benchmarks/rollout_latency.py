"""Benchmark ``rollout-latency``: does an item's end-to-end latency stay stable while trident rolls out changes?

Contract of ``run(quick) -> BenchResult``:
- Workload: the closed-loop suite's ``cpu-only`` stream (``BLOCKS`` of ``BLOCK_S`` production
  seconds each, ``QUICK_BLOCK_S`` when quick) with trident starting from static-default in the
  runtime's control loop (a tick every ``TICK_S``); the source is read as fast as the queues
  (``QUEUE_MAX_ITEMS``) take it, so an item's latency is mostly its wait in the queues ahead of it.
- Measured per input item: read and done times from ``PipelineRunner.latencies()`` (latency = done
  - read; the commit latency beside it) and each apply's window from the runner's apply reports.
- ``summarise(read_t, done_t, commit_t, windows, items_lost)`` (pure): steady against
  during-rollout p50/p99; targets ``p99_during_rollout_over_steady`` <= ``TARGET_RATIO`` and
  ``items_lost`` 0.
- ``raw``: the stream, apply reports, per rolling update its steps, dip and the p99 of items done
  during it and ``LOCAL_S`` before and after; per-block figures; every item's (read, done). The
  figure plots every item's latency over time, rolling updates shaded, with trident's replicas below.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import ray

from benchmarks.closed_loop_workload import Workload
from benchmarks.lineage import items_lost
from benchmarks.local_ray import start_local_ray
from benchmarks.report import BenchResult, Target
from benchmarks.suite_workloads import CPUS, DEVICE_MEMORY, SEED, TIME_SCALE, SuiteWorkload, equal_time_regimes
from trident_flows.control.launch import start_runner, stop_runner
from trident_flows.control.loop import ControlLoop
from trident_flows.core.state import RunnerSettings, RunnerState
from trident_flows.core.types import ClusterSpec, StepKind
from trident_flows.pipelines.emulated_docs import LAYOUT as DOCS_LAYOUT
from trident_flows.runtime.costmodel import PipelineProfile
from trident_flows.runtime.latency import Latencies
from trident_flows.runtime.sink import read_ids
from trident_flows.runtime.spec import ID
from trident_flows.scheduler.policies import make_policy

BLOCKS = ("short", "scans", "long", "short")
TICK_S = 1.0
NAMESPACE = "rollout-latency"
BLOCK_S, QUICK_BLOCK_S = 150.0, 25.0
PROFILE = "documents"
LOCAL_S = 30.0  # the stretch before a rolling update its items are compared with
# Each queue holds this many items or what the pools on both sides hold in flight (backpressure.items_bound), not the
# default 512: at 512 the six queues hold minutes of this stream's throughput, and a stream that fits the benchmark's
# time would be little more than the pipeline filling and draining. A shorter queue also makes a throughput dip a
# larger share of an item's stay: the stricter test.
QUEUE_MAX_ITEMS = 64
FILL_WINDOW_S, FILL_GROWTH = 10.0, 0.05
POLL_S = 1.0
TARGET_RATIO = 1.2


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


def _touches(read_t: np.ndarray, done_t: np.ndarray, windows: Sequence[Window], by: str) -> np.ndarray:
    """Items in flight during any of ``windows`` (``by="in_flight"``: read before its end, done after its start) or done
    inside one (``by="completion"``)."""
    mask = np.zeros(len(read_t), dtype=bool)
    for w in windows:
        mask |= ((read_t < w.end) & (done_t > w.start)) if by == "in_flight" else ((done_t >= w.start) & (done_t <= w.end))
    return mask


def fill_end(read_t: np.ndarray, done_t: np.ndarray) -> float:
    """When the pipeline's fill ended: the first time the number of items in it (read, not yet done) grows by less
    than ``FILL_GROWTH`` of itself in the next ``FILL_WINDOW_S`` seconds (the last read when it never does)."""
    reads = np.sort(read_t[~np.isnan(read_t)])
    if not len(reads):
        return np.inf
    dones = np.sort(done_t[~np.isnan(done_t)])

    def held(t: np.ndarray) -> np.ndarray:
        return np.searchsorted(reads, t, "right") - np.searchsorted(dones, t, "right")

    grid = np.arange(reads[0], reads[-1], 0.5)
    now, later = held(grid), held(grid + FILL_WINDOW_S)
    settled = np.flatnonzero((now > 0) & (later - now < FILL_GROWTH * now))
    return float(grid[settled[0]]) if len(settled) else float(reads[-1])


def groups(read_t: np.ndarray, done_t: np.ndarray, windows: Sequence[Window], by: str = "in_flight") -> dict[str, np.ndarray]:
    """Masks over the items: ``fill``, ``during_rollout``, ``during_other_apply``, ``steady`` (items done only), an item
    being during a window when it was in flight then or, ``by="completion"``, done then (see the module docstring)."""
    done = ~np.isnan(done_t)
    fill = done & (read_t < fill_end(read_t, done_t))
    rolling = done & ~fill & _touches(read_t, done_t, [w for w in windows if w.rolling], by)
    other = done & ~fill & ~rolling & _touches(read_t, done_t, [w for w in windows if not w.rolling], by)
    return {"fill": fill, "during_rollout": rolling, "during_other_apply": other, "steady": done & ~fill & ~rolling & ~other}


def _pct(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _compared(lat: np.ndarray, commit: np.ndarray, g: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """p50/p99 latency steady and during rolling updates, their ratios, the commit latency's p99 and the item counts."""
    p = {f"latency_s_p{q}_{name}": _pct(lat[g[name]], q) for name in ("steady", "during_rollout") for q in (50, 99)}
    return {
        **p,
        "p99_during_rollout_over_steady": _ratio(p["latency_s_p99_during_rollout"], p["latency_s_p99_steady"]),
        "p50_during_rollout_over_steady": _ratio(p["latency_s_p50_during_rollout"], p["latency_s_p50_steady"]),
        **{f"commit_latency_s_p99_{name}": _pct(commit[g[name] & ~np.isnan(commit)], 99) for name in ("steady", "during_rollout")},
        **{f"items_{name}": int(mask.sum()) for name, mask in g.items()},
    }


def summarise(read_t: np.ndarray, done_t: np.ndarray, commit_t: np.ndarray, windows: Sequence[Window], items_lost: int) -> dict[str, Any]:
    """The benchmark's summary from every item's read, done and commit times and the apply windows: the items in flight
    during a rolling update at the top level, those done during one under ``by_completion``.

    Items done are sorted into *fill* (read before ``fill_end``: the queues filling from empty, until the items in the
    pipeline first grow by under ``FILL_GROWTH`` of themselves in the next ``FILL_WINDOW_S`` s), *during rollout* (in
    flight during a rolling update, an apply that started and retired replicas: read before its window ended and done
    after it began), *during other apply* (in flight only during applies that only started or only retired replicas,
    canaries included: in neither group compared) and *steady* (the rest). Figures: ``rollouts``, p50/p99 latency steady
    and during rollouts, ``p99_during_rollout_over_steady``, ``p50_during_rollout_over_steady``, the same p99s of the
    commit latency, the counts per group and ``items_lost``; ``by_completion`` counts an item during a window when it
    was done inside it (what an observer of the outputs sees). None where a group is empty. Trident rolls out when a
    regime change has made its configuration wrong, so both groupings mix what the update costs with the backlog the
    regime built before it: the per-update figures in ``raw`` separate them."""
    lat, commit = done_t - read_t, commit_t - read_t
    return {
        "rollouts": sum(w.rolling for w in windows),
        "other_applies": sum(not w.rolling for w in windows),
        **_compared(lat, commit, groups(read_t, done_t, windows, "in_flight")),
        "by_completion": _compared(lat, commit, groups(read_t, done_t, windows, "completion")),
        "items_lost": items_lost,
    }


def per_rollout(read_t: np.ndarray, done_t: np.ndarray, windows: Sequence[Window], t0: float) -> list[dict[str, Any]]:
    """Per rolling update: its steps and dip; the items in flight during it; and the items done during it against those
    done in the ``LOCAL_S`` seconds before it began and after it ended (fill left out): the latency the pipeline
    delivered just around it, whatever the regime."""
    fill = groups(read_t, done_t, windows)["fill"]
    lat = done_t - read_t
    out = []
    for w in (w for w in windows if w.rolling):
        spans = {"in_flight": _touches(read_t, done_t, [w], "in_flight"),
                 "done_before": (done_t >= w.start - LOCAL_S) & (done_t < w.start),
                 "done_during": (done_t >= w.start) & (done_t <= w.end),
                 "done_after": (done_t > w.end) & (done_t <= w.end + LOCAL_S)}
        out.append({"start_s": w.start - t0, "seconds": w.end - w.start, "steps": list(w.steps), "dip": w.dip, "reason": w.reason,
                    **{f"{name}_{key}": value for name, mask in spans.items()
                       for key, value in (("items", int((mask & ~fill).sum())), ("latency_s_p99", _pct(lat[mask & ~fill], 99)))}})
    return out


def per_regime(read_t: np.ndarray, done_t: np.ndarray, windows: Sequence[Window], blocks: Sequence[tuple[str, int, int]]) -> list[dict[str, Any]]:
    """Steady p50/p99 latency of each regime block's items (items in read order: item k is the stream's row k)."""
    g = groups(read_t, done_t, windows)
    lat = done_t - read_t
    out = []
    for k, (regime, first, end) in enumerate(blocks):
        steady = lat[first:end][g["steady"][first:end]]
        during = lat[first:end][g["during_rollout"][first:end]]
        out.append({"block": k, "regime": regime, "items": end - first, "steady_items": len(steady), "steady_latency_s_p50": _pct(steady, 50),
                    "steady_latency_s_p99": _pct(steady, 99), "during_rollout_items": len(during), "during_rollout_latency_s_p99": _pct(during, 99)})
    return out


@dataclass
class Measured:
    """One run's per-item times, apply reports, replica counts over time and outcome."""

    latencies: Latencies
    apply_reports: list[dict[str, Any]]
    replicas: dict[str, list[tuple[float, int]]]
    started: float
    wall_s: float
    items_lost: int
    reconfigurations: int
    error: str


def run_trident(spec: Any, policy: Any, out: Path) -> Measured:
    """Run ``spec`` with ``policy`` in the control loop to the end; keep what ``summarise`` and the figure need."""
    handle = start_runner(spec, out, name=f"rl-{uuid.uuid4().hex[:6]}", namespace=NAMESPACE,
                          settings=RunnerSettings(device_memory_bytes=DEVICE_MEMORY, queue_max_items=QUEUE_MAX_ITEMS))
    started = time.time()
    loop = ControlLoop(handle, policy, TICK_S).start()
    replicas: dict[str, list[tuple[float, int]]] = {}
    try:
        while True:
            summary = ray.get(handle.wait.remote(POLL_S))
            state: RunnerState = ray.get(handle.state.remote())
            for op in state.operators:
                replicas.setdefault(op.name, []).append((round(time.time() - started, 2), len(op.active)))
            if summary["finished"]:
                break
        latencies: Latencies = ray.get(handle.latencies.remote())
    finally:
        stop_runner(handle, loop)
    data_ids, dead_ids = read_ids(out)
    lost = items_lost((r[ID] for r in spec.source()), data_ids, dead_ids)
    return Measured(latencies, list(summary["apply_reports"]), replicas, started, time.time() - started, len(lost),
                    state.reconfigurations, state.error)


def workload(quick: bool) -> SuiteWorkload:
    """The suite's cpu-only workload with this benchmark's block length."""
    seconds = QUICK_BLOCK_S if quick else BLOCK_S
    regimes = equal_time_regimes(PipelineProfile.load(PROFILE), 0, BLOCKS, seconds)
    return SuiteWorkload("cpu-only", PROFILE, DOCS_LAYOUT, 0, regimes, TIME_SCALE,
                         f"documents (tesseract) on {CPUS} CPUs, no GPU, blocks of {seconds:g} s each at their optimum "
                         f"(production time), time scale {TIME_SCALE:g}")


def run(quick: bool = False, log: Any = print) -> BenchResult:
    """The benchmark (see the module docstring)."""
    suite = workload(quick)
    profile = PipelineProfile.load(suite.profile)
    stream = Workload("regimes", suite.regimes, seed=SEED, time_scale=suite.time_scale)
    baselines = suite.baselines(profile, stream, stream.rows(profile))
    spec = stream.spec(profile, baselines.start("trident"), "rollout-latency-cpu-only")
    log(f"rollout-latency: {stream.regimes} ({stream.items} items) at time scale {suite.time_scale:g}; "
        f"trident from static-default {baselines.start('trident').label()}")
    own_ray = not ray.is_initialized()
    logging.getLogger("ray").setLevel(logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix="trident-rollout-latency-"))
    t_bench = time.perf_counter()
    try:
        if own_ray:
            start_local_ray(CPUS, suite.gpus, attempts=3)
        cluster = ClusterSpec.single_node(CPUS, suite.gpus, gpu_memory_bytes=DEVICE_MEMORY)
        measured = run_trident(spec, make_policy("trident", spec=spec, cluster=cluster), work / "trident")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if own_ray:
            ray.shutdown()
    lat = measured.latencies
    windows = windows_of(measured.apply_reports)
    summary = summarise(lat.read_t, lat.done_t, lat.committed_t, windows, measured.items_lost)
    t0 = float(np.nanmin(lat.read_t)) if len(lat.read_t) else measured.started
    log(f"rollout-latency: {summary['rollouts']} rolling updates, p99 steady {summary['latency_s_p99_steady']} s, "
        f"during {summary['latency_s_p99_during_rollout']} s, lost {summary['items_lost']}{', error ' + measured.error if measured.error else ''}")
    raw = {
        "workload": {"name": suite.name, "profile": suite.profile, "regimes": stream.regimes, "items": stream.items, "blocks": stream.blocks(),
                     "note": suite.note, "seed": SEED, "start": baselines.start("trident").label()},
        "time_scale": suite.time_scale, "tick_s": TICK_S, "local_s": LOCAL_S, "queue_max_items": QUEUE_MAX_ITEMS,
        "fill_end_s": fill_end(lat.read_t, lat.done_t) - t0, "bench_seconds": time.perf_counter() - t_bench,
        "wall_s": measured.wall_s, "reconfigurations": measured.reconfigurations, "error": measured.error,
        "windows": [{"start_s": w.start - t0, "end_s": w.end - t0, "rolling": w.rolling, "steps": list(w.steps), "reason": w.reason}
                    for w in windows],
        "per_rollout": per_rollout(lat.read_t, lat.done_t, windows, t0),
        "per_regime": per_regime(lat.read_t, lat.done_t, windows, stream.blocks()),
        "apply_reports": measured.apply_reports,
        "items": {"read_s": _seconds(lat.read_t - t0), "done_s": _seconds(lat.done_t - t0)},
    }
    targets = {"p99_during_rollout_over_steady": Target("<=", TARGET_RATIO), "items_lost": Target("==", 0), "rollouts": Target(">=", 3)}
    return BenchResult("rollout-latency", summary, targets=targets, raw=raw, figure=figure(lat, windows, measured, summary, t0),
                       notes=_notes(quick, suite, stream.regimes))


def _seconds(values: np.ndarray) -> list[float | None]:
    """Seconds rounded to the millisecond, None where not stamped (JSON has no NaN)."""
    return [None if np.isnan(v) else round(float(v), 3) for v in values]


def _notes(quick: bool, suite: SuiteWorkload, regimes: str) -> str:
    return (f"{'QUICK run (short blocks: trident has little time to act). ' if quick else ''}One live run of trident on the emulated "
            f"{suite.note} ({regimes}), from static-default, on one logical node of {CPUS} CPUs hosted by this machine's 2 cores, "
            f"each operator queue bounded at {QUEUE_MAX_ITEMS} items (or what the pools beside it hold in flight). "
            "Latency: an input item's read (the feed hands it to operator 0's queue) to done (its last row written or "
            "dead-lettered); the commit latency runs to its shard's atomic commit. Steady: items read after the pipeline's fill "
            "and in flight during no apply; during rollout: items in flight (read before the end, done after the start) during a "
            "rolling update, an apply that started and retired replicas; items in flight only during other applies (canaries, "
            "scale-only) are in neither group; by_completion: the same with items sorted by when they were done. Trident rolls "
            "out after a regime change has made its configuration wrong (the scans and long blocks run about 10x slower), so both "
            "groupings mix what an update costs with the backlog built before it; raw.per_rollout compares the items done "
            "during each update with those done just before and after it.")


def figure(lat: Latencies, windows: Sequence[Window], measured: Measured, summary: Mapping[str, Any], t0: float) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    g = groups(lat.read_t, lat.done_t, windows)
    fig, (ax, ax_rep) = plt.subplots(2, 1, figsize=(13, 7.5), sharex=True, gridspec_kw={"height_ratios": [2.2, 1]})
    for w in windows:
        for a in (ax, ax_rep):
            a.axvspan(w.start - t0, w.end - t0, color="#f4a3a3" if w.rolling else "#fde4c8", alpha=0.7, lw=0)
    styles = {"fill": ("#bbbbbb", "fill"), "steady": ("#3b6fb6", "steady"), "during_other_apply": ("#e69f00", "during another apply"),
              "during_rollout": ("#c0392b", "in flight during a rolling update")}
    lat_s = lat.done_t - lat.read_t
    for name, (color, label) in styles.items():
        mask = g[name]
        ax.scatter(lat.done_t[mask] - t0, lat_s[mask], s=3, color=color, label=f"{label} ({int(mask.sum())})", rasterized=True)
    for key, color in (("latency_s_p99_steady", "#3b6fb6"), ("latency_s_p99_during_rollout", "#c0392b")):
        if summary.get(key) is not None:
            ax.axhline(summary[key], color=color, ls="--", lw=1, label=f"{key} {summary[key]:.1f} s")
    def shown(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.2f}"
    ax.set_title(f"rollout-latency: item latency (read -> done) over completion time; {summary['rollouts']} rolling updates shaded "
                 f"(other applies lighter); p99 during / steady: {shown(summary.get('p99_during_rollout_over_steady'))} in flight, "
                 f"{shown(summary['by_completion'].get('p99_during_rollout_over_steady'))} done during", fontsize=9)
    ax.set_ylabel("latency (s)")
    ax.legend(fontsize=7, loc="upper left", markerscale=3)
    offset = measured.started - t0
    for op, series in measured.replicas.items():
        ax_rep.step([p[0] + offset for p in series], [p[1] for p in series], where="post", label=op)
    ax_rep.set_ylabel("replicas")
    ax_rep.set_xlabel("seconds since the first item was read")
    ax_rep.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    return fig
