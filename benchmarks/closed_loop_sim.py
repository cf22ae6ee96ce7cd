"""Benchmark ``closed-loop-sim``: the closed-loop comparison in the simulator, on 1 to 256 nodes
and streams of simulated hours. Every figure here is SIMULATED (``trident_flows.sim``).

Contract of ``run(quick, workloads=, systems=, hours=, repeats=, jobs=, journal=, resume=) -> BenchResult``:
- Workloads (``WORKLOADS``; default ``DEFAULT_WORKLOADS``, quick: documents and video on 1 and 8
  nodes): a pipeline on ``N`` nodes of ``NODE``, a regime schedule (``SCHEDULES``) of ``HOURS[N]``
  hours made item counts (``prepare``), seeded and finite: every system curates the same items.
- Systems (``SYSTEMS``): static-avg, each regime's best static, ``oracle``, ``ds2``, ``threshold``
  and ``trident``, ticking every ``TICK_S`` simulated seconds, each tick's CPU time charged (Ray
  Data's autoscaler and cosmos-xenna schedule with their own runtimes: they cannot be simulated).
- Per run: throughput, OOMs, reconfigurations, tick milliseconds, simulation wall seconds and
  events; trident's runs at ``REPEATED_NODES`` repeat ``repeats`` times (``merge_repeats``), its
  tick-target runs at ``ALONE_NODES`` run alone; a static whose config equals an earlier one is run once.
- Summary: ``summarise``. ``journal``/``resume``: finished runs are kept in a ``RunJournal`` and a
  resumed benchmark reruns only what changed (``raw.from_journal``); ``jobs``: worker processes.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from benchmarks.closed_loop_workload import Workload
from benchmarks.oracle_policy import OraclePolicy
from benchmarks.report import BenchResult, Target
from benchmarks.sim_headroom import steady_rate
from benchmarks.wide_pipeline import WIDE, load_profile
from trident_flows.core.types import ClusterSpec, NodeClass
from trident_flows.pipelines.emulated import Stage, emulated_pipeline, regime_plan
from trident_flows.runtime.costmodel import PipelineProfile
from trident_flows.scheduler.policies import make_policy
from trident_flows.sim.driver import simulate
from trident_flows.sim.setup import CPU_BATCH, GPU_BATCHES, mean_features, schedule_counts
from trident_flows.sim.static_search import StaticConfig, predict_throughput, search_static
from trident_flows.sim.workload import Stream

NODE = dict(cpus=16, gpus=2, gpu_memory_bytes=8 * 2**30)
NODES = (1, 8, 64, 256)
QUICK_NODES = (1, 8)
PIPELINES = ("documents", "video")
# the tick target is for 256 nodes x 10 operators: ``documents10`` (``wide_pipeline``, composed from the
# committed documents profile)
WIDE_WORKLOADS = tuple(f"{WIDE}-{n}" for n in NODES)
# ``--workloads`` picks pipeline-nodes pairs (e.g. ``documents-8,video-8``)
WORKLOADS = (*(f"{p}-{n}" for p in PIPELINES for n in NODES), *WIDE_WORKLOADS)
# the full run: both pipelines on 1, 8 and 64 nodes and the 10-operator documents on 256. The simulator
# costs about 40 CPU us per event (~2 events per batch; ~4,000 batches per simulated second on 256 nodes of
# documents10), so a 2-hour 256-node stream costs ~1 CPU hour per system: on 2 cores the 256-node runs are
# the tick target's, and documents and video there are left to ``--workloads``
DEFAULT_WORKLOADS = (*(f"{p}-{n}" for p in PIPELINES for n in (1, 8, 64)), f"{WIDE}-256")
# simulated hours of stream per node count
HOURS = dict.fromkeys(NODES, 2.0)
TICK_S = 10.0
HEADROOM_MIN = 1.05
SCHEDULES = {"documents": "short:20m,long:5m,scans:10m,short:1m,long:30m,scans:3m",
             "video": "small:20m,hd:10m,long:5m,small:1m,hd:30m,long:3m"}
QUICK_SCHEDULES = {"documents": "short:3m,long:1m,scans:2m", "video": "small:3m,hd:2m,long:1m"}
SCHEDULES[WIDE], QUICK_SCHEDULES[WIDE] = SCHEDULES["documents"], QUICK_SCHEDULES["documents"]
PIPELINE_NAMES = {"documents": "emulated-docs", "video": "emulated-video", WIDE: "emulated-docs10"}
SEED = 11
# a steady rate is measured on a stream of this many seconds of the config's predicted rate (the model
# predicts 2.5x under the simulator on 8-node documents: ~25 simulated s), at least STEADY_ITEMS_MIN items
STEADY_S = 60.0
STEADY_ITEMS_MIN = 3000
SIM_HEADROOM_MAX_NODES = 8  # the simulated headroom is measured where captured is reported (it costs 12 steady rates)
ADAPTIVE = ("oracle", "ds2", "threshold", "trident")
# trident's runs where its targets are measured repeat (its decisions follow the CPU time each tick is charged,
# so one run of a cell is one draw: 8-node documents gave 0.93-0.99x the best static in single runs of the
# same code family); its figures there are the repeats' median throughput and the p95 of all their ticks
REPEATS = 3
# (on 256 nodes one 2-hour run ticks ~700 times: its tick p95 needs no repeats, and a repeat costs a CPU hour)
REPEATED_NODES = (8,)
# trident's tick time is a target at 256 nodes x 10 operators: its documents10 runs there go one at a time after
# the others (its runs on the other 256-node workloads, whose ticks are no target, run beside others), so that no
# simulation beside them on the other core inflates the CPU time their ticks are charged (on 2 cores, the
# same code's 256-node tick p95 was 1,214 ms in the full run, 1,075 ms run with only a static run beside it)
ALONE_NODES = (256,)
# every system a workload may run (``--systems``); a per-regime static that a pipeline lacks is skipped there
SYSTEMS = ("static-avg", "static-short", "static-long", "static-scans", "static-small", "static-hd", *ADAPTIVE)


def cluster(nodes: int) -> ClusterSpec:
    return ClusterSpec((NodeClass("node", nodes, NODE["cpus"], NODE["gpus"], NODE["gpu_memory_bytes"]),))


def _scaled(config: StaticConfig, nodes: int) -> StaticConfig:
    return StaticConfig(tuple((n, c, r * nodes) for n, c, r in config.assignment), config.predicted_items_per_s * nodes)


def configs(profile: PipelineProfile, schedule: Sequence[tuple[str, int]], nodes: int) -> dict[str, StaticConfig]:
    """static-avg and each regime's best config, searched per node and replicated over ``nodes``."""
    weights: dict[str, float] = {}
    for regime, count in schedule:
        weights[regime] = weights.get(regime, 0.0) + count
    kw = dict(cpus=NODE["cpus"], gpus=NODE["gpus"], device_memory_bytes=NODE["gpu_memory_bytes"], gpu_batches=GPU_BATCHES,
              cpu_batch=CPU_BATCH)
    out = {"static-avg": _scaled(search_static(profile, mean_features(profile, weights), **kw), nodes)}
    for regime in weights:
        out[f"static-{regime}"] = _scaled(search_static(profile, mean_features(profile, {regime: 1.0}), **kw), nodes)
    return out


