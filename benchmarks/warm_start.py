"""``bench warm-start``: trident starting cold and starting from the memory of an earlier run, in the simulator,
against the closed-loop suite's best static allocation in hindsight (S*) and per-regime oracle (O).
Every figure here is SIMULATED (``trident_flows.sim``) but the ``live_*`` ones (``live``).

Contract of ``run(quick, repeats, suite_results, live) -> BenchResult``:
- Streams, node, starting configuration and tick are the closed-loop suite's (``suite_sim.prepare``); S* and O
  are the allocations the suite's sim section found for the same stream (``suite_results``, default
  bench-results/closed-loop-suite.json; a stream that differs is refused, naming the command that
  refreshes it), run again here beside trident (O starting in its first block's allocation, S* in its own,
  as in the suite) and static-default. Each tick's CPU time is charged to the simulated clock, as
  in the suite. A trident run still going after ``CAP`` times S*'s time for the stream is stopped and
  reported with its error, its unfinished items counted as lost.
- Per repeat r (``repeats``; 3, 1 with ``quick``): trident ``cold`` (no memory) on the stream; an
  ``earlier`` run of trident, cold, over the same regime blocks rotated by r + 1 (the same regimes in
  another order) that writes a memory; trident ``warm`` on the stream, starting from a copy of that memory.
- Reaction (per run, per block): the block's bottleneck is the operator O gives the most replicas in it; a
  block where O runs it within ``TOLERANCE`` of the block before (the first block: of static-default)
  asks for no reaction and is not counted. From the tick the block's first item reaches the bottleneck
  (its stream position) to the first tick it serves O's replica count for the block within ``TOLERANCE``
  (at least one replica): 0 when it already did on arrival (moved ahead of the items). A block the
  operator finishes first counts until then (``censored``). ``from_source_read_s`` is the same from the
  tick the source read the block's first item: it adds the items queued between the source and the
  bottleneck (the source reads up to thousands of items ahead of the last operator), which O waits out too.
  O's own run is measured the same way (``reaction_s_median_oracle``): where a block's configuration does not
  fit beside what the operators still on the block before hold, O waits for them as trident does.
- ``summary`` (medians over repeats): ``sim_cold_t_over_oracle``, ``sim_warm_t_over_oracle`` (trident's rate
  over O's), ``cold_vs_static_hindsight``, ``warm_vs_static_hindsight``, ``reaction_s_median_cold``,
  ``reaction_s_median_warm`` (over every counted block of every repeat), ``reaction_s_median_oracle``, ``headroom`` (O / S*), ``trident_ooms``,
  ``items_lost`` (every run), ``prepositioned_moves_warm``, ``max_trident_over_oracle`` (the fastest cold or
  warm run over O: above 1.02, O's search is too weak to be the reference), and per workload without headroom
  (``NO_HEADROOM``) the median and lowest ratio to its S*, and the median ratio to static-default (the
  configuration trident starts from), cold and warm. ``raw`` keeps every run.
- Per workload without headroom, two more figures: ``<w>.bound_vs_static_hindsight``, a clairvoyant policy that
  starts in static-default as trident does and moves to S* at its first tick, paying its real moves (knowledge no
  user has; S* itself applied as early as a policy can act, not an upper bound: ``bench no-headroom-ceiling`` gives
  one where it can); and ``<w>.from_tuned.{cold,warm}_vs_static_median``:
  trident (cold; warm after an earlier run from the same start) started in S*'s own starting configuration (a
  user's tuned one) over that configuration run static: whether trident keeps a good configuration good.
- ``live`` (``--live``): then the same runs of trident LIVE against S* on the cpu-only stream (``warm_start_live``:
  2 interleaved repeats, 1 and the quick stream with ``quick``); its ``live_*`` keys join ``summary``, its runs ``raw.live``.
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from benchmarks import allocation, suite_sim, suite_workloads
from benchmarks.allocation import Allocation
from benchmarks.closed_loop_runs import TICK_S
from benchmarks.closed_loop_workload import Workload
from benchmarks.oracle_policy import OraclePolicy
from benchmarks.report import BenchResult, Target
from trident_flows.core.decision import Decision
from trident_flows.core.state import RunnerState
from trident_flows.core.types import BatchSample
from trident_flows.scheduler.policies import make_policy
from trident_flows.scheduler.throughput_measure import stream_positions
from trident_flows.sim.driver import simulate
from trident_flows.sim.static_search import StaticConfig

WORKLOAD = "cpu-only"
NO_HEADROOM = ("docs-baseline", "video-baseline")
WORKLOADS = (WORKLOAD, *NO_HEADROOM)
TOLERANCE = 0.25  # a replica count within 25% of O's (at least 1 replica) runs the block's configuration
CAP = 20.0  # a trident run is stopped after 20x the simulated time S* takes for the stream (reported as not finished)
SUITE_RESULTS = Path("bench-results/closed-loop-suite.json")
REFRESH = "trident-flows bench closed-loop-suite --sim"


@dataclass
class Tick:
    t: float
    positions: dict[str, float]
    replicas: dict[str, int]


@dataclass
class Run:
    """One simulated run and what the bench reads from it."""

    system: str
    items_per_s: float | None
    ooms: int
    items_lost: int
    ticks: list[Tick] = field(default_factory=list)
    prepositioned: int = 0
    memory_loaded: bool = False
    memory_regimes_known: int = 0
    memory_warning: str | None = None
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"system": self.system, "items_per_s": self.items_per_s, "ooms": self.ooms, "items_lost": self.items_lost,
                "prepositioned": self.prepositioned, "memory_loaded": self.memory_loaded,
                "memory_regimes_known": self.memory_regimes_known, "memory_warning": self.memory_warning, "error": self.error}


class _Watched:
    """A policy seen from outside: each tick's time, stream positions and serving replicas per operator."""

    def __init__(self, policy: Any, ticks: list[Tick]) -> None:
        self._policy, self._ticks = policy, ticks

    def decide(self, state: RunnerState, samples: Sequence[BatchSample]) -> Decision:
        self._ticks.append(Tick(state.wall_s, stream_positions(state), {op.name: sum(op.configs().values()) for op in state.operators}))
        return self._policy.decide(state, samples)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._policy, name)


