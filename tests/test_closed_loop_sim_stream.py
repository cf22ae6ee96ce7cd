"""closed-loop-sim's streams: block durations become item counts at the rates static-default sustains in the
simulator, so a block of N simulated minutes lasts about N minutes there (the cost model's rate was 2.5x under
the simulator's on 8-node documents, and a "0.5 hour" stream ended in its first block)."""

from __future__ import annotations

from benchmarks import closed_loop_sim as cls
from benchmarks import corpus_trident
from benchmarks.corpus_workloads import CORPORA
from trident_flows.pipelines.emulated import Stage, emulated_pipeline
from trident_flows.runtime.costmodel import PipelineProfile
from trident_flows.sim.driver import simulate
from trident_flows.sim.setup import schedule_counts
from trident_flows.sim.workload import Stream


def test_static_default_is_the_one_node_default_sizing_on_every_node() -> None:
    profile = PipelineProfile.load("documents")
    one, eight = cls.static_default("documents", profile, 1), cls.static_default("documents", profile, 8)
    assert [(n, c) for n, c, _ in one.assignment] == [(n, c) for n, c, _ in eight.assignment]
    assert [8 * r for _, _, r in one.assignment] == [r for _, _, r in eight.assignment]
    assert sum(c.cpus * r for _, c, r in one.assignment) <= cls.CPUS and sum(c.gpus * r for _, c, r in one.assignment) <= cls.GPUS
    # the same sizing as corpus-trident's static-default
    for pipeline, corpus in (("documents", "documents-corpus"), ("video", "video-corpus")):
        assert cls.static_default(pipeline, PipelineProfile.load(pipeline), 8) == corpus_trident.static_default(CORPORA[corpus], 8)


def test_a_block_counted_at_the_simulated_rate_lasts_its_duration_in_the_simulator() -> None:
    profile = PipelineProfile.load("documents")
    config = cls.static_default("documents", profile, 1)
    rates = cls.steady_rates(profile, config, 1)
    assert set(rates) == set(profile.workloads) and all(r > 0 for r in rates.values())
    schedule = schedule_counts("short:2m", profile, config, rates=rates)
    items = int(schedule.split(":")[1])
    spec = emulated_pipeline(profile, [Stage(n, c, r) for n, c, r in config.assignment], name="emulated-docs", items=0, regimes=schedule,
                             seed=cls.SEED)
    stream = Stream.generate(profile.workloads, schedule, items, sorted({f for m in profile.workloads.values() for f in m}), cls.SEED)
    run = simulate(spec, cls.cluster(1), None, stream=stream)
    assert run.summary["items_missing"] == 0
    # from the first output to the last (the replicas' cold start before, the rate measured at steady state)
    span = items / run.summary["steady_items_per_s"]
    assert 0.9 * 120 <= span <= 1.1 * 120, (rates, items, span)


def test_a_stream_of_some_hours_holds_the_blocks_those_hours_reach_at_the_rates() -> None:
    """Items follow time, block by block: 15 s of ``short:100,long:10`` at 10 and 1 items/s is the whole
    short block (10 s) and 5 s of the long one, not 15/20 of the items."""
    profile = PipelineProfile.load("documents")
    rates = {"short": 10.0, "long": 1.0}
    assert cls.items_for(profile, "short:100,long:10", rates, 15 / 3600) == 105
    assert cls.items_for(profile, "short:100,long:10", rates, 30 / 3600) == 100 + 10 + 100
    assert cls.items_for(profile, "short:100,long:10", rates, 0.01 / 3600) == 1  # at least one item
