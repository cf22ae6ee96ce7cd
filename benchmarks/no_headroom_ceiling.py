"""``bench no-headroom-ceiling``: the most any policy that starts where trident starts (static-default) can get, as a
share of the best static allocation in hindsight (S*), on the short streams without headroom. SIMULATED.

Contract of ``run(quick, suite_results, log) -> BenchResult``:
- Per workload of ``WORKLOADS``: static-default, S* and O run as ``bench warm-start`` runs them (the closed-loop
  suite's stream, node, tick and references, ``warm_start.references``), each run's items done recorded every
  ``RECORD_S`` simulated seconds.
- ``spliced_rate`` is the ceiling of a switch at time t: a run that follows static-default until t and from then on
  goes as fast as the faster of S* and O did from the same number of items done (that reference's time from that
  count to its last output), switching instantly and for free. Its rate is input items over (its last output -
  static-default's first output), the closed-loop benchmarks' rate. Generous on purpose: no transition costs, and the
  references' pipelines were already full at that count.
- Switch times, each a ceiling for a policy that knows S* but acts no earlier:
  - ``first_tick``: static-default's streaming start plus the suite's tick (``TICK_S``), the first moment a policy
    looks at the running pipeline;
  - ``binding_replica``: ``first_tick`` plus the least cold start of a new replica of the binding operator (the one
    busiest under static-default): until a new replica of it serves, no change raises the rate it caps;
  - ``new_configs_warm``: ``first_tick`` plus the longest cold start among the configurations S* runs that
    static-default does not: a policy that decides on measurements has measured none of them before a replica of
    each is warm (its first batch counted as taking no time).
  A cold start is the simulator's (the operator's model for that device times the stream's time scale, plus the
  actor's start latency).
- ``summary`` per workload: ``ceiling_<switch>`` (over S*) and ``<switch>_s`` for each switch time, the
  ``binding_busy`` share, ``default_vs_static_hindsight``; ``raw`` adds the allocations, the binding operator and the
  configurations new to the run with their cold starts. No targets: it says how far the no-headroom targets of
  ``bench warm-start`` are from reach, not how trident does. The figure: items done over time per workload, the three
  runs and the spliced ones.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from benchmarks import allocation, suite_sim
from benchmarks.allocation import Allocation
from benchmarks.closed_loop_runs import TICK_S
from benchmarks.oracle_policy import OraclePolicy
from benchmarks.report import BenchResult
from benchmarks.warm_start import NO_HEADROOM, REFRESH, SUITE_RESULTS, references
from trident_flows.core.types import OpConfig
from trident_flows.sim.driver import SimRun, simulate
from trident_flows.sim.runner import SimRunner

WORKLOADS = NO_HEADROOM
RECORD_S = 0.05  # simulated seconds between two records of the items done
# each switch time and the summary key of its ceiling
CEILINGS = {"first_tick": "ceiling_first_tick", "binding_replica": "ceiling_binding_replica", "new_configs_warm": "ceiling_new_configs_warm"}


@dataclass(frozen=True)
class Progress:
    """A run's items done over simulated time, and its first and last outputs."""

    t: np.ndarray
    done: np.ndarray
    first_output_s: float
    last_output_s: float

    @classmethod
    def of(cls, run: SimRun) -> Progress:
        points = run.timeline
        return cls(np.array([p["t"] for p in points], dtype=float), np.array([p["inputs_done"] for p in points], dtype=float),
                   float(run.runner.first_output_at), float(run.runner.last_output_at))

    def spliced(self, reference: Progress, switch_s: float) -> tuple[np.ndarray, np.ndarray]:
        """(t, done) of this run until ``switch_s``, then of ``reference`` from the same count (for the figure)."""
        done = self.done_at(switch_s)
        shift = switch_s - reference.time_at(done)
        before, after = self.t <= switch_s, (reference.t + shift > switch_s) & (reference.done >= done)
        return np.concatenate((self.t[before], reference.t[after] + shift)), np.concatenate((self.done[before], reference.done[after]))

    def done_at(self, t: float) -> float:
        return float(np.interp(t, self.t, self.done))

    def time_at(self, done: float) -> float:
        """The simulated time the count passed ``done``: the end of its plateau at that count (for 0: the first output)."""
        return float(np.interp(done, *_increasing(self.done, self.t)))