def simulate_run(w: Any, stream: Workload, system: str, policy: Any | None, start: Any | None = None, cap_s: float | None = None) -> Run:
    """``stream`` under ``policy`` (None: static) from ``start`` (default the suite's static-default), for at most
    ``cap_s`` simulated seconds: a run that has not finished by then is reported with its error (no rate)."""
    spec = stream.spec(w.profile, start or w.start, f"suite-sim-{w.suite.name}-trident")  # one name: one pipeline for the memory
    ticks: list[Tick] = []
    if policy is not None and not callable(getattr(policy, "decide", None)):
        policy = policy(spec)
    watched = _Watched(policy, ticks) if policy is not None else None
    run = simulate(spec, w.cluster, watched, tick_s=TICK_S, duration_s=cap_s)
    s = run.summary
    memory = getattr(policy, "memory", None)
    stuck = "" if run.runner.finished else f"did not finish within {cap_s:g} simulated s ({s['items_written']} of {s['items_in']} items written)"
    return Run(system, s["steady_items_per_s"] if not stuck else None, int(s["ooms"]), int(s["items_missing"] + s["items_in_flight"]), ticks,
               prepositioned=getattr(getattr(policy, "preposition", None), "moves", 0),
               memory_loaded=getattr(memory, "loaded", None) is not None, memory_regimes_known=getattr(memory, "regimes_known", 0),
               memory_warning=getattr(memory, "warning", None), error=stuck or s.get("error") or "")


def trident(w: Any, memory: str | None) -> Callable[[Any], Any]:
    return lambda spec: make_policy("trident", spec=spec, cluster=w.cluster, memory=memory)


def rotated(stream: Workload, by: int) -> Workload:
    """The same regime blocks, rotated by ``by``: the same regimes in another order."""
    parts = stream.regimes.split(",")
    k = by % len(parts) or 1
    return Workload("regimes", ",".join(parts[k:] + parts[:k]), seed=stream.seed, time_scale=stream.time_scale)


