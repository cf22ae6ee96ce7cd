"""A planned cluster checked in the discrete-event simulator (``trident_flows/sim``).

Contract:
- ``simulate_plan(workload, catalogue, counts, plan, items)`` runs the emulated pipeline of the
  workload (its cost models, its regime means) on the simulated cluster of ``counts`` under the
  static policy, starting from ``plan`` (the placement the planner chose: each operator starts
  with its largest replica group, and a plan with more groups than that is applied at the first
  tick, as a policy would), over a stream of ``items`` input items whose regimes follow the
  workload's mix in blocks (``PlanWorkload.schedule``).
- ``planned_spec(...)``: that pipeline and starting policy, for the simulator and the emulated Ray
  runtime alike (``bench plan-fidelity`` runs both).
- It returns a ``SimCheck``: the steady input items/s, measured between the moments 20% and 90%
  of the stream's items were done (start-up and the draining tail excluded: the planner
  predicts the rate of a long job), and the simulator's own run time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from trident_flows.core.decision import Decision
from trident_flows.core.state import RunnerState
from trident_flows.core.types import BatchSample, Plan
from trident_flows.pipelines.emulated import Stage, emulated_pipeline
from trident_flows.planning.catalogue import Catalogue
from trident_flows.planning.workload import SIM_PIPELINES, PlanWorkload
from trident_flows.runtime.spec import PipelineSpec
from trident_flows.scheduler.policies import Policy
from trident_flows.sim import driver
from trident_flows.sim.workload import Stream

STEADY_FROM, STEADY_TO = 0.2, 0.9
TICK_S = 2.0


@dataclass(frozen=True)
class SimCheck:
    items_per_s: float
    items: int
    simulated_s: float
    sim_wall_s: float


class _StartWith:
    """A policy that applies one plan at its first tick and then keeps it (the planner's starting placement)."""

    name = "planned-start"

    def __init__(self, plan: Plan) -> None:
        self.plan: Plan | None = plan

    def decide(self, state: RunnerState, samples: Sequence[BatchSample]) -> Decision:
        plan, self.plan = self.plan, None
        return Decision.roll_out(plan, plan.reason) if plan is not None else Decision.no_change()


def _steady_rate(timeline: Sequence[Mapping[str, float]], items: int) -> float:
    start = next((p for p in timeline if p["inputs_done"] >= STEADY_FROM * items), None)
    end = next((p for p in timeline if p["inputs_done"] >= STEADY_TO * items), None)
    if start is None or end is None or end["t"] <= start["t"]:
        last = timeline[-1] if timeline else None
        return last["inputs_done"] / last["t"] if last and last["t"] > 0 else 0.0
    return (end["inputs_done"] - start["inputs_done"]) / (end["t"] - start["t"])


def planned_spec(workload: PlanWorkload, plan: Plan, items: int, max_replicas: int, seed: int = 0,
                 time_scale: float = 1.0) -> tuple[PipelineSpec, Policy | None]:
    """The emulated pipeline starting from ``plan`` (each operator's largest replica group) and the policy that applies
    the rest of the plan at the first tick (``None`` when every operator has one group); the live runtime takes the same."""
    stages = []
    for op in plan.operators:
        main = max(op.groups, key=lambda g: g.replicas)
        stages.append(Stage(op.operator, main.config, main.replicas, max_replicas=max(max_replicas, op.replicas)))
    spec = emulated_pipeline(workload.profile, stages, name=SIM_PIPELINES[workload.pipeline], items=items, regimes=workload.schedule(),
                             seed=seed, time_scale=time_scale)
    mixed = any(len([g for g in op.groups if g.replicas > 0]) > 1 for op in plan.operators)
    return spec, (_StartWith(plan) if mixed else None)


def simulate_plan(workload: PlanWorkload, catalogue: Catalogue, counts: Mapping[str, int], plan: Plan, items: int,
                  seed: int = 0) -> SimCheck:
    """The steady throughput of ``plan`` on the cluster of ``counts`` in the simulator (see the module docstring)."""
    cluster = catalogue.cluster_spec(counts)
    spec, policy = planned_spec(workload, plan, items, int(cluster.total_cpus), seed)
    features = sorted({f for m in workload.profile.workloads.values() for f in m})
    stream = Stream.generate(workload.profile.workloads, workload.schedule(), items, features, seed)
    run = driver.simulate(spec, cluster, policy, tick_s=TICK_S, stream=stream, record_s=TICK_S)
    rate = _steady_rate(run.timeline, items)
    return SimCheck(rate if math.isfinite(rate) else 0.0, items, float(run.summary["wall_s"]), float(run.summary["sim_wall_s"]))