def model_headroom(profile: PipelineProfile, blocks: Sequence[tuple[str, int]], statics: Mapping[str, StaticConfig]) -> dict[str, Any]:
    """Free per-regime switching over the best single static config, by the cost model."""
    def stream_rate(pick: Any) -> float:
        seconds = sum(count / predict_throughput(profile, pick(regime).as_dict(), mean_features(profile, {regime: 1.0}))
                      for regime, count in blocks)
        return sum(c for _, c in blocks) / seconds

    free = stream_rate(lambda r: statics[f"static-{r}"])
    singles = {name: stream_rate(lambda r, c=c: c) for name, c in statics.items()}
    best = max(singles, key=singles.get)
    return {"free_switch_items_per_s": free, "best_static": best, "best_static_items_per_s": singles[best], "ratio": free / singles[best],
            "singles": singles}


def run_one(pipeline: str, system: str, nodes: int, schedule: str, items: int, statics: Mapping[str, StaticConfig],
            seed: int = SEED) -> dict[str, Any]:
    profile = load_profile(pipeline)
    start = statics["static-avg"] if not system.startswith("static-") else statics[system]
    cap = NODE["cpus"] * nodes
    stages = [Stage(n, c, r, max_replicas=max(cap, r)) for n, c, r in start.assignment]
    spec = emulated_pipeline(profile, stages, name=PIPELINE_NAMES[pipeline], items=0, regimes=schedule, seed=seed)
    features = sorted({f for m in profile.workloads.values() for f in m})
    stream = Stream.generate(profile.workloads, schedule, items, features, seed)
    spec_cluster = cluster(nodes)
    if system == "oracle":
        blocks, k = [], 0
        for regime, count in regime_plan(profile.workloads, items, schedule):
            blocks.append((regime, k, k + count))
            k += count
        per_regime = {r: statics[f"static-{r}"] for r in {b[0] for b in blocks}}
        policy = OraclePolicy(blocks, per_regime, spec_cluster.total_cpus, spec_cluster.total_gpus)
    elif system in ADAPTIVE:
        policy = make_policy(system, spec=spec, cluster=spec_cluster)
    else:
        policy = None
    run = simulate(spec, spec_cluster, policy, tick_s=TICK_S, stream=stream, record_s=60.0)
    s = run.summary
    return {"pipeline": pipeline, "system": system, "nodes": nodes, "items": items, "items_per_s": s["steady_items_per_s"],
            "wall_s": s["wall_s"], "ooms": s["ooms"], "reconfigurations": s["reconfigurations"], "items_missing": s["items_missing"],
            "items_dead_lettered": s["items_dead_lettered"], "tick_ms_p50": s["tick_ms_p50"], "tick_ms_p95": s["tick_ms_p95"], "tick_wall_ms_p95": s["tick_wall_ms_p95"],
            "ticks": len(run.tick_ms), "tick_ms": [round(t, 1) for t in run.tick_ms] if system == "trident" else [], **_applies(run), "sim_wall_s": s["sim_wall_s"], "sim_cpu_s": s["sim_cpu_s"], "events": s["events"], "error": s["error"],
            "timeline": [(p["t"], round(p["items_per_s"], 2)) for p in run.timeline], **decisions(policy)}