def references(results: Mapping[str, Any], name: str, w: Any) -> tuple[Allocation, list[Allocation]]:
    """S* and O's per-block allocations the suite found for ``name``'s stream."""
    sim = results.get("raw", {}).get("sim", {}).get(name)
    if sim is None:
        raise ValueError(f"the closed-loop suite's results have no sim section for {name!r}: run `{REFRESH}` first")
    if sim.get("regimes") != w.suite.regimes or sim.get("items") != w.stream.items:
        raise ValueError(f"the closed-loop suite's sim section for {name!r} ran another stream ({sim.get('regimes')!r}, not "
                         f"{w.suite.regimes!r}): run `{REFRESH}` to refresh it")
    return allocation.from_data(sim["static_hindsight"]), [allocation.from_data(b) for b in sim["oracle_blocks"]]


def reactions(ticks: Sequence[Tick], blocks: Sequence[tuple[str, int, int]], oracle: Sequence[Allocation], source: str,
              start: Allocation) -> list[dict[str, Any]]:
    """Per block whose bottleneck O configures differently from the block before (the first: from ``start``), the
    reaction (module docstring)."""
    out = []
    for k, (regime, first, end) in enumerate(blocks):
        target = {name: sum(n for _, n in groups) for name, groups in oracle[k]}
        before = {name: sum(n for _, n in groups) for name, groups in (oracle[k - 1] if k else start)}
        bottleneck = max(target, key=lambda name: (target[name], list(target).index(name)))
        want = target[bottleneck]
        if abs(before.get(bottleneck, 0) - want) <= _tolerance(want):
            continue  # O runs the bottleneck as in the block before: no reaction is asked for
        read = next((t for t in ticks if t.positions.get(source, 0.0) >= first), None)
        arrived = next((t for t in ticks if t.positions.get(bottleneck, 0.0) >= first), None)
        if read is None or arrived is None:
            continue
        reached = next((t for t in ticks if t.t >= arrived.t and abs(t.replicas.get(bottleneck, 0) - want) <= _tolerance(want)), None)
        passed = next((t for t in ticks if t.t >= arrived.t and t.positions.get(bottleneck, 0.0) >= end), None)
        censored = reached is None or (passed is not None and reached.t > passed.t)
        until = (passed or ticks[-1]) if censored else reached
        out.append({"block": k, "regime": regime, "operator": bottleneck, "oracle_replicas": want,
                    "replicas_at_arrival": arrived.replicas.get(bottleneck, 0), "reaction_s": round(max(0.0, until.t - arrived.t), 2),
                    "from_source_read_s": round(max(0.0, until.t - read.t), 2), "arrival_after_read_s": round(arrived.t - read.t, 2),
                    "censored": censored})
    return out


def _tolerance(n: int) -> float:
    return max(1.0, TOLERANCE * n)


