"""Batch size as in-flight depth: expensive batches held at once, the batch they call for, and the resize plan."""

from __future__ import annotations

import random

from builders import batch_sample, operator_state, replica_state, runner_state

from trident_flows.core.state import RunnerState
from trident_flows.core.types import GPU, BatchSample, ConfigSpace, OpConfig, PlanKind
from trident_flows.scheduler.trident.batch_depth import BatchDepth

B8 = OpConfig.make("cpu", batch_size=8)


def _cheap(t: float, n: int = 1, config: OpConfig = B8) -> list[BatchSample]:
    """``n`` cheap OCR batches (0.1 s per item) started at ``t``."""
    size = config.batch_size
    return [batch_sample(operator="ocr", config=config, start=t, busy_s=0.1 * size, items_in=size) for _ in range(n)]


def _stretch(t: float, batches: int, replicas: int, config: OpConfig = B8) -> list[BatchSample]:
    """A stretch of ``batches`` expensive batches (2 s per item) from ``t``, run ``replicas`` at a time."""
    size = config.batch_size
    return [batch_sample(operator="ocr", config=config, start=t + (k // replicas) * 2.0 * size + (k % replicas) / 128, busy_s=2.0 * size,
                         items_in=size) for k in range(batches)]


def _state(replicas: int, config: OpConfig = B8) -> RunnerState:
    return runner_state(operators=(operator_state(name="ocr", replicas=tuple(replica_state(replica_id=f"r{i}", config=config)
                                                                              for i in range(replicas))),))


def _depth(rate: float = 100.0, unsafe_from: int = 10**6, batch_max: int = 64) -> BatchDepth:
    """A depth over OCR at ``rate`` input items/s, one OCR item per input item; batches from ``unsafe_from`` are unsafe."""
    return BatchDepth(lambda name: ConfigSpace(batch_size_max=batch_max),
                      lambda name, config: "too big" if config.batch_size >= unsafe_from else None, lambda: rate, lambda state: {"ocr": 1.0})


def _flow(embed_queued: int) -> RunnerState:
    """OCR, then embed with ``embed_queued`` items waiting."""
    return runner_state(operators=(operator_state(name="ocr"), operator_state(name="embed", queue_items=embed_queued)))


def _seen(depth: BatchDepth, batches: int, replicas: int = 100, config: OpConfig = B8, starved: bool = True) -> None:
    """Cheap batches to judge by, then a stretch of ``batches`` expensive ones run ``replicas`` at a time, arriving over
    three ticks in an order that is not the one they started in; embed has nothing queued from the first tick on
    (``starved``), else always some."""
    depth.observe(_flow(0 if starved else 50), _cheap(0.0, 400, config))
    samples = _stretch(10.0, batches, replicas, config) + _cheap(11.0, 40, config)
    random.Random(batches).shuffle(samples)
    for k in range(3):
        depth.observe(_flow(0 if starved else 50), samples[k::3])


def test_expensive_batches_running_at_once_are_counted_in_any_arrival_order() -> None:
    depth = _depth()
    _seen(depth, 150)
    assert depth.peak("ocr", 8) == 100  # 150 batches on 100 replicas: 100 at once
    assert depth.peak("ocr", 16) == 0  # none at another batch size
    assert depth.cheap_replicas(_state(100), "ocr") == 10  # 100 items/s x 0.1 s per cheap item


def test_a_stretch_that_holds_the_replicas_the_cheap_items_need_doubles_the_batch_and_sets_a_floor() -> None:
    depth = _depth()
    _seen(depth, 150)
    assert depth.batch(_state(100), "ocr", B8) == 16  # 100 held at once, where 100 - 10 were free of cheap work
    plan = depth.plan(_state(100))
    assert plan is not None and plan.rationale is not None and plan.rationale.kind is PlanKind.BATCH_DEPTH
    (ocr,) = plan.operators
    assert [(g.config.batch_size, g.replicas) for g in ocr.groups] == [(16, 100)]
    assert "cpu/b8 -> b16" in plan.reason and "need 10 of 100" in plan.reason
    assert depth.too_small("ocr", B8) and not depth.too_small("ocr", B8.with_changes(batch_size=16))  # no plan goes back to 8
    assert not depth.too_small("ocr", OpConfig.make(GPU, gpus=1.0, batch_size=8))
    b16 = B8.with_changes(batch_size=16)
    assert depth.batch(_state(100, b16), "ocr", b16) == 16  # no stretch seen at 16 yet: it stays
    busy_after = _depth()
    _seen(busy_after, 150, starved=False)
    assert busy_after.peak("ocr", 8) == 0 and busy_after.plan(_state(100)) is None  # embed had work all along: nothing blocked
    shallow = _depth()
    _seen(shallow, 60)
    assert shallow.peak("ocr", 8) == 60 and shallow.plan(_state(100)) is None  # 60 at once leave room for the cheap items


def test_the_batch_stays_where_the_rule_must_not_act() -> None:
    depth = _depth()
    _seen(depth, 150)
    assert depth.batch(_state(8), "ocr", B8) == 8  # a few replicas: a bottleneck, not a blockage
    busy = _depth(rate=600.0)
    _seen(busy, 150)
    assert busy.batch(_state(100), "ocr", B8) == 8  # its cheap items alone need 60 of its 100 replicas: a bottleneck
    gpu = OpConfig.make(GPU, gpus=1.0, batch_size=8)
    gpu_depth = _depth()
    _seen(gpu_depth, 150, config=gpu)
    assert gpu_depth.batch(_state(100, gpu), "ocr", gpu) == 8  # on an accelerator the batch is the optimiser's
    unsafe = _depth(unsafe_from=16)
    _seen(unsafe, 150)
    assert unsafe.batch(_state(100), "ocr", B8) == 8  # 16 is not memory-safe
    short = _depth(batch_max=8)
    _seen(short, 150)
    assert short.batch(_state(100), "ocr", B8) == 8  # the config space ends at 8


def test_the_placement_offers_no_config_below_an_operators_depth_but_a_running_one() -> None:
    from types import SimpleNamespace

    from trident_flows.scheduler.trident.placement_step import PlacementStep

    b16, b32 = B8.with_changes(batch_size=16), B8.with_changes(batch_size=32)
    depth = _depth()
    depth.floor["ocr"] = 32
    step = object.__new__(PlacementStep)  # the candidate list alone
    step.ops = {"ocr": SimpleNamespace(accepted=[b16], detector=SimpleNamespace(current=None))}
    step.search = SimpleNamespace(space=lambda name: ConfigSpace(), optimizer=lambda name: SimpleNamespace(best=lambda: B8))
    step.safety = SimpleNamespace(unsafe=lambda name, config: None)
    step.canaries = SimpleNamespace(rejected_here=lambda name, config: False)
    step.depth = depth
    running = runner_state(operators=(operator_state(name="ocr", replicas=(replica_state(replica_id="a", config=b32),
                                                                            replica_state(replica_id="b", config=B8))),))
    configs, _ = step.candidates(running, "ocr")
    assert sorted(c.batch_size for c in configs) == [8, 32]  # the accepted b16 and the optimiser's b8 are below it; b8 runs


def test_once_the_input_is_closed_raised_batches_go_back_and_nothing_is_raised() -> None:
    depth = _depth()
    _seen(depth, 150)
    assert depth.plan(_state(100)) is not None and depth.floor == {"ocr": 16}
    b16 = B8.with_changes(batch_size=16)
    closed = runner_state(operators=_state(100, b16).operators, input_closed=True)
    back = depth.plan(closed)
    assert back is not None and back.rationale is not None and back.rationale.kind is PlanKind.BATCH_DEPTH
    assert [(g.config.batch_size, g.replicas) for g in back.operators[0].groups] == [(8, 100)]
    assert depth.floor == {} and not depth.too_small("ocr", B8)  # the placement may offer batch 8 again
    assert depth.plan(closed) is None and depth.batch(closed, "ocr", b16) == 16  # once; and nothing raised any more
    _seen(depth, 150)
    assert depth.plan(runner_state(operators=_state(100).operators, input_closed=True)) is None