def _applies(run: Any) -> dict[str, Any]:
    """Simulated seconds the control loop spent applying plans (it ticks again only after an apply, as live), and the
    applies that did not land (a START no node has room for fails at once while nothing drains, as the runtime's rollout)."""
    reports = run.runner.apply_reports
    return {"apply_s": round(sum(r.seconds for r in reports), 1),
            "applies_not_landed": [{"seconds": round(r.seconds, 1), "error": r.error[:160]} for r in reports if r.error]}


MOVES_KEPT = 40  # decisions kept per run in the report (a 4-hour run ticks 1,440 times)


def decisions(policy: Any) -> dict[str, Any]:
    """Why an adaptive policy moved or held (its ``records``, the ticks it still keeps): how often each
    hold kind came up, on how many ticks each failed steps' errors came up (the first 160 characters;
    a tick can hold for another reason while a step fails), and the first ``MOVES_KEPT`` ticks that
    issued a plan, with their reasons."""
    records = list(getattr(policy, "records", ()))
    if not records:
        return {}
    holds = Counter(r.decision.hold.kind.value for r in records if r.decision.hold is not None)
    failed = Counter(r.error[:160] for r in records if r.error)
    moves = [{"tick": r.tick, "action": r.decision.action.value, "reason": r.decision.reason[:300]} for r in records if r.decision.plan is not None]
    return {"holds": dict(holds.most_common()), "failed_steps": dict(failed.most_common()), "moves": moves[:MOVES_KEPT],
            "last_reason": records[-1].decision.reason[:300]}


class SteadyRates:
    """Steady input items/s of static configs on each regime alone, in the simulator on ``nodes`` nodes
    (``sim_headroom.steady_rate``), each measured once."""

    def __init__(self, profile: PipelineProfile, nodes: int) -> None:
        self.profile, self.nodes, self.cluster = profile, nodes, cluster(nodes)
        self._rates: dict[tuple[tuple[tuple[str, Any, int], ...], str], float] = {}

    def rate(self, config: StaticConfig, regime: str) -> float:
        key = (config.assignment, regime)
        if key not in self._rates:
            predicted = predict_throughput(self.profile, config.as_dict(), mean_features(self.profile, {regime: 1.0}))
            count = max(STEADY_ITEMS_MIN, int(STEADY_S * predicted))
            allocation = tuple((name, ((c, r),)) for name, c, r in config.assignment)
            self._rates[key] = steady_rate(self.profile, allocation, regime, count, Workload("steady", f"{regime}:1", SEED, 1.0),
                                           self.cluster)
        return self._rates[key]

    def rates(self, config: StaticConfig, regimes: Sequence[str]) -> dict[str, float]:
        return {r: self.rate(config, r) for r in dict.fromkeys(regimes)}


def simulated_headroom(meter: SteadyRates, blocks: Sequence[tuple[str, int]], statics: Mapping[str, StaticConfig]) -> dict[str, Any]:
    """``model_headroom`` with each config's rate on each regime measured in the simulator (``SteadyRates``)."""
    def stream_rate(pick: Any) -> float:
        return sum(c for _, c in blocks) / sum(count / max(pick(regime), 1e-9) for regime, count in blocks)

    regimes = list(dict.fromkeys(r for r, _ in blocks))
    rates = {name: meter.rates(c, regimes) for name, c in statics.items()}
    free = stream_rate(lambda r: max(rates[name][r] for name in statics))
    singles = {name: stream_rate(lambda r, name=name: rates[name][r]) for name in statics}
    best = max(singles, key=singles.get)
    return {"free_switch_items_per_s": free, "best_static": best, "best_static_items_per_s": singles[best], "ratio": free / singles[best],
            "singles": singles, "rates": rates}


