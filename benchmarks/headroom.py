"""How much any scheduler could gain on a workload: per-regime optimum over the best single static.

Contract:
- A ``Workload`` is a cost-model profile, a cluster (CPUs, GPUs, device memory), the devices each
  operator may use, and a regime schedule (regime name, input items) in stream order.
- ``headroom(workload) -> Headroom``: the stream's duration if every regime ran its own optimum,
  switched for free (``regime_optimum``: no scheduler can do better), and under the best single static
  configuration chosen in hindsight (``best_static``: knowledge no user has); ``ratio`` is the second
  over the first (>= 1), the most an adaptive scheduler can gain.
- Both are searched over the same space, the fluid relaxation of what trident may use (``_Model``);
  its co-location and memory checks are optimistic for both sides alike.
- ``run(quick)`` is the benchmark ``headroom``: its summary maps each workload (the closed-loop
  workloads, the candidates of ``candidate_workloads`` and the corpus workloads of ``corpus_workloads``)
  to its ``ratio`` with whole replicas; ``raw`` also keeps the relaxed one. It has no targets.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

import pulp

from benchmarks.report import BenchResult
from trident_flows.core.types import CPU, GPU
from trident_flows.runtime.costmodel import DeviceCost, OperatorCost, PipelineProfile
from trident_flows.sim.static_search import reach

GiB = 2**30
BATCHES = (1, 2, 4, 8, 16, 32, 64)
GPU_SHARES = (1.0, 0.5, 0.25)  # device shares a GPU replica may hold (Ray fractional GPUs)
GPU_REPLICA_CPUS = 1.0  # every replica, GPU ones too, holds one CPU (the runtime's default)
SOLVE_LIMIT_S = 60.0
_CUTS = 60  # tangent cuts of 1/T per regime; the outer approximation is refined around the solution twice


@dataclass(frozen=True)
class Workload:
    """A cost-model profile, a cluster (CPUs, GPUs, device memory), the devices each operator may use, and a regime
    schedule (regime name, input items) in stream order."""

    name: str
    profile: PipelineProfile
    cpus: float
    gpus: float
    device_memory_bytes: int
    schedule: tuple[tuple[str, int], ...]
    devices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    batches: tuple[int, ...] = BATCHES
    note: str = ""
    sources: tuple[str, ...] = ()  # the pages of the published statistics the workload is drawn from (corpus workloads)

    def __post_init__(self) -> None:
        if self.cpus <= 0 or self.gpus < 0:
            raise ValueError(f"workload {self.name!r}: needs cpus > 0 and gpus >= 0, got cpus={self.cpus}, gpus={self.gpus}")
        unknown = [r for r, _ in self.schedule if r not in self.profile.workloads]
        if unknown:
            raise ValueError(f"workload {self.name!r}: unknown regime(s) {unknown}; profile {self.profile.name!r} has "
                             f"{sorted(self.profile.workloads)}")
        if not self.schedule or any(n < 1 for _, n in self.schedule):
            raise ValueError(f"workload {self.name!r}: the schedule needs at least one regime of >= 1 item")

    def devices_of(self, op: OperatorCost) -> tuple[str, ...]:
        allowed = self.devices.get(op.name, tuple(op.devices))
        return tuple(d for d in allowed if d in op.devices and (d == CPU or self.gpus > 0))


@dataclass(frozen=True)
class Option:
    """One way to run a replica of an operator: device, batch size and, on a GPU, the device share it holds."""

    operator: str
    device: str
    batch_size: int
    peak_bytes: int
    gpus: float = 0.0

    def label(self) -> str:
        return f"{self.device}/b{self.batch_size}" + (f"/g{self.gpus:g}" if self.device != CPU else "")


@dataclass(frozen=True)
class Headroom:
    """The result of ``headroom`` (durations in seconds, throughputs in input items/s)."""

    workload: str
    integer: bool
    oracle_s: float
    static_s: float
    per_regime_items_per_s: Mapping[str, float]
    static_items_per_s: Mapping[str, float]
    static_allocation: Mapping[str, float]

    @property
    def ratio(self) -> float:
        return self.static_s / self.oracle_s

    def to_dict(self) -> dict[str, object]:
        return {"workload": self.workload, "integer_replicas": self.integer, "headroom": self.ratio, "oracle_s": self.oracle_s,
                "static_hindsight_s": self.static_s, "per_regime_optimum_items_per_s": dict(self.per_regime_items_per_s),
                "static_hindsight_items_per_s": dict(self.static_items_per_s),
                "static_hindsight_replicas": dict(self.static_allocation)}


def options(workload: Workload) -> list[Option]:
    """Every (operator, device, batch, GPU share) choice whose single-replica peak fits its device."""
    out = []
    mem_features = _worst_features(workload)
    for op in workload.profile.operators:
        for device in workload.devices_of(op):
            cost = op.device(device)
            for b in workload.batches:
                peak = cost.peak_bytes(b, {f: v * b for f, v in mem_features.items()})
                if device == CPU:
                    out.append(Option(op.name, device, b, peak))
                elif peak <= workload.device_memory_bytes:
                    out += [Option(op.name, device, b, peak, g) for g in GPU_SHARES]
    missing = {op.name for op in workload.profile.operators} - {o.operator for o in out}
    if missing:
        raise ValueError(f"workload {workload.name!r}: operator(s) {sorted(missing)} have no device and batch size that fits; "
                         "allow the CPU or raise the device memory")
    return out


def _worst_features(workload: Workload) -> dict[str, float]:
    regimes = {r for r, _ in workload.schedule}
    names = {f for r in regimes for f in workload.profile.workloads[r]}
    return {f: max(float(workload.profile.workloads[r].get(f, 0.0)) for r in regimes) for f in names}


def rate(profile: PipelineProfile, option: Option, features: Mapping[str, float]) -> float:
    """Items/s of one replica kept busy (for GPU work: per second of device time it gets)."""
    cost: DeviceCost = profile.operator(option.operator).device(option.device)
    b = option.batch_size
    seconds = cost.seconds(b, {f: v * b for f, v in features.items()})
    return b / seconds if seconds > 0 else 1e12


class _Model:
    """Replicas per option (integer or relaxed) and, per regime, the device time each GPU option gets: per operator
    any mix of configurations (device x batch size), CPU replicas counted in CPUs, GPU work counted in device time,
    and every GPU replica holding one CPU per device-share it keeps busy.

    A GPU replica runs one kernel at a time, so it gets at most one device-second per second; the
    devices' time is shared by whichever co-located replicas have work (time-slicing), so the split
    may differ by regime even for one fixed set of replicas. Co-location is free of overhead here, which is
    optimistic for both sides. Device memory is checked per replica (a batch whose peak does not fit is never a
    choice, ``options``) and on average across the GPUs (co-located replicas' peaks summed by share), which is
    optimistic too.
    """

    def __init__(self, problem: pulp.LpProblem, workload: Workload, opts: Sequence[Option], integer: bool) -> None:
        self.problem, self.workload, self.opts = problem, workload, list(opts)
        cat = "Integer" if integer else "Continuous"
        self.n = {o: problem.add_variable(f"n{i}", lowBound=0, cat=cat) for i, o in enumerate(self.opts)}
        gpu = [o for o in self.opts if o.device != CPU]
        problem += pulp.lpSum(self.n[o] * (1.0 if o.device == CPU else GPU_REPLICA_CPUS) for o in self.opts) <= workload.cpus
        if gpu:
            problem += pulp.lpSum(self.n[o] * o.gpus for o in gpu) <= workload.gpus
            problem += (pulp.lpSum(self.n[o] * (o.peak_bytes / GiB) for o in gpu)
                        <= workload.gpus * workload.device_memory_bytes / GiB)
        if integer:
            for op in workload.profile.operators:
                problem += pulp.lpSum(self.n[o] for o in self.opts if o.operator == op.name) >= 1

    def throughput_at_least(self, t: pulp.LpVariable, regime: str) -> None:
        """Constrain ``t`` to at most the pipeline's input items/s on ``regime``."""
        features = self.workload.profile.workloads[regime]
        share = reach(self.workload.profile)
        busy = {o: self.problem.add_variable(f"s_{regime}_{i}", lowBound=0) for i, o in enumerate(self.opts) if o.device != CPU}
        for o, s in busy.items():
            self.problem += s <= self.n[o]
        if busy:
            self.problem += pulp.lpSum(busy.values()) <= self.workload.gpus
        for op in self.workload.profile.operators:
            capacity = pulp.lpSum((self.n[o] if o.device == CPU else busy[o]) * rate(self.workload.profile, o, features)
                                  for o in self.opts if o.operator == op.name)
            self.problem += capacity >= share[op.name] * t

    def replicas(self) -> dict[Option, float]:
        return {o: float(v.value() or 0.0) for o, v in self.n.items()}


def _solve(problem: pulp.LpProblem) -> None:
    status = problem.solve(pulp.HiGHS(msg=False, timeLimit=SOLVE_LIMIT_S) if pulp.HiGHS().available()
                           else pulp.PULP_CBC_CMD(msg=False, timeLimit=SOLVE_LIMIT_S))
    if pulp.LpStatus[status] != "Optimal":
        raise RuntimeError(f"headroom model {problem.name!r} ended {pulp.LpStatus[status]}")


def regime_optimum(workload: Workload, regime: str, opts: Sequence[Option] | None = None,
                   integer: bool = True) -> tuple[float, dict[Option, float]]:
    """The best throughput of one regime and its replicas: an LP, ``max T`` s.t. every operator's capacity covers
    ``reach * T``."""
    problem = pulp.LpProblem(f"regime_{regime}", pulp.LpMaximize)
    model = _Model(problem, workload, opts if opts is not None else options(workload), integer)
    t = problem.add_variable("T", lowBound=0)
    problem += t
    model.throughput_at_least(t, regime)
    _solve(problem)
    return float(t.value()), model.replicas()


def throughput_of(workload: Workload, replicas: Mapping[Option, float], regime: str) -> float:
    """Input items/s of fixed replicas on one regime (the devices' time split at its best for the regime)."""
    problem = pulp.LpProblem(f"fixed_{regime}", pulp.LpMaximize)
    model = _Model(problem, workload, list(replicas), integer=False)
    for o, n in replicas.items():
        problem += model.n[o] == n
    t = problem.add_variable("T", lowBound=0)
    problem += t
    model.throughput_at_least(t, regime)
    _solve(problem)
    return float(t.value())


def best_static(workload: Workload, bounds: Mapping[str, float], opts: Sequence[Option] | None = None,
                integer: bool = True) -> dict[Option, float]:
    """The one set of replicas that minimises the stream's duration (hindsight): ``min sum_r items_r / T_r`` over one
    allocation, a convex program solved as an LP with tangent cuts of ``1 / T`` (outer approximation).

    ``1 / T`` is convex, so each tangent ``2 / t - T / t**2`` lies under it and the model over the
    tangents under-estimates the duration; the cuts are placed on a geometric grid below each
    regime's own optimum ``bounds[r]`` (no single allocation beats it) and refined twice around the
    solution, after which the exact duration of the replicas found is what is reported.
    """
    opts = list(opts if opts is not None else options(workload))
    items: dict[str, int] = {}
    for r, n in workload.schedule:
        items[r] = items.get(r, 0) + n
    points = {r: [bounds[r] * 10 ** (-3 * k / (_CUTS - 1)) for k in range(_CUTS)] for r in items}
    replicas: dict[Option, float] = {}
    for _ in range(3):
        problem = pulp.LpProblem("static_hindsight", pulp.LpMinimize)
        model = _Model(problem, workload, opts, integer)
        t = {r: problem.add_variable(f"T_{r}", lowBound=bounds[r] * 1e-3, upBound=bounds[r]) for r in items}
        z = {r: problem.add_variable(f"z_{r}", lowBound=0) for r in items}
        problem += pulp.lpSum(items[r] * z[r] for r in items)
        for r in items:
            model.throughput_at_least(t[r], r)
            for p in points[r]:
                problem += z[r] >= 2.0 / p - t[r] / p**2
        _solve(problem)
        replicas = model.replicas()
        for r in items:
            found = float(t[r].value())
            points[r] += [found * (1 + d) for d in (-0.02, -0.01, -0.005, 0.0, 0.005, 0.01, 0.02) if found * (1 + d) > 0]
    return {o: n for o, n in replicas.items() if n > 1e-9}


def headroom(workload: Workload, integer: bool = True) -> Headroom:
    """Per-regime optimum switched for free vs the best single static in hindsight."""
    opts = options(workload)
    regimes = list(dict.fromkeys(r for r, _ in workload.schedule))
    optimum = {r: regime_optimum(workload, r, opts, integer)[0] for r in regimes}
    replicas = best_static(workload, optimum, opts, integer)
    static_tp = {r: throughput_of(workload, replicas, r) for r in regimes}
    oracle_s = sum(n / optimum[r] for r, n in workload.schedule)
    static_s = sum(n / static_tp[r] for r, n in workload.schedule)
    shown = {f"{o.operator} {o.label()}": round(n, 3) for o, n in replicas.items() if n > 1e-6}
    return Headroom(workload.name, integer, oracle_s, static_s, optimum, static_tp, shown)


def with_derived_gpu(profile: PipelineProfile, operator: str, speedup: float, cold_start_extra_s: float = 2.0) -> PipelineProfile:
    """``profile`` with a GPU cost for ``operator`` derived from its CPU cost (a what-if, not a measurement):
    seconds divided by ``speedup``, the same memory as on CPU, ``cold_start_extra_s`` more to start."""
    ops = []
    for op in profile.operators:
        if op.name == operator:
            cpu = op.device(CPU)
            gpu = replace(cpu, per_batch_s=cpu.per_batch_s / speedup, per_item_s=cpu.per_item_s / speedup,
                          per_unit_s={f: c / speedup for f, c in cpu.per_unit_s.items()}, cold_start_s=cpu.cold_start_s + cold_start_extra_s)
            op = replace(op, devices={**op.devices, GPU: gpu}, notes=f"gpu entry DERIVED from cpu / {speedup:g} (what-if)")
        ops.append(op)
    return replace(profile, operators=tuple(ops))


def equal_time(name: str, profile: PipelineProfile, cpus: float, gpus: float, regimes: Sequence[str], seconds: float,
               device_memory_bytes: int = 8 * GiB, note: str = "") -> Workload:
    """A workload whose regimes each last ``seconds`` when run at their own optimum (production speed)."""
    probe = Workload(name, profile, cpus, gpus, device_memory_bytes, tuple((r, 1) for r in regimes))
    opts = options(probe)
    schedule = tuple((r, max(1, int(regime_optimum(probe, r, opts)[0] * seconds))) for r in regimes)
    return replace(probe, schedule=schedule, note=note)


def candidate_workloads(seconds: float = 180.0) -> list[Workload]:
    """The closed-loop benchmarks' workloads and the candidates for workloads with headroom."""
    docs, video = PipelineProfile.load("documents"), PipelineProfile.load("video")
    ocr_gpu = with_derived_gpu(docs, "ocr", 10.0)
    return [
        Workload("docs-baseline", docs, 16, 2, 8 * GiB, (("short", 600), ("long", 60), ("scans", 40), ("short", 600)),
                 note="the closed-loop benchmark's stream (16 CPUs + 2 GPUs, OCR on CPU)"),
        Workload("video-baseline", video, 16, 2, 8 * GiB, (("small", 150), ("hd", 150), ("long", 30), ("small", 150)),
                 note="the closed-loop-video benchmark's stream"),
        equal_time("cpu-only", docs, 16, 0, ("short", "scans", "long"), seconds,
                   note=f"documents on one 16-CPU node, regimes of {seconds:g} s each at their optimum"),
        equal_time("gpu-ocr-whatif", ocr_gpu, 16, 2, ("short", "scans", "long"), seconds,
                   note=f"documents on 16 CPUs + 2 GPUs with OCR allowed on the GPUs at 10x its CPU speed (DERIVED what-if, "
                        f"no GPU measured it), regimes of {seconds:g} s each"),
        equal_time("video", video, 16, 2, ("small", "hd", "long"), seconds,
                   note=f"video on 16 CPUs + 2 GPUs, regimes of {seconds:g} s each"),
    ]


def run(quick: bool) -> BenchResult:
    """Benchmark ``headroom``: each candidate workload's headroom, with whole replicas (summary) and relaxed (raw):
    the closed-loop workloads, candidate workloads (documents on a CPU-only node; documents with OCR on the GPUs,
    labelled as a what-if with a derived GPU cost until a GPU measures it) and the corpus workloads
    (``corpus_workloads``: drawn from published corpus statistics; a workload's ``sources`` names them)."""
    from benchmarks.corpus_workloads import CORPORA, corpus_workload

    workloads = candidate_workloads(60.0 if quick else 180.0) + [corpus_workload(name, quick)[0] for name in CORPORA]
    results = [(w, headroom(w), headroom(w, integer=False)) for w in workloads]
    summary = {w.name: round(h.ratio, 4) for w, h, _ in results}
    raw = {w.name: {"whole_replicas": h.to_dict(), "relaxed": f.to_dict(), "schedule": [list(s) for s in w.schedule],
                    "cpus": w.cpus, "gpus": w.gpus, "device_memory_bytes": w.device_memory_bytes, "note": w.note,
                    **({"sources": list(w.sources)} if w.sources else {})}
           for w, h, f in results}
    notes = ("Headroom = duration of the stream under the best single static configuration chosen in hindsight (knowledge "
             "no user has) / duration if every regime ran its own optimum, switched for free. Searched on the cost models "
             "(profiles/*.json) over mixed configurations per operator (device x batch size x GPU share 1, 1/2, 1/4), "
             "whole replicas (every operator keeps one; summary) and relaxed (raw), GPU work in device time shared by "
             "co-located replicas without overhead (time-slicing: the share follows the regime even for a static "
             "configuration), every replica holding one CPU. The gpu-ocr-whatif workload's OCR GPU cost is derived "
             "(CPU cost / 10), not measured. documents-corpus and video-corpus are drawn from published corpus statistics "
             "(raw.<workload>.sources; benchmarks/corpus_workloads.py, docs/workloads.md), their sources as regimes. "
             "Workload notes in raw.")
    return BenchResult("headroom", summary, raw=raw, figure=_figure(results), notes=notes)


def _figure(results: list[tuple[Workload, Headroom, Headroom]]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.8))
    names = [w.name for w, _, _ in results]
    xs = list(range(len(names)))
    whole = [h.ratio for _, h, _ in results]
    relaxed = [f.ratio for _, _, f in results]
    ax.bar([x - 0.2 for x in xs], whole, width=0.4, color="#3465a4", label="whole replicas")
    ax.bar([x + 0.2 for x in xs], relaxed, width=0.4, color="#9db7dc", label="relaxed (fluid)")
    ax.set_xticks(xs, names)
    ax.axhline(1.0, color="black", linewidth=0.8)
    for x, r in zip(xs, whole):
        ax.text(x - 0.2, r + 0.02, f"{r:.2f}x", ha="center", fontsize=8)
    ax.legend(loc="upper right")
    ax.set_ylabel("static hindsight / per-regime optimum")
    ax.set_title("How much any scheduler could gain, by workload (cost-model fluid optimum)")
    fig.tight_layout()
    return fig
