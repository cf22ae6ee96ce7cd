"""DS2 in the simulator, against its paper's claim: on a stable regime it converges within 3 steps and then
holds; on the closed-loop suite's cpu-only stream it makes at most 3 reconfigurations per regime block.
Every figure here is SIMULATED: the suite's documents pipeline on one node of 16 CPUs and no GPU, started from
static-default, the policy ticking as the live suite's control loop does."""

from __future__ import annotations

from typing import Any, Sequence

import pytest

from benchmarks.closed_loop_runs import TICK_S
from benchmarks.closed_loop_suite import suite_workloads
from benchmarks.closed_loop_workload import Workload
from trident_flows.core.decision import Decision
from trident_flows.core.state import ApplyOutcome, RunnerState
from trident_flows.core.types import BatchSample, ClusterSpec, Plan
from trident_flows.runtime.costmodel import PipelineProfile
from trident_flows.scheduler.ds2 import DS2Policy
from trident_flows.scheduler.policies import make_policy
from trident_flows.scheduler.throughput_measure import stream_positions
from trident_flows.sim.driver import simulate

SUITE = suite_workloads(quick=False, names=["cpu-only"])[0]
PROFILE = PipelineProfile.load(SUITE.profile)
STREAM = SUITE.streams()[0]
BASELINES = SUITE.baselines(PROFILE, STREAM, STREAM.rows(PROFILE))
CLUSTER = ClusterSpec.single_node(16, SUITE.gpus)


class Watched:
    """DS2 seen from outside: whether each of its evaluations issued a step, and for each step the regime blocks
    the operators it rescales were working on (each operator's position in the input stream)."""

    name = "ds2"

    def __init__(self, policy: DS2Policy, blocks: Sequence[tuple[str, int, int]]) -> None:
        self.policy, self.blocks = policy, blocks
        self.evaluations: list[bool] = []
        self.steps: list[set[int]] = []

    def decide(self, state: RunnerState, samples: Sequence[BatchSample]) -> Decision:
        before = self.policy.last
        decision = self.policy.decide(state, samples)
        if self.policy.last is not before:
            self.evaluations.append(decision.plan is not None)
        if decision.plan is not None:
            at = stream_positions(state)
            self.steps.append({self._block(at[o.operator]) for o in decision.plan.operators})
        return decision

    def observe_apply(self, plan: Plan, outcome: ApplyOutcome) -> None:
        self.policy.observe_apply(plan, outcome)

    def _block(self, position: float) -> int:
        return next((k for k, (_, _, end) in enumerate(self.blocks) if position < end), len(self.blocks) - 1)


def run_ds2(stream: Workload) -> tuple[dict[str, Any], Watched]:
    spec = stream.spec(PROFILE, BASELINES.start("ds2"), "ds2")
    watched = Watched(make_policy("ds2", spec=spec, cluster=CLUSTER), stream.blocks())
    return simulate(spec, CLUSTER, watched, tick_s=TICK_S).summary, watched


def static_default(stream: Workload) -> dict[str, Any]:
    return simulate(stream.spec(PROFILE, BASELINES.start("static-default"), "static-default"), CLUSTER, None).summary


@pytest.mark.parametrize("regime", ["short", "scans", "long"])
def test_on_a_stable_regime_it_converges_within_3_steps_and_then_holds(regime: str):
    # 2.5 of the suite's blocks of the regime (each 5 minutes at the regime's optimum): room for 25 evaluations after warm-up
    block = next(end - start for name, start, end in STREAM.blocks() if name == regime)
    stream = Workload("stable", f"{regime}:{int(2.5 * block)}", seed=STREAM.seed, time_scale=STREAM.time_scale)
    summary, watched = run_ds2(stream)
    steps = [k for k, stepped in enumerate(watched.evaluations) if stepped]
    assert summary["reconfigurations"] == len(steps) <= 3, watched.evaluations
    # and then holds: every one of the many evaluations after its last step (10 s of the run each) keeps the parallelism
    held_after = len(watched.evaluations) - 1 - (steps[-1] if steps else -1)
    assert held_after >= 20 and len(watched.evaluations) >= 25, watched.evaluations
    assert summary["steady_items_per_s"] > static_default(stream)["steady_items_per_s"]


def test_on_the_cpu_only_stream_it_makes_at_most_3_reconfigurations_per_regime_block():
    summary, watched = run_ds2(STREAM)
    assert summary["reconfigurations"] == len(watched.steps)
    # a step counts in the block of every operator it rescales (ocr works on the next block long before embed does)
    per_block = [sum(1 for blocks in watched.steps if k in blocks) for k in range(len(STREAM.blocks()))]
    assert max(per_block) <= 3, (per_block, [b[0] for b in STREAM.blocks()])
    static = static_default(STREAM)
    print(f"cpu-only, SIMULATED: ds2 {summary['steady_items_per_s']:.2f} items/s, {summary['reconfigurations']} reconfigurations "
          f"{per_block} per block; static-default {static['steady_items_per_s']:.2f} items/s")
    assert summary["items_missing"] == 0 and summary["steady_items_per_s"] > static["steady_items_per_s"]