def _items_for(profile: PipelineProfile, schedule: str, rates: Mapping[str, float], hours: float, whole: bool = True) -> int:
    """Items of ``hours`` of the schedule at ``rates`` (static-avg's per regime, measured in the simulator),
    block after block, the last one cut where the hours end: at least one whole pass, or (``whole=False``,
    a chosen ``hours``) exactly ``hours``, which may end inside a pass. (Items in proportion to time: a
    20-minute block of short documents holds 50x the items of a 5-minute block of long ones.)"""
    blocks = regime_plan(profile.workloads, None, schedule)
    left, items = hours * 3600.0, 0
    while left > 1e-9:
        for regime, count in blocks:
            seconds = count / max(rates[regime], 1e-9)
            if seconds > left:
                items += int(left * rates[regime])
                left = 0.0
                break
            items += count
            left -= seconds
    return max(1, items, sum(c for _, c in blocks) if whole else 1)


def figure(rows: list[dict[str, Any]], summary: Mapping[str, Any]) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pipelines = sorted({r["pipeline"] for r in rows})
    every = sorted({r["system"] for r in rows})
    color = {system: plt.get_cmap("tab10")(k % 10) for k, system in enumerate(every)}  # one colour per system in every panel
    fig, axes = plt.subplots(1, len(pipelines), figsize=(6 * len(pipelines), 4.5), squeeze=False)
    for ax, pipeline in zip(axes[0], pipelines):
        mine = [r for r in rows if r["pipeline"] == pipeline and r["items_per_s"]]
        nodes = sorted({r["nodes"] for r in mine})
        systems = sorted({r["system"] for r in mine})
        width = 0.8 / max(1, len(systems))
        for k, system in enumerate(systems):
            vals = []
            for n in nodes:
                base = next((r["items_per_s"] for r in mine if r["nodes"] == n and r["system"] == "static-avg"), None)
                val = next((r["items_per_s"] for r in mine if r["nodes"] == n and r["system"] == system), None)
                vals.append(val / base if val and base else 0.0)
            ax.bar(np.arange(len(nodes)) + k * width - 0.4 + width / 2, vals, width, label=system, color=color[system])
        ax.axhline(1.0, color="k", lw=0.6)
        ax.set_xticks(np.arange(len(nodes)), [f"{n} nodes" for n in nodes])
        ax.set_ylabel("throughput / static-avg")
        ax.set_title(f"SIMULATED closed loop, {pipeline}")
        ax.legend(fontsize=7)
    fig.suptitle("closed-loop-sim (simulated): " + ", ".join(
        f"{key}={value:.3g}" if isinstance(value, float) else f"{key}={value}"
        for key, value in ((k, summary.get(k)) for k in ("captured_8_nodes", "worst_vs_best_static_8_nodes"))))
    fig.tight_layout()
    return fig


def prepare(key: str, quick: bool, hours: float | None) -> dict[str, Any]:
    """A workload (pipeline-nodes pair) ready to run: its schedule (durations made counts at the
    rates static-avg sustains in the simulator), item count, static configs and headroom.

    Durations become item counts at the rate static-avg SUSTAINS IN THE SIMULATOR on each regime alone
    (``SteadyRates``; static-avg is searched on counts made first with the equal-mix static-avg, then the
    counts are made again with it), not at the cost model's prediction, which can be far under the
    simulator's rate (a stream of "0.5 hours" would then end inside its first block). Headroom: the stream's
    throughput with each block run by its regime's best config switched for free, over the best single
    static's, by the cost model (``model_headroom``) and, up to ``SIM_HEADROOM_MAX_NODES``, measured in the
    simulator (``simulated_headroom``); the larger is used (the model's bounds what the simulator measured
    where it can, the simulator's shows headroom where the model sees none). A workload "has headroom" at
    ``HEADROOM_MIN`` or more."""
    pipeline, n = key.rsplit("-", 1)[0], int(key.rsplit("-", 1)[1])
    profile = load_profile(pipeline)
    # the schedule's durations become counts at the rates the 1-node static-avg times the nodes sustains in the simulator
    meter = SteadyRates(profile, n)
    base = configs(profile, [(r, 1) for r in profile.workloads], 1)
    start = _scaled(base["static-avg"], n)
    durations = (QUICK_SCHEDULES if quick else SCHEDULES)[pipeline]
    schedule = schedule_counts(durations, profile, start, rates=meter.rates(start, list(profile.workloads)))
    # once more at the rates of the static-avg searched on those counts, the config every system starts from
    avg = configs(profile, regime_plan(profile.workloads, None, schedule), n)["static-avg"]
    schedule = schedule_counts(durations, profile, avg, rates=meter.rates(avg, list(profile.workloads)))
    blocks = regime_plan(profile.workloads, None, schedule)
    statics = configs(profile, blocks, n)
    avg_rates = meter.rates(statics["static-avg"], list(profile.workloads))
    if hours is not None:
        items = _items_for(profile, schedule, avg_rates, hours, whole=False)
    else:
        items = sum(c for _, c in blocks) if quick else _items_for(profile, schedule, avg_rates, HOURS[n], whole=False)
    # the headroom of the stream that runs (a chosen ``hours`` may end inside a pass)
    plan = regime_plan(profile.workloads, items, schedule)
    headroom = model_headroom(profile, plan, statics)
    simulated = simulated_headroom(meter, plan, statics) if n <= SIM_HEADROOM_MAX_NODES else None
    used = max((h for h in (headroom, simulated) if h is not None), key=lambda h: h["ratio"])
    return {"key": key, "pipeline": pipeline, "nodes": n, "durations": durations, "schedule": schedule, "items": items,
            "simulated_hours_at_static_avg": sum(c / max(avg_rates[r], 1e-9) for r, c in plan) / 3600,
            "regime_blocks": len(plan), "headroom": headroom, "headroom_simulated": simulated,
            "headroom_used": "simulated" if used is simulated else "model",
            "steady_rates_static_avg": avg_rates, "configs": {k: v.label() for k, v in statics.items()}, "statics": statics}