def _increasing(done: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (done, t) points where the count last holds each value: an increasing x for ``np.interp``."""
    keep = np.concatenate((np.diff(done) > 0, [True]))
    return done[keep], t[keep]


def spliced_rate(items: int, start: Progress, refs: Sequence[Progress], switch_s: float) -> float:
    """Input items/s of a run that follows ``start`` until ``switch_s`` and then goes as the fastest of ``refs`` from
    the same count (module docstring)."""
    done = start.done_at(switch_s)
    if done >= items:
        return items / (start.last_output_s - start.first_output_s)
    ref = fastest_from(done, refs)
    return items / (switch_s + ref.last_output_s - ref.time_at(done) - start.first_output_s)


def fastest_from(done: float, refs: Sequence[Progress]) -> Progress:
    """The one of ``refs`` that took the least time from ``done`` items done to its last output."""
    return min(refs, key=lambda ref: ref.last_output_s - ref.time_at(done))


def new_configs(chosen: Allocation, default: Allocation) -> list[tuple[str, OpConfig]]:
    """The (operator, config) groups ``chosen`` runs that ``default`` does not."""
    running = {(name, config) for name, groups in default for config, _ in groups}
    return [(name, config) for name, groups in chosen for config, _ in groups if (name, config) not in running]


def cold_start_s(runner: SimRunner, operator: str, device: str) -> float:
    """The simulator's cold start of a new replica of ``operator`` on ``device``: actor start plus its model's."""
    return runner.actor_start.latency_s + runner.ops[runner.names.index(operator)].cold_start_s(device)


def binding(runner: SimRunner) -> tuple[str, float]:
    """The operator busiest over the run and its busy share (busy seconds over warm replica seconds)."""
    state = runner.state()
    op = max(state.operators, key=lambda o: o.busy_fraction)
    return op.name, op.busy_fraction


@dataclass
class Ceilings:
    """One workload's figures (``raw``) and the runs' progress behind them (for the figure)."""

    raw: dict[str, Any]
    default: Progress
    references: dict[str, Progress]
    switches: dict[str, float]


def evaluate(name: str, results: Mapping[str, Any], log: Callable[[str], None]) -> Ceilings:
    """The ceilings of one workload (module docstring)."""
    w = suite_sim.prepare(name, False)
    static, oracle = references(results, name, w)
    items = w.stream.items

    def run(policy: Any, start: Any) -> SimRun:
        spec = w.stream.spec(w.profile, start, f"suite-sim-{w.suite.name}-ceiling")
        return simulate(spec, w.cluster, policy, tick_s=TICK_S, record_s=RECORD_S)

    default = run(None, w.start)
    s_star = run(suite_sim.static_policy(static, items, w.cluster), allocation.start_config(static))
    o = run(OraclePolicy([(str(k), a, b) for k, (_, a, b) in enumerate(w.blocks)], {str(k): a for k, a in enumerate(oracle)},
                         w.cluster.total_cpus, w.cluster.total_gpus), allocation.start_config(oracle[0]))
    start, refs = Progress.of(default), [Progress.of(s_star), Progress.of(o)]
    s_star_rate = s_star.summary["steady_items_per_s"]
    runner = default.runner
    bound_op, busy = binding(runner)
    devices = {config.device for op, groups in (*allocation.allocation_of(w.start), *static) if op == bound_op for config, _ in groups}
    fresh = new_configs(static, allocation.allocation_of(w.start))
    first_tick = runner.streamed_from + TICK_S
    switches = {
        "first_tick": first_tick,
        "binding_replica": first_tick + min(cold_start_s(runner, bound_op, d) for d in sorted(devices)),
        "new_configs_warm": first_tick + max((cold_start_s(runner, op, c.device) for op, c in fresh), default=0.0),
    }
    out: dict[str, Any] = {"static_hindsight": allocation.label(static), "static_default": allocation.label(allocation.allocation_of(w.start)),
                           "items": items, "regimes": w.suite.regimes, "binding_operator": bound_op, "binding_busy": round(busy, 3),
                           "new_configs": [f"{op} {c.label()} ({cold_start_s(runner, op, c.device):.2f} s)" for op, c in fresh],
                           "default_vs_static_hindsight": default.summary["steady_items_per_s"] / s_star_rate}
    for key, t in switches.items():
        out[f"{key}_s"] = round(t, 3)
        out[CEILINGS[key]] = spliced_rate(items, start, refs, t) / s_star_rate
    log(f"no-headroom-ceiling {name}: binding {bound_op} (busy {busy:.2f}); " +
        ", ".join(f"{k} at {t:.2f} s: {out[CEILINGS[k]]:.3f} of S*" for k, t in switches.items()))
    return Ceilings(out, start, {"S*": refs[0], "O": refs[1]}, switches)


def run(quick: bool = False, suite_results: Path = SUITE_RESULTS, log: Callable[[str], None] = print) -> BenchResult:
    """The benchmark (module docstring); ``quick`` changes nothing: it takes about a minute."""
    if not suite_results.exists():
        raise ValueError(f"{suite_results} is missing: run `{REFRESH}` first (the ceilings run its S* and O)")
    results = json.loads(suite_results.read_text())
    t0 = time.perf_counter()
    per_workload = {name: evaluate(name, results, log) for name in WORKLOADS}
    summary = {f"{name}.{key}": value for name, c in per_workload.items() for key, value in c.raw.items()
               if key.startswith("ceiling_") or key in ("binding_busy", "default_vs_static_hindsight") or key.endswith("_s")}
    notes = ("SIMULATED. Per workload without headroom, the rate of a run that follows static-default (where trident starts) "
             "until a switch time and then goes as fast as the faster of S* and O did from the same number of items done, "
             "switching instantly and for free (knowledge no user has), over S*'s rate. Switch times: the first tick; the "
             "first tick plus the least cold start of a new replica of the operator busiest under static-default (nothing "
             "raises the rate it caps before one serves); the first tick plus the longest cold start among the configurations "
             "S* runs that static-default does not (a policy that decides on measurements has measured none of them before). "
             "bench warm-start asks trident for >= 0.97 of S* on these streams, cold and warm.")
    raw = {"workloads": {name: c.raw for name, c in per_workload.items()}, "suite_provenance": results.get("provenance"),
           "bench_seconds": round(time.perf_counter() - t0, 1)}
    return BenchResult("no-headroom-ceiling", summary, raw=raw, figure=figure(per_workload), notes=notes)


def figure(per_workload: Mapping[str, Ceilings]) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(per_workload), figsize=(6 * len(per_workload), 4.2), squeeze=False)
    styles = {"first_tick": ":", "binding_replica": "--", "new_configs_warm": "-."}
    for ax, (name, c) in zip(axes[0], per_workload.items()):
        ax.plot(c.default.t, c.default.done, color="#888888", linewidth=2, label="static-default (where trident starts)")
        for label, ref, color in (("S*", c.references["S*"], "#3465a4"), ("O", c.references["O"], "#73a857")):
            ax.plot(ref.t, ref.done, color=color, linewidth=1.5, label=label)
        for key, t in c.switches.items():
            fastest = fastest_from(c.default.done_at(t), list(c.references.values()))
            ts, done = c.default.spliced(fastest, t)
            ax.plot(ts, done, color="#cc0000", linestyle=styles[key], linewidth=1.2,
                    label=f"switch at {key.replace('_', ' ')} ({t:.1f} s): {c.raw[CEILINGS[key]]:.2f} of S*")
        ax.set_title(f"{name}: the most a policy starting in static-default gets (SIMULATED)", fontsize=9)
        ax.set_xlabel("simulated seconds")
        ax.set_ylabel("input items done")
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig
