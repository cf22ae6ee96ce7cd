"""closed-loop-sim's streams: block durations become item counts at the rates the simulator
sustains, so a block of N simulated minutes lasts about N minutes there (the cost model's rate
was 2.5x under the simulator's on 8-node documents, and a "0.5 hour" stream ended in its first block)."""

from __future__ import annotations

from benchmarks import closed_loop_sim as cls
from trident_flows.pipelines.emulated import Stage, emulated_pipeline
from trident_flows.runtime.costmodel import PipelineProfile
from trident_flows.sim.driver import simulate
from trident_flows.sim.setup import schedule_counts
from trident_flows.sim.workload import Stream


def test_given_rates_a_duration_becomes_that_many_seconds_of_them() -> None:
    profile = PipelineProfile.load("documents")
    config = cls.configs(profile, [(r, 1) for r in profile.workloads], 1)["static-avg"]
    assert schedule_counts("scans:10m,short:100,long:90s", profile, config, rates={"scans": 2.5, "long": 4.0}) == "scans:1500,short:100,long:360"


def test_a_block_counted_at_the_simulated_rate_lasts_its_duration_in_the_simulator() -> None:
    profile = PipelineProfile.load("documents")
    config = cls.configs(profile, [("short", 1)], 1)["static-avg"]
    rate = cls.SteadyRates(profile, 1).rate(config, "short")
    schedule = schedule_counts("short:2m", profile, config, rates={"short": rate})
    items = int(schedule.split(":")[1])
    spec = emulated_pipeline(profile, [Stage(n, c, r) for n, c, r in config.assignment], name="emulated-docs", items=0, regimes=schedule,
                             seed=cls.SEED)
    stream = Stream.generate(profile.workloads, schedule, items, sorted({f for m in profile.workloads.values() for f in m}), cls.SEED)
    run = simulate(spec, cls.cluster(1), None, stream=stream)
    assert run.summary["items_missing"] == 0
    # from the first output to the last (the replicas' cold start before, the rate measured at steady state)
    span = items / run.summary["steady_items_per_s"]
    assert 0.9 * 120 <= span <= 1.1 * 120, (rate, items, span)


def test_a_stream_of_some_hours_holds_the_blocks_those_hours_reach_at_the_rates() -> None:
    """Items follow time, block by block: 15 s of ``short:100,long:10`` at 10 and 1 items/s is the whole
    short block (10 s) and 5 s of the long one, not 15/20 of the items."""
    profile = PipelineProfile.load("documents")
    rates = {"short": 10.0, "long": 1.0}
    assert cls._items_for(profile, "short:100,long:10", rates, 15 / 3600, whole=False) == 105
    assert cls._items_for(profile, "short:100,long:10", rates, 30 / 3600, whole=False) == 100 + 10 + 100
    assert cls._items_for(profile, "short:100,long:10", rates, 5 / 3600) == 110  # at least one whole pass