def _median(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def evaluate(name: str, repeats: int, results: Mapping[str, Any], work: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """S*, O, and per repeat trident cold, an earlier run in another order, and trident warm, on one workload."""
    w = suite_sim.prepare(name, False)
    static, oracle = references(results, name, w)
    static_start = allocation.start_config(static)
    runs: dict[str, Any] = {"static-hindsight": simulate_run(w, w.stream, "static-hindsight",
                                                            suite_sim.static_policy(static, w.stream.items, w.cluster), static_start)}
    blocks = [(str(k), start, end) for k, (_, start, end) in enumerate(w.blocks)]
    runs["oracle"] = simulate_run(w, w.stream, "oracle", OraclePolicy(blocks, {str(k): a for k, a in enumerate(oracle)},
                                                                     w.cluster.total_cpus, w.cluster.total_gpus),
                                  allocation.start_config(oracle[0]))
    runs["static-default"] = simulate_run(w, w.stream, "static-default", None)
    log(f"warm-start {name}: S* {runs['static-hindsight'].items_per_s} items/s, O {runs['oracle'].items_per_s} items/s, "
        f"static-default {runs['static-default'].items_per_s} items/s")
    cap_s = CAP * w.stream.items / (runs["static-hindsight"].items_per_s or 1.0)
    source = w.stream.spec(w.profile, w.start, "probe").operators[0].name
    start = allocation.allocation_of(w.start)
    repeats_out = []
    for r in range(repeats):
        memory = work / f"{name}-{r}.json"
        earlier_stream = rotated(w.stream, r + 1)
        cold = simulate_run(w, w.stream, "trident-cold", trident(w, None), cap_s=cap_s)
        earlier = simulate_run(w, earlier_stream, "trident-earlier", trident(w, str(memory)), cap_s=cap_s)
        kept = work / f"{name}-{r}-warm.json"
        if memory.exists():
            shutil.copy(memory, kept)
        warm = simulate_run(w, w.stream, "trident-warm", trident(w, str(kept)), cap_s=cap_s)
        entry = {"earlier_regimes": earlier_stream.regimes}
        for label, run in (("cold", cold), ("earlier", earlier), ("warm", warm)):
            entry[label] = run.to_dict()
            if label != "earlier":
                entry[label]["reactions"] = reactions(run.ticks, w.blocks, oracle, source, start)
        if name in NO_HEADROOM:
            entry["from_tuned"] = _from_tuned(w, static_start, earlier_stream, work / f"{name}-{r}-tuned.json", cap_s)
        repeats_out.append(entry)
        log(f"warm-start {name} repeat {r + 1}/{repeats}: cold {cold.items_per_s} items/s, warm {warm.items_per_s} items/s "
            f"({warm.prepositioned} operators pre-positioned; memory {'loaded' if warm.memory_loaded else 'NOT loaded: ' + str(warm.memory_warning)})")
    out: dict[str, Any] = {}
    if name in NO_HEADROOM:
        bound = simulate_run(w, w.stream, "s*-at-first-tick", OraclePolicy([("0", 0, w.stream.items)], {"0": static}, w.cluster.total_cpus,
                                                                          w.cluster.total_gpus))
        tuned = simulate_run(w, w.stream, "static-tuned", None, start=static_start)
        out = {"s_star_at_first_tick": bound.to_dict(), "static_tuned": tuned.to_dict()}
        log(f"warm-start {name}: S* applied at the first tick from static-default {bound.items_per_s} items/s; "
            f"S*'s starting configuration run static {tuned.items_per_s} items/s")
    return {**out, "static_hindsight": runs["static-hindsight"].to_dict(), "static_default": runs["static-default"].to_dict(),
            "oracle": {**runs["oracle"].to_dict(), "reactions": reactions(runs["oracle"].ticks, w.blocks, oracle, source, start)},
            "static_hindsight_allocation": allocation.label(static), "oracle_blocks": [allocation.label(a) for a in oracle],
            "regimes": w.suite.regimes, "items": w.stream.items, "repeats": repeats_out}


def _from_tuned(w: Any, start: StaticConfig, earlier_stream: Workload, memory: Path, cap_s: float) -> dict[str, Any]:
    """Trident cold, and warm after an earlier run, each started in ``start`` (S*'s starting configuration)."""
    cold = simulate_run(w, w.stream, "trident-cold-tuned", trident(w, None), start=start, cap_s=cap_s)
    simulate_run(w, earlier_stream, "trident-earlier-tuned", trident(w, str(memory)), start=start, cap_s=cap_s)
    warm = simulate_run(w, w.stream, "trident-warm-tuned", trident(w, str(memory)), start=start, cap_s=cap_s)
    return {"cold": cold.to_dict(), "warm": warm.to_dict()}


def summarise(per_workload: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    main = per_workload[WORKLOAD]
    s_star, o = main["static_hindsight"]["items_per_s"], main["oracle"]["items_per_s"]
    o = max(o or 0.0, s_star or 0.0)

    def rates(raw: Mapping[str, Any], label: str) -> list[float | None]:
        return [rep[label]["items_per_s"] if not rep[label]["items_lost"] else None for rep in raw["repeats"]]

    def reacted(label: str) -> float | None:
        return _median([x["reaction_s"] for rep in main["repeats"] for x in rep[label]["reactions"]])

    all_runs = [rep[label] for raw in per_workload.values() for rep in raw["repeats"] for label in ("cold", "earlier", "warm")]
    all_runs += [rep["from_tuned"][label] for raw in per_workload.values() for rep in raw["repeats"] if "from_tuned" in rep
                 for label in ("cold", "warm")]
    summary: dict[str, Any] = {
        "sim_cold_t_over_oracle": _ratio(_median(rates(main, "cold")), o),
        "sim_warm_t_over_oracle": _ratio(_median(rates(main, "warm")), o),
        "reaction_s_median_cold": reacted("cold"),
        "reaction_s_median_warm": reacted("warm"),
        "reaction_s_median_oracle": _median([x["reaction_s"] for x in main["oracle"]["reactions"]]),
        "cold_vs_static_hindsight": _ratio(_median(rates(main, "cold")), s_star),
        "warm_vs_static_hindsight": _ratio(_median(rates(main, "warm")), s_star),
        "headroom": _ratio(o, s_star),
        "trident_ooms": sum(run["ooms"] for run in all_runs),
        "items_lost": sum(run["items_lost"] for run in all_runs) + sum(raw[s]["items_lost"] for raw in per_workload.values()
                                                                         for s in ("static_hindsight", "oracle")),
        "prepositioned_moves_warm": _median([rep["warm"]["prepositioned"] for rep in main["repeats"]]),
        "max_trident_over_oracle": _ratio(max((x for label in ("cold", "warm") for x in rates(main, label) if x is not None), default=None), o),
    }
    for name, raw in per_workload.items():
        if name == WORKLOAD:
            continue
        base, default = raw["static_hindsight"]["items_per_s"], raw["static_default"]["items_per_s"]
        for label in ("cold", "warm"):
            ratios = [_ratio(x, base) for x in rates(raw, label)]
            summary[f"{name}.{label}_vs_static_hindsight_median"] = _median(ratios)
            summary[f"{name}.{label}_vs_static_hindsight_min"] = min((x for x in ratios if x is not None), default=None)
            summary[f"{name}.{label}_vs_static_default_median"] = _median([_ratio(x, default) for x in rates(raw, label)])
        if "s_star_at_first_tick" in raw:
            summary[f"{name}.bound_vs_static_hindsight"] = _ratio(raw["s_star_at_first_tick"]["items_per_s"], base)
            tuned = raw["static_tuned"]["items_per_s"]
            for label in ("cold", "warm"):
                summary[f"{name}.from_tuned.{label}_vs_static_median"] = _median(
                    [_ratio(rep["from_tuned"][label]["items_per_s"], tuned) for rep in raw["repeats"] if not rep["from_tuned"][label]["items_lost"]])
    return summary


def targets(workloads: Sequence[str]) -> dict[str, Target]:
    out = {"sim_cold_t_over_oracle": Target(">=", 0.90), "sim_warm_t_over_oracle": Target(">=", 0.95),
           "reaction_s_median_cold": Target("<=", 30.0), "reaction_s_median_warm": Target("<=", 10.0),
           "trident_ooms": Target("==", 0), "items_lost": Target("==", 0), "max_trident_over_oracle": Target("<=", 1.02)}
    for name in workloads:
        if name != WORKLOAD:
            for label in ("cold", "warm"):
                out[f"{name}.{label}_vs_static_hindsight_median"] = Target(">=", 0.97)
                out[f"{name}.{label}_vs_static_hindsight_min"] = Target(">=", 0.94)
    return out


def run(quick: bool = False, repeats: int | None = None, workloads: Sequence[str] = WORKLOADS,
        suite_results: Path = SUITE_RESULTS, log: Callable[[str], None] = print, live: bool = False) -> BenchResult:
    """The benchmark (see the module docstring); with ``live``, its live part after the simulated one."""
    if WORKLOAD not in workloads:
        raise ValueError(f"warm-start reads its figures from {WORKLOAD!r}; keep it among the workloads")
    unknown = sorted(set(workloads) - {WORKLOAD, *NO_HEADROOM})
    if unknown:
        raise ValueError(f"warm-start runs {[WORKLOAD, *NO_HEADROOM]}, not {unknown}")
    if not suite_results.exists():
        raise ValueError(f"{suite_results} is missing: run `{REFRESH}` first (warm-start runs its S* and O)")
    results = json.loads(suite_results.read_text())
    repeats = repeats or (1 if quick else 3)
    t0 = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="trident-warm-start-"))
    try:
        per_workload = {name: evaluate(name, repeats, results, work, log) for name in suite_workloads.WORKLOADS if name in workloads}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary, goals = summarise(per_workload), targets(list(per_workload))
    raw: dict[str, Any] = {"workloads": per_workload, "repeats": repeats, "tick_s": TICK_S, "tolerance": TOLERANCE,
                           "suite_results": str(suite_results),
                           "suite_provenance": results.get("raw", {}).get("sim_provenance") or results.get("provenance")}
    notes = _notes(quick, repeats)
    if live:
        from benchmarks import warm_start_live  # the live part runs on Ray

        live_summary, raw["live"] = warm_start_live.run(quick, results, log)
        summary.update(live_summary)
        goals.update(warm_start_live.TARGETS)
        raw["time_scale"] = raw["live"]["time_scale"]
        notes += " " + warm_start_live.notes(raw["live"])
    else:
        notes += (" Live figures (live_cold_vs_static_hindsight, live_warm_vs_static_hindsight) are measured with --live, "
                  "not in this run.")
    raw["bench_seconds"] = round(time.perf_counter() - t0, 1)
    return BenchResult("warm-start", summary, targets=goals, raw=raw, figure=figure(per_workload), notes=notes)


def _notes(quick: bool, repeats: int) -> str:
    return (f"{'QUICK run: 1 repeat. ' if quick else ''}SIMULATED. The closed-loop suite's streams and references (S*: the "
            "best static allocation in hindsight; O: the per-regime oracle; both use knowledge no user has), run again here. "
            f"{repeats} repeat(s): trident cold (no memory); an earlier trident run over the same regime blocks in another order "
            "(rotated) writing a memory; trident warm starting from it. Reaction: from the source reading a block's first item to "
            f"the block's bottleneck operator serving O's replica count for it (within {TOLERANCE:.0%}, at least 1); censored at "
            "the block's end at that operator. Without headroom (docs-baseline, video-baseline): the bound is a clairvoyant "
            "policy that starts in static-default and applies S* at its first tick, paying its real moves (knowledge no user "
            "has; not an upper bound, see bench no-headroom-ceiling); from_tuned starts "
            "trident in S*'s starting configuration and compares it with that configuration run static.")


def figure(per_workload: Mapping[str, Mapping[str, Any]]) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(per_workload)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    ax = axes[0]
    labels = ("S*", "O", "cold", "warm")
    width = 0.2
    for i, label in enumerate(labels):
        values = []
        for name in names:
            raw = per_workload[name]
            if label == "S*":
                values.append(raw["static_hindsight"]["items_per_s"] or 0.0)
            elif label == "O":
                values.append(raw["oracle"]["items_per_s"] or 0.0)
            else:
                values.append(_median([rep[label]["items_per_s"] for rep in raw["repeats"]]) or 0.0)
        ax.bar([k + (i - 1.5) * width for k in range(len(names))], values, width, label=label)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("input items/s (simulated)")
    ax.set_title("throughput: best static (S*), oracle (O), trident cold and warm")
    ax.legend()
    ax = axes[1]
    main = per_workload[WORKLOAD]
    for label, marker in (("cold", "o"), ("warm", "s")):
        points = [(x["block"], x["reaction_s"]) for rep in main["repeats"] for x in rep[label]["reactions"]]
        if points:
            ax.scatter([p[0] + (0.1 if label == "warm" else -0.1) for p in points], [p[1] for p in points], marker=marker, label=label)
    ax.set_xlabel(f"block of the {WORKLOAD} stream")
    ax.set_ylabel("reaction (simulated s)")
    ax.set_title("from a block's first item at the source to its bottleneck's configuration")
    ax.legend()
    fig.suptitle("SIMULATED: trident with and without the memory of an earlier run")
    fig.tight_layout()
    return fig