def run_cell(workload: Mapping[str, Any], system: str, repeat: int = 0) -> dict[str, Any]:
    """One system on one prepared workload (``repeat``: which run of a repeated cell); a system that fails is
    reported (its error), the others still run."""
    t0 = time.perf_counter()
    try:
        row = run_one(workload["pipeline"], system, workload["nodes"], workload["schedule"], workload["items"], workload["statics"])
    except Exception as exc:  # noqa: BLE001 - reported in the row
        row = {"pipeline": workload["pipeline"], "system": system, "nodes": workload["nodes"], "items_per_s": None,
               "error": f"{type(exc).__name__}: {exc}", "ooms": None, "tick_ms_p95": None, "sim_wall_s": time.perf_counter() - t0}
    row["load_after"] = round(os.getloadavg()[0], 1)
    row["repeat"] = repeat
    row["schedule"] = workload["schedule"]
    return row


def repeats_of(workload: Mapping[str, Any], system: str, repeats: int) -> int:
    """How many times ``system`` runs on ``workload`` (``REPEATS`` module comment)."""
    return repeats if system == "trident" and workload["nodes"] in REPEATED_NODES else 1


def is_tick_target(pipeline: str, nodes: int) -> bool:
    """Whether trident's tick time on this workload is the tick target's (256 nodes x 10 operators)."""
    return pipeline == WIDE and nodes in ALONE_NODES


def runs_alone(workload: Mapping[str, Any], system: str) -> bool:
    """Whether ``system``'s runs on ``workload`` go one at a time after the others (``ALONE_NODES`` module comment)."""
    return system == "trident" and is_tick_target(workload["pipeline"], workload["nodes"])


