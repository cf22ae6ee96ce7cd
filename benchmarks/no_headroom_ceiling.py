"""``bench no-headroom-ceiling``: the most any policy that starts where trident starts (static-default) can get, as a
share of the best static allocation in hindsight (S*), on the short streams without headroom. SIMULATED.

Contract of ``run(quick, suite_results, log) -> BenchResult``:
- Per workload of ``WORKLOADS``: static-default and S* run as ``bench warm-start`` runs them (the closed-loop suite's
  stream, node, tick and references, ``warm_start.references``).
- The binding operator is the one busiest under static-default. Where it is binding (busy >= ``BINDING_BUSY``) and
  its work does not depend on its configuration (no per-batch cost on any device, and each device's costs a
  constant multiple of the others'; where it runs on GPUs, no other operator holds one), its work is fixed: ``work_s``, the device-seconds its batches took under
  static-default, in units of one replica on its default device. No policy finishes that work before
  ``finish_bound_s``: from the streaming start, the capacity static-default gives it; from the first tick plus the
  cold start of a new CPU replica (actor start and the model's, at the stream's time scale), plus every CPU the
  other operators (one replica each) and its GPU replicas leave; from the first tick plus a new GPU replica's cold
  start, every GPU too. A device runs one kernel at a time, so a GPU adds one unit however it is shared; a CPU
  replica adds the GPU/CPU cost ratio. The ceiling is the stream's input items over (that time - static-default's
  first output), the closed-loop rate, over S*'s rate. Generous: the operator works from the streaming start, new
  replicas start the moment the first tick sees the pipeline, and nothing else is in the way.
- A workload whose binding operator does not meet those conditions gets no ceiling (``None``) and the reason.
- ``summary`` per workload: ``ceiling_work_bound`` (over S*), ``default_vs_static_hindsight``, ``binding_busy``;
  ``raw`` adds the allocations, the binding operator, its work, the phases of capacity and the reason where there
  is no ceiling. No targets: it says how far the no-headroom targets of ``bench warm-start`` (>= 0.97 of S*) are from
  reach for any policy, not how trident does. The figure: per workload, static-default, the ceiling and that target,
  as shares of S*.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from benchmarks import allocation, suite_sim
from benchmarks.closed_loop_runs import TICK_S
from benchmarks.report import BenchResult
from benchmarks.warm_start import NO_HEADROOM, REFRESH, SUITE_RESULTS, references
from trident_flows.core.types import CPU
from trident_flows.runtime.costmodel import DeviceCost
from trident_flows.sim.driver import SimRun, simulate
from trident_flows.sim.runner import SimRunner

WORKLOADS = NO_HEADROOM
BINDING_BUSY = 0.95  # an operator this busy under static-default caps its rate
TARGET = 0.97  # bench warm-start's no-headroom target, as a share of S*


def finish_bound_s(work_s: float, phases: Sequence[tuple[float, float]]) -> float:
    """The earliest time ``work_s`` units of work are done at the capacity ``phases`` give: (from time, units per
    second) in time order, the last one lasting; ``inf`` when they never finish it."""
    done = 0.0
    for (start, capacity), end in zip(phases, [p[0] for p in phases[1:]] + [math.inf]):
        if capacity > 0 and done + capacity * (end - start) >= work_s:
            return start + (work_s - done) / capacity
        done += capacity * (end - start)
    return math.inf


def cost_ratio(costs: Mapping[str, DeviceCost], device: str) -> tuple[dict[str, float] | None, str]:
    """Each device's cost as a multiple of ``device``'s, when every device's costs are that one multiple of it and no
    device has a per-batch cost (work then does not depend on batch size or device); else (None, why)."""
    base = costs[device]
    ratios: dict[str, float] = {}
    for name, cost in costs.items():
        if cost.per_batch_s > 0 or base.per_batch_s > 0:
            return None, f"{name} has a per-batch cost: its work depends on the batch size"
        pairs = [(cost.per_item_s, base.per_item_s)] + [(cost.per_unit_s.get(u, 0.0), v) for u, v in base.per_unit_s.items()]
        pairs += [(v, base.per_unit_s.get(u, 0.0)) for u, v in cost.per_unit_s.items()]
        found = {round(a / b, 9) for a, b in pairs if b > 0} | ({math.inf} if any(a > 0 and b <= 0 for a, b in pairs) else set())
        if len(found) != 1 or math.inf in found:
            return None, f"{name}'s costs are not one multiple of {device}'s: its work depends on where it runs"
        ratios[name] = found.pop()
    return ratios, ""


def cold_start_s(runner: SimRunner, operator: str, device: str) -> float:
    """The simulator's cold start of a new replica of ``operator`` on ``device``: actor start plus its model's."""
    return runner.actor_start.latency_s + runner.ops[runner.names.index(operator)].cold_start_s(device)


def evaluate(name: str, results: Mapping[str, Any], log: Callable[[str], None]) -> dict[str, Any]:
    """The ceiling of one workload (module docstring)."""
    w = suite_sim.prepare(name, False)
    static, _ = references(results, name, w)
    items = w.stream.items

    def run(policy: Any, start: Any) -> SimRun:
        spec = w.stream.spec(w.profile, start, f"suite-sim-{w.suite.name}-ceiling")
        return simulate(spec, w.cluster, policy, tick_s=TICK_S, tick_charge_s=0.0)

    default = run(None, w.start)
    s_star = run(suite_sim.static_policy(static, items, w.cluster), allocation.start_config(static))
    s_star_rate = s_star.summary["steady_items_per_s"]
    out: dict[str, Any] = {"static_hindsight": allocation.label(static), "static_default": allocation.label(allocation.allocation_of(w.start)),
                           "items": items, "regimes": w.suite.regimes,
                           "default_vs_static_hindsight": default.summary["steady_items_per_s"] / s_star_rate}
    runner = default.runner
    state = runner.state()
    bound = max(state.operators, key=lambda o: o.busy_fraction)
    out.update(binding_operator=bound.name, binding_busy=round(bound.busy_fraction, 3))
    replicas = [r.config for r in bound.replicas]
    devices = {c.device for c in replicas}
    costs = w.profile.operator(bound.name).devices
    ratios, why = cost_ratio(costs, next(iter(devices))) if len(devices) == 1 else (None, "it runs on two devices")
    if bound.busy_fraction < BINDING_BUSY:
        why = f"it is busy {bound.busy_fraction:.2f} of the time, under {BINDING_BUSY}: it does not cap the rate alone"
    elif any(r.config.gpus > 0 for run in (default, s_star) for o in run.runner.state().operators if o.name != bound.name for r in o.replicas):
        why = "other operators hold GPUs too: its device-seconds cannot be told apart from theirs"
    if why or ratios is None:
        out.update(ceiling_work_bound=None, no_ceiling=f"{bound.name}: {why}")
        log(f"no-headroom-ceiling {name}: no ceiling ({out['no_ceiling']})")
        return out
    home = next(iter(devices))
    pool = runner.pools[runner.names.index(bound.name)]
    work_s = _work_under(runner, bound.name, home)
    first_tick = runner.streamed_from + TICK_S
    others = len(state.operators) - 1  # one CPU each, at least
    gpus = int(w.cluster.total_gpus) if "gpu" in costs else 0
    unit = {d: 1.0 / ratios[d] for d in costs}  # one replica on d, in replicas on the home device

    def capacity(n_gpus: int, cpu_replicas: float) -> float:
        return n_gpus * unit.get("gpu", 0.0) + max(0.0, cpu_replicas) * unit.get(CPU, 0.0)

    held_gpus = len({d.key for r in pool.replicas.values() if r.placement is not None for d in r.placement.devices})
    phases = [(runner.streamed_from, capacity(held_gpus, sum(1 for c in replicas if c.device == CPU)))]
    if CPU in costs:
        phases.append((first_tick + cold_start_s(runner, bound.name, CPU), capacity(held_gpus, w.cluster.total_cpus - others - held_gpus)))
    if gpus > held_gpus:
        phases.append((first_tick + cold_start_s(runner, bound.name, "gpu"), capacity(gpus, w.cluster.total_cpus - others - gpus)))
    phases = [(t, max(c for s, c in phases if s <= t)) for t, _ in sorted(phases)]  # a later phase never has less
    end_s = finish_bound_s(work_s, phases)
    rate = items / (end_s - runner.first_output_at)
    out.update(work_s=round(work_s, 3), work_s_under_s_star=round(_work_under(s_star.runner, bound.name, home), 3),
               phases=[{"from_s": round(t, 3), "replicas_equivalent": round(c, 3)} for t, c in phases],
               finish_bound_s=round(end_s, 3), first_output_s=round(runner.first_output_at, 3),
               ceiling_work_bound=rate / s_star_rate)
    log(f"no-headroom-ceiling {name}: {bound.name} (busy {bound.busy_fraction:.3f}) has {work_s:.2f} s of work "
        f"({out['work_s_under_s_star']:.2f} s under S*); done no earlier than {end_s:.2f} s: at most {rate:.2f} items/s, "
        f"{out['ceiling_work_bound']:.3f} of S*'s {s_star_rate:.2f}")
    return out


def _work_under(runner: SimRunner, operator: str, home: str) -> float:
    """``operator``'s work in a finished run, in home-device seconds: its replicas' busy seconds on CPU, the GPUs' kernel
    seconds on GPU (it alone holds GPUs, as ``evaluate`` checks)."""
    if home == CPU:
        return sum(r.busy_s for r in runner.pools[runner.names.index(operator)].replicas.values())
    return sum(d.busy_s for node in runner.cluster.nodes for d in node.devices)


def run(quick: bool = False, suite_results: Path = SUITE_RESULTS, log: Callable[[str], None] = print) -> BenchResult:
    """The benchmark (module docstring); ``quick`` changes nothing: it takes seconds."""
    if not suite_results.exists():
        raise ValueError(f"{suite_results} is missing: run `{REFRESH}` first (the ceilings run its S*)")
    results = json.loads(suite_results.read_text())
    t0 = time.perf_counter()
    per_workload = {name: evaluate(name, results, log) for name in WORKLOADS}
    summary = {f"{name}.{key}": raw[key] for name, raw in per_workload.items()
               for key in ("ceiling_work_bound", "default_vs_static_hindsight", "binding_busy")}
    notes = ("SIMULATED. Per workload without headroom, an upper bound on the rate of any policy that starts in static-default "
             "(where trident starts) and acts no earlier than its first tick: the operator busiest under static-default has a "
             "fixed amount of work (no per-batch cost, device costs in one ratio), and no policy gets it done sooner than at "
             "the capacity static-default gives it until new replicas of it could be warm (first tick plus their cold start), "
             "then every CPU and GPU the other operators leave. Over S*'s rate (S*: knowledge no user has). bench warm-start "
             f"asks trident for >= {TARGET} of S* on these streams, cold and warm.")
    raw = {"workloads": per_workload, "suite_provenance": results.get("provenance"), "bench_seconds": round(time.perf_counter() - t0, 1)}
    return BenchResult("no-headroom-ceiling", summary, raw=raw, figure=figure(per_workload), notes=notes)


def figure(per_workload: Mapping[str, Mapping[str, Any]]) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    names = list(per_workload)
    xs = range(len(names))
    default = [per_workload[n]["default_vs_static_hindsight"] for n in names]
    bound = [per_workload[n]["ceiling_work_bound"] or 0.0 for n in names]
    ax.bar([x - 0.2 for x in xs], default, width=0.4, color="#aaaaaa", label="static-default (where trident starts)")
    ax.bar([x + 0.2 for x in xs], bound, width=0.4, color="#3465a4", label="ceiling for any policy starting there")
    for x, b in zip(xs, bound):
        ax.text(x + 0.2, b + 0.01, f"{b:.3f}" if b else "no bound", ha="center", fontsize=8)
    ax.axhline(TARGET, color="#cc0000", linestyle="--", linewidth=1, label=f"warm-start target ({TARGET} of S*)")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(list(xs), names)
    ax.set_ylabel("share of S* (best static in hindsight)")
    ax.set_ylim(0, 1.15)
    ax.set_title("No-headroom streams: the most a policy starting in static-default gets (SIMULATED)", fontsize=9)
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    return fig
