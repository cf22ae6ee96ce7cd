"""Benchmark "optimize": OOM-safe Bayesian optimisation against unconstrained skopt and random search.

Contract: ``run(quick) -> BenchResult``. Synthetic operators with known throughput and memory curves
(``make_operator``) are tuned by three methods with the same operators, seeds and evaluation budget,
each evaluation a canary window (``canary_window``):
- ``trident``: ``scheduler.optimize.ConfigOptimizer`` (memory GP, safe expansion, OOM regions);
- ``skopt_unconstrained``: the same skopt GP/EI optimiser told an OOM as a penalty worse than anything
  seen (how one uses ``gp_minimize`` without a constraint model);
- ``random``: uniform random configs (batch size log-uniform).
Summary (trident's; the others' under ``baselines``) and targets: ``median_evals_to_5pct`` (<= 15), the
median over operators of evaluations until a truly safe config within 5% of the best safe one
(``evals_to_within``); ``violation_rate`` (< 0.01), evaluations that ran out of memory / evaluations run.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from skopt.space import Categorical, Integer

from benchmarks.report import BenchResult, Target
from trident_flows.core.types import CPU, GPU, BatchSample, ConfigSpace, KnobSpace, OpConfig, Outcome
from trident_flows.scheduler.canary import CanaryPolicy, Verdict, decide, measure
from trident_flows.scheduler.constraint import MemoryBudget
from trident_flows.scheduler.optimize import ConfigOptimizer
from trident_flows.scheduler.optimizer_values import NoSafeConfigError, objective
from trident_flows.scheduler.search_space import surrogate_optimizer

MiB, GiB = 2**20, 2**30
BATCH_MAX = 512
WITHIN = 0.05
SAFETY_MARGIN = 0.1  # the user's margin: the reference optimum respects it, violations are counted against the full budget
METHODS = ("trident", "skopt_unconstrained", "random")
WINDOW = CanaryPolicy(rel_ci=0.05, min_batches=4, max_batches=16, max_window_s=3600.0)
_Z99 = 2.3263


@dataclass(frozen=True)
class DeviceCurve:
    """Seconds per batch ``(t0 + t1*b*f + t2*(b*f)**2) / speedups`` and peak memory
    ``resident + b*f*per_item*knob factors*(jump if b >= cliff)``, for mean item size ``f``."""

    t0: float
    t1: float
    t2: float
    resident: float
    per_item: float
    fp16_speed: float
    cliff: float  # batch size where memory jumps (inf: no cliff)
    jump: float
    budget: float


@dataclass(frozen=True)
class SynthOperator:
    name: str
    space: ConfigSpace
    budget: MemoryBudget
    curves: dict[str, DeviceCurve]
    size_sigma: float  # item sizes are lognormal(0, size_sigma)
    noise: float  # per-batch throughput noise (lognormal sigma)
    prefetch_gain: float

    def seconds(self, config: OpConfig, f: np.ndarray | float) -> np.ndarray:
        c = self.curves[config.device]
        bf = config.batch_size * np.asarray(f)
        speed = (1 + self.prefetch_gain * (1 - math.exp(-(config.knob("prefetch") - 1) / 2)))
        speed *= c.fp16_speed if config.knob("precision") == "fp16" else 1.0
        return (c.t0 + c.t1 * bf + c.t2 * bf**2) / speed

    def memory(self, config: OpConfig, f: np.ndarray | float) -> np.ndarray:
        c = self.curves[config.device]
        factor = (1 + 0.12 * (config.knob("prefetch") - 1)) * (0.6 if config.knob("precision") == "fp16" else 1.0)
        jump = c.jump if config.batch_size >= c.cliff else 1.0
        return c.resident + config.batch_size * np.asarray(f) * c.per_item * factor * jump

    def mean_size(self) -> float:
        return math.exp(self.size_sigma**2 / 2)

    def size_q99(self, batch_size: int) -> float:
        """99th percentile of the mean item size of a batch (Fenton-Wilkinson lognormal approximation)."""
        m = self.mean_size()
        v = (math.exp(self.size_sigma**2) - 1) * math.exp(self.size_sigma**2) / batch_size
        s2 = math.log(1 + v / m**2)
        return math.exp(math.log(m) - s2 / 2 + _Z99 * math.sqrt(s2))

    def true_objective(self, config: OpConfig) -> float:
        return objective(config, config.batch_size / float(self.seconds(config, self.mean_size())))

    def truly_safe(self, config: OpConfig) -> bool:
        """Truly SAFE: memory at the 99th percentile of the batch's mean item size is within the budget less the user's
        ``SAFETY_MARGIN`` (the region the user allowed); the reference optimum is the best safe config of a dense grid."""
        limit = self.curves[config.device].budget * (1 - SAFETY_MARGIN)
        return float(self.memory(config, self.size_q99(config.batch_size))) <= limit

    def grid(self) -> list[OpConfig]:
        return [self.space.config(d, b, prefetch=p, precision=q) for d in self.space.devices for p in range(1, 9)
                for q in ("fp16", "fp32") for b in range(1, BATCH_MAX + 1)]

    def optimum(self) -> float:
        return max(self.true_objective(c) for c in self.grid() if self.truly_safe(c))


def make_operator(index: int, rng: np.random.Generator) -> SynthOperator:
    """A random operator: CPU-only or CPU+GPU, with an interior or edge throughput optimum, a
    memory frontier somewhere in 8..300 items, and, for 40% of devices, a memory cliff."""
    def lu(lo: float, hi: float) -> float:
        return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))

    devices = (CPU, GPU) if rng.random() < 0.6 else (CPU,)
    sigma = float(rng.uniform(0.2, 0.6))
    curves: dict[str, DeviceCurve] = {}
    cpu_t1 = lu(2e-3, 2e-2)
    for device in devices:
        t1 = cpu_t1 if device == CPU else cpu_t1 / lu(5, 40)
        t2 = t1 * (lu(1e-3, 3e-2) if device == CPU else lu(1e-4, 1e-2))
        resident = lu(0.2, 1.0) * GiB if device == CPU else lu(1.0, 6.0) * GiB
        per_item_bytes = lu(2, 50) * MiB if device == CPU else lu(10, 200) * MiB
        front = lu(8, 300)  # batch size where the default knobs reach the budget at a high item size
        budget = max(resident + front * per_item_bytes * 1.6 * 1.36, resident / 0.7)  # resident <= 70% of the budget
        cliff, jump = (front * float(rng.uniform(0.3, 1.2)), float(rng.uniform(1.3, 2.0))) if rng.random() < 0.4 else (math.inf, 1.0)
        curves[device] = DeviceCurve(t0=float(rng.uniform(0.02, 0.2)) if device == CPU else float(rng.uniform(0.05, 0.3)), t1=t1, t2=t2,
                                     resident=resident, per_item=per_item_bytes, fp16_speed=0.75 if device == CPU else 1.4,
                                     cliff=cliff, jump=jump, budget=budget)
    space = ConfigSpace(devices=devices, batch_size_min=1, batch_size_max=BATCH_MAX,
                        knobs=(KnobSpace("prefetch", "int", 1, 8), KnobSpace("precision", "categorical", choices=("fp16", "fp32"))))
    budget = MemoryBudget(cpu_bytes=int(curves[CPU].budget), gpu_bytes=int(curves[GPU].budget) if GPU in curves else None)
    return SynthOperator(f"synth-{index}", space, budget, curves, sigma, float(rng.uniform(0.03, 0.12)), float(rng.uniform(0.1, 0.5)))


@dataclass(frozen=True)
class Evaluation:
    config: OpConfig
    oom: bool
    batches: int
    true_fraction: float  # true objective / safe optimum (0 when OOM or not truly safe)


def canary_window(op: SynthOperator, config: OpConfig, rng: np.random.Generator,
                  on_features: Callable[[dict[str, float], int], None]) -> tuple[list[BatchSample], bool]:
    """Run batches of ``config`` until the canary protocol stops measuring (``WINDOW``: the throughput mean known to
    +-5%, at least 4, at most 16 batches); returns (batches, oom). Every batch draws its items' sizes, so peak memory
    varies with the workload; a batch whose memory passes the true budget is an OOM and ends the evaluation (a
    violation, counted against the full budget). ``on_features`` gets each batch's per-item features and its item
    count (trident's ``observe_features``)."""
    samples: list[BatchSample] = []
    clock = 0.0
    budget = op.curves[config.device].budget
    while True:
        sizes = rng.lognormal(0.0, op.size_sigma, config.batch_size)
        f = float(sizes.mean())
        on_features({"size": f}, config.batch_size)
        peak = int(float(op.memory(config, f)) * (1 + abs(rng.normal(0, 0.01))))
        busy = float(op.seconds(config, f)) * float(rng.lognormal(0.0, op.noise))
        oom = peak > budget
        mem = {"peak_host_mem_bytes": peak} if config.device == CPU else {"peak_device_mem_bytes": peak}
        samples.append(BatchSample(op.name, "canary", config, clock, clock + busy, busy, config.batch_size,
                                   0 if oom else config.batch_size, {"size": f * config.batch_size},
                                   outcome=Outcome.OOM if oom else Outcome.OK, **mem))
        clock += busy
        if oom:
            return samples, True
        if decide(samples, [], elapsed_s=clock, policy=WINDOW).verdict != Verdict.MEASURE:
            return samples, False


def _record(op: SynthOperator, config: OpConfig, samples: list[BatchSample], oom: bool, optimum: float) -> Evaluation:
    good = not oom and op.truly_safe(config)
    return Evaluation(config, oom, len(samples), op.true_objective(config) / optimum if good else 0.0)


def run_trident(op: SynthOperator, n_evals: int, seed: int, optimum: float) -> tuple[list[Evaluation], str]:
    rng = np.random.default_rng(seed)
    opt = ConfigOptimizer(op.space, op.budget, operator=op.name, safety_margin=SAFETY_MARGIN, seed=seed, max_evals=n_evals)
    evals: list[Evaluation] = []
    try:
        while (proposal := opt.ask()) is not None:
            samples, oom = canary_window(op, proposal.config, rng, opt.observe_features)
            m = measure(samples)
            if oom:
                opt.tell_oom(proposal.config, m.features, m.items)
            else:
                resident = op.curves[proposal.config.device].resident * (1 + abs(rng.normal(0, 0.01)))
                opt.tell(proposal.config, m.throughput, m.peak_memory, m.features, resident_memory=resident, items=m.items)
            evals.append(_record(op, proposal.config, samples, oom, optimum))
    except NoSafeConfigError as err:
        return evals, f"error: {err}"
    return evals, opt.status


def _dimensions(op: SynthOperator) -> list[Any]:
    dims: list[Any] = [Categorical(list(op.space.devices), name="device")] if len(op.space.devices) > 1 else []
    return dims + [Integer(1, BATCH_MAX, prior="log-uniform", name="batch_size"), Integer(1, 8, name="prefetch"),
                   Categorical(["fp16", "fp32"], name="precision")]


def _decode(op: SynthOperator, point: list[Any]) -> OpConfig:
    values = list(point) if len(op.space.devices) > 1 else [CPU] + list(point)
    return op.space.config(str(values[0]), int(values[1]), prefetch=int(values[2]), precision=str(values[3]))


def run_skopt(op: SynthOperator, n_evals: int, seed: int, optimum: float) -> tuple[list[Evaluation], str]:
    """skopt's GP/EI optimiser with 5 random initial points, told the objective, and on an OOM a penalty worse than
    anything seen."""
    rng = np.random.default_rng(seed)
    opt = surrogate_optimizer(_dimensions(op), seed, n_initial_points=5)
    evals: list[Evaluation] = []
    ys: list[float] = []
    for _ in range(n_evals):
        with warnings.catch_warnings():  # skopt warns when its acquisition repeats a point and it draws a random one
            warnings.simplefilter("ignore", UserWarning)
            point = opt.ask()
        config = _decode(op, point)
        samples, oom = canary_window(op, config, rng, lambda f, n: None)
        if oom:
            y = max(ys, default=0.0) + 1.0
        else:
            y = -math.log(max(objective(config, measure(samples).throughput), 1e-12))
            ys.append(y)
        opt.tell(point, y)
        evals.append(_record(op, config, samples, oom, optimum))
    return evals, "budget used"


def run_random(op: SynthOperator, n_evals: int, seed: int, optimum: float) -> tuple[list[Evaluation], str]:
    rng = np.random.default_rng(seed)
    pick = np.random.default_rng(seed + 7919)
    evals: list[Evaluation] = []
    for _ in range(n_evals):
        config = op.space.config(str(pick.choice(op.space.devices)), int(round(math.exp(pick.uniform(0, math.log(BATCH_MAX))))),
                                 prefetch=int(pick.integers(1, 9)), precision=str(pick.choice(["fp16", "fp32"])))
        samples, oom = canary_window(op, config, rng, lambda f, n: None)
        evals.append(_record(op, config, samples, oom, optimum))
    return evals, "budget used"


RUNNERS = {"trident": run_trident, "skopt_unconstrained": run_skopt, "random": run_random}


def evals_to_within(evals: list[Evaluation], n_evals: int) -> int:
    """1-based index of the first safe evaluation within 5% of the optimum; ``n_evals + 1`` if none (operators that
    never get there count as budget + 1 in the median)."""
    for i, e in enumerate(evals, start=1):
        if e.true_fraction >= 1 - WITHIN:
            return i
    return n_evals + 1


def best_so_far(evals: list[Evaluation], n_evals: int) -> list[float]:
    """Best true fraction of the optimum after 1..n_evals evaluations (flat after the method stopped)."""
    out, best = [], 0.0
    for i in range(n_evals):
        if i < len(evals):
            best = max(best, evals[i].true_fraction)
        out.append(best)
    return out


def _figure(curves: dict[str, np.ndarray], rates: dict[str, float], per_op: dict[str, float], n_evals: int):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    x = np.arange(1, n_evals + 1)
    for method, data in curves.items():
        med = np.median(data, axis=0)
        ax1.plot(x, med, label=method)
        ax1.fill_between(x, np.quantile(data, 0.25, axis=0), np.quantile(data, 0.75, axis=0), alpha=0.2)
    ax1.axhline(1 - WITHIN, color="grey", ls="--", lw=1, label="within 5% of safe optimum")
    ax1.set(xlabel="evaluations", ylabel="best safe so far (fraction of safe optimum)", ylim=(0, 1.05),
            title="best-so-far: median and IQR over operators")
    ax1.legend(loc="lower right")
    methods = list(rates)
    bars = ax2.bar(methods, [100 * rates[m] for m in methods], color=["C0", "C1", "C2"][: len(methods)])
    for bar, m in zip(bars, methods):
        ax2.annotate(f"{100 * rates[m]:.1f}%\n{per_op[m]:.2f}/op", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                     ha="center", va="bottom")
    ax2.axhline(1.0, color="grey", ls="--", lw=1, label="target 1%")
    ax2.set(ylabel="evaluations that ran out of memory (%)", title="budget violations per method")
    ax2.legend()
    fig.tight_layout()
    return fig


def run(quick: bool) -> BenchResult:
    n_ops, n_evals = (10, 20) if quick else (50, 30)
    rng = np.random.default_rng(2026)
    operators = [make_operator(i, rng) for i in range(n_ops)]
    per_method: dict[str, dict[str, list]] = {m: {"to_5pct": [], "ooms": [], "evals": [], "curves": [], "status": []} for m in METHODS}
    timing = {m: 0.0 for m in METHODS}
    raw_ops = []
    for i, op in enumerate(operators):
        optimum = op.optimum()
        row: dict[str, Any] = {"operator": op.name, "devices": list(op.space.devices), "optimum": optimum,
                               "cliff": {d: (c.cliff if math.isfinite(c.cliff) else None) for d, c in op.curves.items()}}
        for method in METHODS:
            start = time.perf_counter()
            evals, status = RUNNERS[method](op, n_evals, 1000 + i, optimum)
            timing[method] += time.perf_counter() - start
            stats = per_method[method]
            stats["to_5pct"].append(evals_to_within(evals, n_evals))
            stats["ooms"].append(sum(e.oom for e in evals))
            stats["evals"].append(len(evals))
            stats["curves"].append(best_so_far(evals, n_evals))
            stats["status"].append(status)
            row[method] = {"evals_to_5pct": evals_to_within(evals, n_evals), "evaluations": len(evals), "ooms": sum(e.oom for e in evals),
                           "final_fraction": best_so_far(evals, n_evals)[-1], "status": status,
                           "configs": [e.config.label() + (" OOM" if e.oom else "") for e in evals]}
        raw_ops.append(row)

    def figures(method: str) -> dict[str, float]:
        s = per_method[method]
        return {"median_evals_to_5pct": float(np.median(s["to_5pct"])), "violation_rate": sum(s["ooms"]) / max(sum(s["evals"]), 1)}

    summary = dict(figures("trident"))
    summary["baselines"] = {m: figures(m) for m in METHODS if m != "trident"}
    details = {m: {"share_reached_5pct": float(np.mean([v <= n_evals for v in per_method[m]["to_5pct"]])),
                   "violations_per_operator": float(np.mean(per_method[m]["ooms"])),
                   "operators_with_violation": int(sum(v > 0 for v in per_method[m]["ooms"])),
                   "mean_evaluations": float(np.mean(per_method[m]["evals"])),
                   "median_final_fraction": float(np.median([c[-1] for c in per_method[m]["curves"]])),
                   "seconds": timing[m]} for m in METHODS}
    rates = {m: (summary if m == "trident" else summary["baselines"][m])["violation_rate"] for m in METHODS}
    fig = _figure({m: np.array(per_method[m]["curves"]) for m in METHODS}, rates,
                  {m: details[m]["violations_per_operator"] for m in METHODS}, n_evals)
    notes = (f"{n_ops} synthetic operators, budget {n_evals} evaluations each; an evaluation is a canary window of 4..16 batches. "
             "evals_to_5pct counts evaluations until a truly safe config within 5% of the best safe one was evaluated "
             f"({n_evals + 1} = never). violation_rate = evaluations that ran out of memory / evaluations run. "
             "trident stops by itself when its expected gain is small, so it may run fewer evaluations.")
    return BenchResult("optimize", summary, {"median_evals_to_5pct": Target("<=", 15), "violation_rate": Target("<", 0.01)},
                       raw={"n_operators": n_ops, "n_evals": n_evals, "methods": details, "operators": raw_ops}, figure=fig, notes=notes)