def merge_repeats(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (pipeline, nodes, system), in first-seen order: a repeated cell's ``items_per_s`` is the
    median over its repeats that ran, its tick p50 and p95 those of all their ticks (``tick_ms``), its
    ``ooms`` their sum; ``repeats`` counts the runs and ``items_per_s_repeats`` lists their throughputs."""
    cells: dict[tuple, list[Mapping[str, Any]]] = {}
    for r in rows:
        cells.setdefault((r["pipeline"], r["nodes"], r["system"]), []).append(r)
    merged = []
    for runs in cells.values():
        row = dict(runs[0])
        if len(runs) > 1:
            rates = [r["items_per_s"] for r in runs if r["items_per_s"]]
            ticks = [t for r in runs for t in r.get("tick_ms") or ()]
            row.update(items_per_s=float(np.median(rates)) if rates else None, items_per_s_repeats=[r["items_per_s"] for r in runs],
                       ooms=sum(r["ooms"] or 0 for r in runs), tick_ms_p50=float(np.percentile(ticks, 50)) if ticks else None,
                       tick_ms_p95=float(np.percentile(ticks, 95)) if ticks else None)
        row["repeats"] = len(runs)
        merged.append(row)
    return merged


def _same_config(cell: tuple[Mapping[str, Any], str, int], cells: Sequence[tuple[Mapping[str, Any], str, int]]) -> str | None:
    """The static system of the same workload, listed before this one and run, whose config this static
    system's equals (static-long is static-avg on the documents streams): its run is this one's (static
    runs are deterministic), so it runs once."""
    workload, system, _ = cell
    if not system.startswith("static-"):
        return None
    statics = workload["statics"]
    for other in statics:
        if other == system:
            return None
        if statics[other].assignment == statics[system].assignment and any(w is workload and s == other for w, s, _ in cells):
            return other
    return None


def _as_system(rows: Sequence[Mapping[str, Any]], workload: Mapping[str, Any], other: str, system: str) -> dict[str, Any]:
    """``other``'s run on ``workload`` reported as ``system``'s (``_same_config``)."""
    row = next(r for r in rows if r["pipeline"] == workload["pipeline"] and r["nodes"] == workload["nodes"] and r["system"] == other)
    return {**row, "system": system, "same_config_as": other}


def code_fingerprint(policies: bool = True) -> str:
    """A digest of every source and data file of the ``trident_flows`` package running here (without its
    ``scheduler`` package, which a run without a policy never enters, when not ``policies``) and of these
    benchmarks: runs made by other code have another."""
    import trident_flows

    digest = hashlib.sha256()
    for root, prefix in ((Path(trident_flows.__file__).resolve().parent, ""), (Path(__file__).resolve().parent, "benchmarks/")):
        for path in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in (".py", ".json", ".csv", ".parquet")):
            relative = path.relative_to(root)
            if not policies and not prefix and relative.parts[0] == "scheduler":
                continue
            digest.update(f"{prefix}{relative}".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


class RunJournal:
    """Finished runs, one JSON line each, tagged with the code (``code_fingerprint``; a static system's
    run, which ticks no policy, without the policies' code) and the stream they ran on, so that a
    benchmark stopped after hours can be resumed: ``row`` gives a run the journal holds for this code,
    workload, system, repeat and stream (None when it holds none); ``add`` appends one. A journal
    opened without ``resume`` starts empty; a run that failed is not kept."""

    def __init__(self, path: Path, resume: bool) -> None:
        self.path = Path(path)
        self._codes = {True: code_fingerprint(), False: code_fingerprint(policies=False)}
        self._kept: dict[str, dict[str, Any]] = {}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not resume:
            self.path.write_text("")
            return
        lines = self.path.read_text().splitlines() if self.path.exists() else []
        for line in lines:
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue  # the last line of a run stopped while writing it
            if entry.get("code") == self._code(entry["row"]["system"]):
                self._kept[entry["cell"]] = entry["row"]

    def _code(self, system: str) -> str:
        return self._codes[not system.startswith("static-")]

    @staticmethod
    def _cell(pipeline: str, nodes: int, system: str, repeat: int, items: int, schedule: str) -> str:
        return f"{pipeline}-{nodes} {system} #{repeat} {items} {schedule}"

    def row(self, workload: Mapping[str, Any], system: str, repeat: int) -> dict[str, Any] | None:
        return self._kept.get(self._cell(workload["pipeline"], workload["nodes"], system, repeat, workload["items"], workload["schedule"]))

    def add(self, row: Mapping[str, Any]) -> None:
        if row.get("items_per_s") is None or row.get("error"):
            return
        cell = self._cell(row["pipeline"], row["nodes"], row["system"], row["repeat"], row["items"], row["schedule"])
        with self.path.open("a") as f:
            f.write(json.dumps({"code": self._code(row["system"]), "cell": cell, "row": row}) + "\n")


def _systems_for(workload: Mapping[str, Any], systems: Sequence[str] | None) -> list[str]:
    statics = workload["statics"]
    if systems:
        return [s for s in systems if s in statics or s in ADAPTIVE]
    return ["static-avg", "trident"] if workload["nodes"] > SIM_HEADROOM_MAX_NODES else [*statics, *ADAPTIVE]


def _in_parallel(jobs: int, fn: Any, calls: Sequence[tuple[Any, ...]], done: Any) -> list[Any]:
    """``fn(*call)`` for every call, on ``jobs`` worker processes (in this process when 1), in the
    calls' order; ``done(result)`` as each finishes. The longest calls should come first."""
    if jobs == 1:
        results = []
        for call in calls:
            results.append(fn(*call))
            done(results[-1])
        return results
    results: list[Any] = [None] * len(calls)
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(fn, *call): k for k, call in enumerate(calls)}
        for future in as_completed(futures):
            results[futures[future]] = future.result()
            done(results[futures[future]])
    return results


def run(quick: bool = False, log: Any = print, workloads: Sequence[str] | None = None, systems: Sequence[str] | None = None,
        hours: float | None = None, jobs: int = 1, repeats: int | None = None, journal: Path | None = None,
        resume: bool = False) -> BenchResult:
    """``workloads``: pipeline-nodes pairs to run (default: ``DEFAULT_WORKLOADS``, quick: every
    pipeline on ``QUICK_NODES``); ``systems``: the systems each runs (default: every one up to 8
    nodes, static-avg and trident above); ``hours``: simulated hours of stream for every workload
    instead of ``HOURS`` (it may end inside a pass of the schedule); ``jobs``: worker processes,
    each running whole workload preparations and then whole (workload, system) runs (the ticks'
    CPU time is charged per process, so the figures do not depend on it); ``repeats``: runs of each
    repeated cell (``REPEATS``; quick: 1); ``journal``: a file each finished run is appended to
    (``RunJournal``), started afresh unless ``resume``, when the runs it holds of this code and
    these streams are taken from it instead of run again."""
    if hours is not None and hours <= 0:
        raise ValueError(f"hours must be > 0, got {hours}")
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    repeats = repeats if repeats is not None else 1 if quick else REPEATS
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if resume and journal is None:
        raise ValueError("resume needs a journal to resume from")
    chosen = tuple(workloads or ((f"{p}-{n}" for p in PIPELINES for n in QUICK_NODES) if quick else DEFAULT_WORKLOADS))
    t_start, cpu_start, load_start = time.perf_counter(), _cpu_s(), os.getloadavg()
    prepared = _in_parallel(jobs, prepare, [(key, quick, hours) for key in chosen],
                            lambda w: log(f"{w['key']}: {w['items']} items, {w['regime_blocks']} blocks, "
                                          f"{w['simulated_hours_at_static_avg']:.2f} h at static-avg"))
    # the biggest clusters first, so that no long run starts last
    cells = sorted(((w, s, k) for w in prepared for s in _systems_for(w, systems) for k in range(repeats_of(w, s, repeats))),
                   key=lambda c: -c[0]["nodes"])
    book = RunJournal(journal, resume) if journal is not None else None
    reused = [book.row(w, s, k) for w, s, k in cells] if book is not None else [None] * len(cells)
    for row in reused:
        if row is not None:
            log(f"{row['pipeline']}-{row['nodes']} {row['system']}: taken from the journal ({row['items_per_s']} items/s)")
    same = {id(c): _same_config(c, cells) for c in cells}

    def done(row: Mapping[str, Any]) -> None:
        again = f" (repeat {row['repeat'] + 1})" if row["repeat"] else ""
        log(f"{row['pipeline']}-{row['nodes']} {row['system']}{again}: "
            f"{row['items_per_s'] if row['items_per_s'] is None else round(row['items_per_s'], 2)} items/s, "
            f"ooms {row['ooms']}, tick p95 {row.get('tick_ms_p95')}, sim wall {row['sim_wall_s']:.0f} s, "
            f"cpu {row.get('sim_cpu_s') or 0:.0f} s {row['error'][:200]}")
        if book is not None:
            book.add(row)

    todo = [c for c, row in zip(cells, reused) if row is None and same[id(c)] is None]
    alone = [c for c in todo if runs_alone(c[0], c[1])]
    rows = [row for row in reused if row is not None]
    rows += _in_parallel(jobs, run_cell, [c for c in todo if not runs_alone(c[0], c[1])], done)
    rows += _in_parallel(1, run_cell, alone, done)
    rows += [_as_system(rows, c[0], same[id(c)], c[1]) for c, row in zip(cells, reused) if row is None and same[id(c)] is not None]
    order = {key: k for k, key in enumerate(chosen)}
    rows.sort(key=lambda r: (order[f"{r['pipeline']}-{r['nodes']}"], r["repeat"]))
    workloads_ran = {w["key"]: {k: v for k, v in w.items() if k not in ("key", "pipeline", "nodes", "statics")} for w in prepared}
    cells_merged = merge_repeats(rows)
    summary = summarise(cells_merged, workloads_ran)
    targets = {"captured_8_nodes": Target(">=", 0.9), "worst_vs_best_static_8_nodes": Target(">=", 0.97), "trident_ooms": Target("==", 0),
               "tick_ms_p95_256_nodes": Target("<=", 1000.0), "sim_wall_s_8_nodes_4h": Target("<=", 300.0)}
    raw = {"node": NODE, "workloads_run": list(chosen), "systems_chosen": list(systems or ()), "tick_s": TICK_S, "jobs": jobs, "repeats": repeats,
           "ran_alone": [f"{w['key']} {system} (repeat {k + 1})" for w, system, k in alone],
           "from_journal": [f"{r['pipeline']}-{r['nodes']} {r['system']} (repeat {r['repeat'] + 1})" for r in reused if r is not None],
           "hours": hours if hours is not None else HOURS, "headroom_min": HEADROOM_MIN, "workloads": workloads_ran, "runs": rows,
           "bench_seconds": time.perf_counter() - t_start, "bench_cpu_s": _cpu_s() - cpu_start,
           "load_average_1m": {"start": round(load_start[0], 1), "end": round(os.getloadavg()[0], 1)},
           "not_simulated": {"ray-data": "Ray Data's own autoscaler runs its own streaming executor, not this runner's apply",
                             "xenna": "cosmos-xenna schedules stages with its own runtime, not this runner's apply"}}
    notes = ("ALL FIGURES SIMULATED (trident_flows.sim, checked against the live emulated runtime by bench sim-fidelity). "
             f"Nodes of {NODE['cpus']} CPUs + {NODE['gpus']} GPUs ({NODE['gpu_memory_bytes'] / 2**30:g} GiB); policies tick every "
             f"{TICK_S:g} simulated s with their CPU time charged. Ran: {', '.join(chosen)}"
             f"{' (systems ' + ', '.join(systems) + ')' if systems else ''}"
             f"{f', {hours:g} simulated hours each' if hours is not None else ''}"
             f"{f'; trident x{repeats} on {REPEATED_NODES} nodes (median throughput, p95 of all ticks)' if repeats > 1 else ''}"
             f"{f'; trident on {WIDE} x {ALONE_NODES} nodes ran alone after the others' if alone else ''}.")
    return BenchResult("closed-loop-sim", summary, targets, raw, figure(cells_merged, summary), notes)


def summarise(rows: Sequence[Mapping[str, Any]], workloads: Mapping[str, Any]) -> dict[str, Any]:
    """The headline figures: ``captured_8_nodes`` (smallest, over the 8-node workloads with headroom, of trident /
    (best simulated static x headroom used)), ``worst_vs_best_static_8_nodes`` (over those without: trident / best
    static), ``trident_ooms``, ``tick_ms_p95_256_nodes`` (trident's tick CPU p95 on ``documents10`` at 256 nodes;
    ``tick_ms_p95_largest`` at ``tick_nodes``), ``sim_wall_s_8_nodes_4h`` / ``sim_cpu_s_8_nodes_4h`` (the 8-node
    static-avg documents simulation scaled to 4 simulated hours; ``_trident`` with policy ticks) and the hours
    actually simulated."""
    captured, vs_static = [], []
    for key, w in workloads.items():
        pipeline, n = key.rsplit("-", 1)
        if int(n) != 8:
            continue
        mine = {r["system"]: r for r in rows if r["pipeline"] == pipeline and r["nodes"] == 8}
        statics = [r["items_per_s"] for s, r in mine.items() if s.startswith("static-") and r["items_per_s"]]
        trident = mine.get("trident", {}).get("items_per_s")
        if not statics or not trident:
            continue
        best = max(statics)
        ratio = w["headroom_simulated"]["ratio"] if w["headroom_used"] == "simulated" else w["headroom"]["ratio"]
        if ratio >= HEADROOM_MIN:
            captured.append(trident / (best * ratio))
        else:
            vs_static.append(trident / best)
    trident_rows = [r for r in rows if r["system"] == "trident"]
    largest = max((r["nodes"] for r in trident_rows), default=None)
    ticks = [r["tick_ms_p95"] for r in trident_rows if r["nodes"] == largest and r.get("tick_ms_p95") is not None]
    ticks_256 = [r["tick_ms_p95"] for r in trident_rows if is_tick_target(r["pipeline"], r["nodes"]) and r.get("tick_ms_p95") is not None]
    static8, trident8 = ({"sim_wall_s": None, "sim_cpu_s": None, "wall_s": None} | next(
        (r for r in rows if r["pipeline"] == "documents" and r["nodes"] == 8 and r["system"] == system and r.get("wall_s")), {})
        for system in ("static-avg", "trident"))
    return {"captured_8_nodes": min(captured) if captured else None,
            "worst_vs_best_static_8_nodes": min(vs_static) if vs_static else None,
            "trident_ooms": sum(r["ooms"] or 0 for r in trident_rows),
            "tick_ms_p95_256_nodes": max(ticks_256) if ticks_256 else None,
            "tick_ms_p95_largest": max(ticks) if ticks else None, "tick_nodes": largest,
            "sim_wall_s_8_nodes_4h": _per_4h(static8, "sim_wall_s"), "sim_cpu_s_8_nodes_4h": _per_4h(static8, "sim_cpu_s"),
            "sim_wall_s_8_nodes_simulated_hours": static8["wall_s"] / 3600 if static8["wall_s"] else None,
            "sim_cpu_s_8_nodes_4h_trident": _per_4h(trident8, "sim_cpu_s"),
            "sim_cpu_s_8_nodes_trident_simulated_hours": trident8["wall_s"] / 3600 if trident8["wall_s"] else None}


def _cpu_s() -> float:
    """CPU seconds of this process and of its finished worker processes."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _per_4h(row: Mapping[str, Any], key: str) -> float | None:
    """``row[key]`` scaled to 4 simulated hours (None when the run is missing)."""
    return row[key] * 4 * 3600 / row["wall_s"] if row[key] is not None and row["wall_s"] else None
