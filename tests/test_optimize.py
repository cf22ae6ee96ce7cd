"""OOM-safe Bayesian optimisation (scheduler/optimize.py, constraint.py, canary.py): fast, no Ray."""

from __future__ import annotations

import math

import numpy as np
import pytest
from builders import batch_sample

from trident_flows.core.types import BatchSample, ConfigSpace, KnobSpace, OpConfig, Outcome
from trident_flows.scheduler.canary import CanaryPolicy, Verdict, decide, measure
from trident_flows.scheduler.constraint import MemoryBudget, MemoryModel
from trident_flows.scheduler.optimize import ConfigOptimizer
from trident_flows.scheduler.optimizer_values import NoSafeConfigError, Observation, Rollback

GiB = 2**30


class Synthetic:
    """A CPU operator with known curves: memory = resident + batch * size * per_item (+ a cliff)."""

    def __init__(self, resident: float = 0.5 * GiB, per_item: float = 40e6, budget: float = 4 * GiB, cliff: int | None = None) -> None:
        self.resident, self.per_item, self.budget, self.cliff = resident, per_item, budget, cliff
        self.space = ConfigSpace(devices=("cpu",), batch_size_min=1, batch_size_max=256,
                                 knobs=(KnobSpace("prefetch", "int", 1, 4),))

    def memory(self, config: OpConfig, size: float = 1.0) -> float:
        jump = 2.0 if self.cliff is not None and config.batch_size >= self.cliff else 1.0
        return self.resident + config.batch_size * size * self.per_item * (1 + 0.1 * config.knob("prefetch")) * jump

    def throughput(self, config: OpConfig) -> float:
        return config.batch_size / (0.05 + 0.01 * config.batch_size) * (1 + 0.05 * config.knob("prefetch"))

    def optimiser(self, **kwargs) -> ConfigOptimizer:
        return ConfigOptimizer(self.space, MemoryBudget(cpu_bytes=int(self.budget)), operator="ocr", seed=0, **kwargs)

    def tell(self, opt: ConfigOptimizer, config: OpConfig, size: float = 1.0) -> Rollback | None:
        peak = self.memory(config, size)
        if peak > self.budget:
            return opt.tell_oom(config, {"pages": size}, items=config.batch_size)
        opt.tell(config, self.throughput(config), peak, {"pages": size}, resident_memory=self.resident, items=config.batch_size)
        return None


def test_safe_expansion_starts_from_the_smallest_batch():
    op = Synthetic()
    opt = op.optimiser()
    first = opt.ask()
    assert first is not None and first.kind == "seed"
    assert first.config == op.space.config("cpu", 1, prefetch=1)
    op.tell(opt, first.config)
    second = opt.ask()
    assert second is not None and second.config.batch_size <= opt.headroom_growth * first.config.batch_size
    assert second.memory_upper_bound <= second.memory_limit
    # 4 GiB holds the working set of a long step twice over, so the second step is long, and safe
    assert second.config.batch_size > opt.growth * first.config.batch_size, second.reason
    assert op.resident + 2 * (second.memory_upper_bound - op.resident) <= second.memory_limit


def test_no_proposal_exceeds_the_budget_once_two_samples_are_near_the_frontier():
    op = Synthetic(budget=3 * GiB)  # frontier near batch 55 (prefetch=1)
    opt = op.optimiser(max_evals=None)
    for batch in (1, 40, 48):
        op.tell(opt, op.space.config("cpu", batch, prefetch=1))
    for _ in range(8):
        proposal = opt.ask()
        if proposal is None:
            break
        assert op.memory(proposal.config) <= op.budget, proposal.reason
        assert proposal.memory_upper_bound <= op.budget * 0.9
        op.tell(opt, proposal.config)
    assert not any(o.oom for o in opt.observations)
    assert opt.best() is not None and op.memory(opt.best()) <= op.budget * 0.9


def test_an_oom_marks_the_region_unsafe_and_rolls_back_to_the_incumbent():
    op = Synthetic(budget=3 * GiB, cliff=32)
    opt = op.optimiser(max_evals=None)
    for batch in (1, 4, 16):
        op.tell(opt, op.space.config("cpu", batch, prefetch=1))
    failed = op.space.config("cpu", 32, prefetch=1)
    rollback = op.tell(opt, failed)
    assert isinstance(rollback, Rollback)
    assert rollback.failed == failed and rollback.to == opt.best()
    assert rollback.to is not None and rollback.to.batch_size < 32
    assert "out of memory" in rollback.reason and "rolling back" in rollback.reason
    for _ in range(6):
        proposal = opt.ask()
        if proposal is None:
            break
        c = proposal.config
        assert not (c.knobs == failed.knobs and c.batch_size >= failed.batch_size), f"proposed {c.label()} inside the OOM region"
        op.tell(opt, c)


def test_memory_grows_with_the_workload_and_the_check_uses_the_worst_recent_items():
    op = Synthetic(budget=3 * GiB)
    opt = op.optimiser(max_evals=None)
    for batch in (1, 8, 32):
        op.tell(opt, op.space.config("cpu", batch, prefetch=1))
    before = opt.ask()
    for _ in range(20):  # larger documents arrive: 2.5x the pages per item
        opt.observe_features({"pages": 2.5})
    after = opt.ask()
    assert opt.worst_features()["pages"] == pytest.approx(2.5)
    assert before is not None and after is not None
    assert after.memory_upper_bound <= after.memory_limit
    assert op.memory(after.config, size=2.5) <= op.budget
    assert op.memory(opt.best(), size=2.5) <= op.budget * 0.9


def test_a_large_batch_is_checked_at_a_tighter_worst_case_and_growing_items_still_block_it():
    rng = np.random.default_rng(0)
    op = Synthetic(budget=3 * GiB)
    opt = op.optimiser(max_evals=None)
    for batch in (1, 8, 32):
        op.tell(opt, op.space.config("cpu", batch, prefetch=1), size=math.exp(0.5**2 / 2))
    for batch in (1, 2, 4, 8, 16, 32) * 8:  # lognormal(0, 0.5) pages per item, seen as batch means
        opt.observe_features({"pages": float(rng.lognormal(0.0, 0.5, batch).mean())}, items=batch)

    def true_q95(batch: int) -> float:
        return float(np.quantile(rng.lognormal(0.0, 0.5, (4000, batch)).mean(axis=1), 0.95))

    small, large = opt.worst_features(2)["pages"], opt.worst_features(128)["pages"]
    assert large < small  # the mean of 128 items varies less than that of 2
    assert large >= true_q95(128) and small >= 0.95 * true_q95(2)  # still a high quantile of the batch mean
    fits = [b for b in range(1, 257) if op.memory(op.space.config("cpu", b, prefetch=1), opt.worst_features(b)["pages"]) <= 0.9 * op.budget]
    largest = op.space.config("cpu", max(fits), prefetch=1)
    for step in range(16):  # the documents grow to 3 pages per item
        opt.observe_features({"pages": 1.0 + 2.0 * (step + 1) / 16}, items=32)
    assert opt.worst_features(largest.batch_size)["pages"] >= 3.0
    assert op.memory(largest, 3.0) > op.budget  # the batch that fitted before would now run out of memory...
    proposal = opt.ask()  # ...and is not proposed: what is proposed fits today's items
    assert proposal is not None and proposal.config.batch_size < largest.batch_size
    assert op.memory(proposal.config, 3.0) <= 0.9 * op.budget


def test_no_safe_point_gives_a_clear_error_not_a_loop():
    op = Synthetic(resident=5 * GiB, budget=4 * GiB)  # even batch 1 does not fit
    opt = op.optimiser()
    seed = opt.ask()
    assert seed is not None and seed.kind == "seed"
    rollback = op.tell(opt, seed.config)
    assert rollback is not None and rollback.to is None
    with pytest.raises(NoSafeConfigError, match=r"operator 'ocr'.*device 'cpu'.*budget 4 GiB"):
        opt.ask()


def test_a_budget_under_the_smallest_measured_config_gives_a_clear_error():
    op = Synthetic(resident=3.8 * GiB, budget=4 * GiB)  # fits, but not within the 10% safety margin
    opt = op.optimiser()
    op.tell(opt, opt.ask().config)
    with pytest.raises(NoSafeConfigError, match=r"smallest config cpu/b1/prefetch=1 measured"):
        opt.ask()


def test_bad_input_names_the_field():
    space = ConfigSpace(devices=("cpu", "gpu"), batch_size_min=1, batch_size_max=8)
    with pytest.raises(ValueError, match="gpu_bytes"):
        ConfigOptimizer(space, MemoryBudget(cpu_bytes=GiB))
    op = Synthetic()
    opt = op.optimiser()
    with pytest.raises(ValueError, match="knob prefetch=9, outside 1..4"):
        opt.tell(op.space.config("cpu", 2, prefetch=9), 10.0, GiB)
    with pytest.raises(ValueError, match="batch_size 512, outside"):
        opt.tell_oom(op.space.config("cpu", 512, prefetch=1))


def test_an_incumbent_told_many_times_is_one_evaluation():
    op = Synthetic()
    opt = op.optimiser(max_evals=2)
    incumbent = op.space.config("cpu", 1, prefetch=1)
    for _ in range(5):
        op.tell(opt, incumbent)
    assert len(opt.observations) == 5
    proposal = opt.ask()
    assert proposal is not None and proposal.config != incumbent
    op.tell(opt, proposal.config)
    assert opt.ask() is None and "max_evals=2" in opt.status


def test_warm_start_reproduces_the_previous_best_immediately():
    op = Synthetic(budget=3 * GiB)
    first = op.optimiser()
    for _ in range(6):
        proposal = first.ask()
        if proposal is None:
            break
        op.tell(first, proposal.config)
    replay = [Observation.from_dict(o.to_dict()) for o in first.observations]
    second = op.optimiser()
    second.warm_start(replay)
    assert second.best() == first.best() and second.best() is not None
    nxt = second.ask()  # it goes on from the replayed observations: no seeding again
    assert nxt is not None and nxt.kind != "seed", second.status


def _batches(config: OpConfig, rates: list[float], peak: int = GiB) -> list[BatchSample]:
    return [batch_sample(operator="ocr", replica_id="r", config=config, start=float(i), end=float(i) + 1.0, busy_s=config.batch_size / r,
                         items_in=config.batch_size, features={"pages": 3.0 * config.batch_size},
                         peak_host_mem_bytes=peak) for i, r in enumerate(rates)]


def test_canary_accepts_a_clearly_better_candidate_and_rejects_a_worse_one():
    old, new = OpConfig.make(batch_size=8), OpConfig.make(batch_size=16)
    incumbent = _batches(old, [100, 102, 98, 101, 99, 100])
    better = decide(_batches(new, [130, 128, 132, 131, 129]), incumbent, elapsed_s=10)
    worse = decide(_batches(new, [80, 82, 79, 81, 80]), incumbent, elapsed_s=10)
    assert better.verdict == Verdict.ACCEPT and better.gain == pytest.approx(0.3, abs=0.02) and "better" in better.reason
    assert worse.verdict == Verdict.REJECT and worse.gain < 0


def test_canary_keeps_measuring_while_noisy_and_stops_at_the_window_end():
    old, new = OpConfig.make(batch_size=8), OpConfig.make(batch_size=16)
    incumbent = _batches(old, [100, 60, 140, 90, 110])
    noisy = _batches(new, [150, 70, 130, 80, 120])
    assert decide(noisy, incumbent, elapsed_s=5).verdict == Verdict.MEASURE
    assert decide(noisy[:2], incumbent, elapsed_s=1).verdict == Verdict.MEASURE  # under min_batches
    ended = decide(noisy, incumbent, elapsed_s=200, policy=CanaryPolicy(max_window_s=120))
    assert ended.verdict == Verdict.REJECT and "window ended" in ended.reason


def test_canary_rejects_an_oom_and_measure_condenses_the_window():
    config = OpConfig.make(batch_size=4)
    window = _batches(config, [40, 42, 41], peak=2 * GiB)
    window.append(batch_sample(operator="ocr", replica_id="r", config=config, start=9.0, end=9.5, busy_s=0.5, items_in=4, items_out=0,
                               features={"pages": 40.0}, peak_host_mem_bytes=3 * GiB, outcome=Outcome.OOM))
    assert decide(window, [], elapsed_s=3).verdict == Verdict.REJECT
    m = measure(window)
    assert m.oom and m.features == {"pages": 10.0} and m.items == 4
    ok = measure(window[:3])
    assert not ok.oom and ok.peak_memory == 2 * GiB and ok.throughput == pytest.approx(3 * 4 / sum(4 / r for r in (40, 42, 41)))
    assert math.isclose(ok.features["pages"], 3.0)


def test_a_long_batch_step_only_where_the_working_set_could_double():
    roomy = Synthetic(budget=40 * GiB)  # the working set of batch 16 is far under the limit
    opt = roomy.optimiser(max_evals=None)
    roomy.tell(opt, opt.ask().config)
    step = opt.ask()
    assert step is not None and step.config.batch_size > opt.growth  # longer than growth x the seed's batch 1
    resident = roomy.resident
    assert resident + 2 * (step.memory_upper_bound - resident) <= step.memory_limit
    tight = Synthetic(budget=3 * GiB)  # frontier near batch 55: from batch 8 a 16x step could not double
    opt = tight.optimiser(max_evals=None)
    for batch in (1, 2, 4, 8):
        tight.tell(opt, tight.space.config("cpu", batch, prefetch=1))
    step = opt.ask()
    assert step is not None and step.config.batch_size <= opt.growth * 8


def test_a_precision_never_measured_is_tried_only_with_room_for_its_memory_to_double():
    """fp32 needs twice the working set of fp16; measured only in fp16 up to near the frontier, a smooth
    memory model would carry fp16's memory over to fp32 at the same batch and run out of memory."""
    space = ConfigSpace(devices=("cpu",), batch_size_min=1, batch_size_max=256,
                        knobs=(KnobSpace("precision", "categorical", choices=("fp16", "fp32")),))
    resident, per_item, budget = 0.5 * GiB, 40e6, 3 * GiB

    def memory(config: OpConfig) -> float:
        return resident + config.batch_size * per_item * (2.0 if config.knob("precision") == "fp32" else 1.0)

    opt = ConfigOptimizer(space, MemoryBudget(cpu_bytes=budget), operator="ocr", seed=0, max_evals=None)
    for batch in (1, 4, 16, 32, 48, 56):
        c = space.config("cpu", batch, precision="fp16")
        opt.tell(c, batch / (0.05 + 0.01 * batch), memory(c), {"pages": 1.0}, resident_memory=resident, items=batch)
    fp32 = []
    for _ in range(8):
        proposal = opt.ask()
        if proposal is None:
            break
        c = proposal.config
        if c.knob("precision") == "fp32" and not any(o.config.knob("precision") == "fp32" for o in opt.observations):
            assert resident + 2 * (proposal.memory_upper_bound - resident) <= 0.9 * budget, proposal.reason
            fp32.append(c)
        assert memory(c) <= budget, proposal.reason
        opt.tell(c, c.batch_size / (0.05 + 0.005 * c.batch_size), memory(c), {"pages": 1.0}, resident_memory=resident, items=c.batch_size)
    assert fp32, "fp32 (faster per item here) was never tried"


def test_after_an_out_of_memory_larger_batches_need_room_to_double():
    op = Synthetic(budget=3 * GiB, cliff=40)  # memory doubles from batch 40: no smooth model foresees it
    opt = op.optimiser(max_evals=None)
    for batch in (1, 4, 16, 32):
        op.tell(opt, op.space.config("cpu", batch, prefetch=1))
    assert op.tell(opt, op.space.config("cpu", 48, prefetch=1)) is not None  # the jump: out of memory
    grew = []
    for _ in range(6):
        proposal = opt.ask()
        if proposal is None:
            break
        c = proposal.config
        largest = max((o.config.batch_size for o in opt.observations if not o.oom and o.config.knobs == c.knobs), default=0)
        if c.batch_size > largest:
            assert op.resident + 2 * (proposal.memory_upper_bound - op.resident) <= 0.9 * op.budget, proposal.reason
            grew.append(c)
        assert op.memory(c) <= op.budget, proposal.reason
        op.tell(opt, c)
    assert grew, "no proposal was larger than a safe batch of its settings: the rule above was never checked"


def test_a_device_whose_working_set_is_lost_in_its_resident_jitter_is_still_explored():
    """A GPU holding 5 GiB of weights: at batch 1 its 8 MB working set is smaller than the peak's jitter,
    so the memory per item measured there is many times too high; the device is explored all the same."""
    space = ConfigSpace(devices=("cpu", "gpu"), batch_size_min=1, batch_size_max=256)
    resident, per_item, budget = 5 * GiB, 8e6, 8 * GiB
    opt = ConfigOptimizer(space, MemoryBudget(cpu_bytes=4 * GiB, gpu_bytes=budget), operator="embed", seed=0, max_evals=None)

    def cpu(batch: int) -> None:  # saturates at batch 16: explored once batch 64 is measured
        opt.tell(space.config("cpu", batch), min(batch, 16) * 2.0, 0.3 * GiB + batch * 4e6, {"pages": 1.0}, resident_memory=0.3 * GiB, items=batch)

    for batch in (1, 4, 16, 64):
        cpu(batch)
    jitter = 1.015  # +1.5% of the peak: a working set of 85 MB instead of 8 MB
    opt.tell(space.config("gpu", 1), 1.0, (resident + per_item) * jitter, {"pages": 1.0}, resident_memory=resident, items=1)
    assert not opt._memory["gpu"].informative()
    proposal = opt.ask()
    assert proposal is not None and proposal.config.device == "gpu" and proposal.config.batch_size > 1, proposal.reason
    assert resident + proposal.config.batch_size * per_item <= 0.9 * budget


def test_the_memory_bound_next_to_measured_configs_does_not_add_their_jitter_again():
    """Peaks jitter by a few percent between batches; a measured peak is already the largest of its
    window, so the bound at a config measured three times stays within 2% of its largest peak."""
    space = ConfigSpace(devices=("cpu",), batch_size_min=1, batch_size_max=256, knobs=(KnobSpace("prefetch", "int", 1, 4),))
    model = MemoryModel(space, "cpu", seed=0)
    rng = np.random.default_rng(0)
    resident, per_item = GiB, 40e6
    peaks: dict[int, list[float]] = {}
    for batch in (4, 8, 16, 24, 32, 40, 48):
        for _ in range(3):
            peaks.setdefault(batch, []).append((resident + batch * per_item) * (1 + abs(rng.normal(0, 0.02))))
            model.add(space.config("cpu", batch, prefetch=1), {"pages": 1.0}, peaks[batch][-1], resident)
    config = space.config("cpu", 48, prefetch=1)
    largest = max(peaks[48])
    upper = float(model.upper([config], {"pages": 1.0}, 2.0)[0])
    assert largest <= upper <= 1.02 * largest
    assert model.informative()


def test_a_measurement_under_a_configs_kept_peaks_leaves_the_memory_fit_as_a_fresh_model_would_have_it():
    """A config keeps its ``ROWS_PER_CONFIG`` highest peaks; a lower one is dropped at once, so the fit
    stays (no refit: it was most of a 256-node tick's memory-model cost) and predicts exactly what a
    model told only the kept peaks predicts. A higher peak replaces the lowest and is predicted anew."""
    space = ConfigSpace(devices=("cpu",), batch_size_min=1, batch_size_max=256)
    told, fresh = MemoryModel(space, "cpu", seed=0), MemoryModel(space, "cpu", seed=0)
    configs = [space.config("cpu", b) for b in (4, 16)]
    for config in configs:
        for k in range(MemoryModel.ROWS_PER_CONFIG):
            peak = GiB + config.batch_size * 40e6 * (1.0 + 0.01 * k)
            told.add(config, {"pages": 1.0}, peak, GiB)
            fresh.add(config, {"pages": 1.0}, peak, GiB)
    probe = [space.config("cpu", 8), space.config("cpu", 64)]
    before = told.upper(probe, {"pages": 1.0}, 2.0)
    fit = told._gp
    told.add(configs[0], {"pages": 3.0}, GiB + 4 * 40e6 * 0.9, GiB)  # under every kept peak of b4: dropped at once
    assert told._gp is fit
    np.testing.assert_array_equal(told.upper(probe, {"pages": 1.0}, 2.0), fresh.upper(probe, {"pages": 1.0}, 2.0))
    np.testing.assert_array_equal(told.upper(probe, {"pages": 1.0}, 2.0), before)
    told.add(configs[0], {"pages": 1.0}, GiB + 4 * 40e6 * 1.5, GiB)  # above them: kept, so the model refits
    assert told._gp is None
    assert told.upper(probe[:1], {"pages": 1.0}, 2.0)[0] != before[0]


@pytest.fixture
def likelihood_calls(monkeypatch) -> list[int]:
    """One entry per log marginal likelihood scikit-learn's GP evaluates (a hyperparameter search makes many)."""
    from sklearn.gaussian_process import GaussianProcessRegressor

    calls: list[int] = []
    original = GaussianProcessRegressor.log_marginal_likelihood

    def counted(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(GaussianProcessRegressor, "log_marginal_likelihood", counted)
    return calls


def test_a_memory_refit_starts_from_the_last_fit_and_lands_where_a_cold_fit_does(likelihood_calls):
    """A refit after one more kept measurement starts its hyperparameter search from the last fit's
    optimum (a cold start was a quarter of an 8-node trident run's policy time): it evaluates the
    likelihood fewer times than the same fit from the default start, and predicts what that fit does."""
    calls = likelihood_calls
    space = ConfigSpace(devices=("cpu",), batch_size_min=1, batch_size_max=256, knobs=(KnobSpace("prefetch", "int", 1, 4),))
    told, cold = MemoryModel(space, "cpu", seed=0), MemoryModel(space, "cpu", seed=0)
    rng = np.random.default_rng(1)
    probe = [space.config("cpu", b, prefetch=p) for b in (6, 20, 64) for p in (1, 3)]
    rows = [(space.config("cpu", b, prefetch=p), GiB + b * 40e6 * (1 + 0.1 * p) * (1 + abs(rng.normal(0, 0.02))))
            for b in (4, 8, 16, 32) for p in (1, 2, 4)]
    for config, peak in rows:
        told.add(config, {"pages": 1.0}, peak, GiB)
    told.upper(probe, {"pages": 1.0}, 2.0)  # the first fit
    extra = (space.config("cpu", 24, prefetch=2), GiB + 24 * 40e6 * 1.2)
    told.add(extra[0], {"pages": 1.0}, extra[1], GiB)
    calls.clear()
    warm = told.upper(probe, {"pages": 1.0}, 2.0)
    warm_calls = len(calls)
    for config, peak in [*rows, extra]:
        cold.add(config, {"pages": 1.0}, peak, GiB)
    calls.clear()
    expected = cold.upper(probe, {"pages": 1.0}, 2.0)
    assert warm_calls < len(calls)
    np.testing.assert_allclose(warm, expected, rtol=1e-3)


def test_a_new_peak_of_a_measured_config_keeps_the_hyperparameters_and_a_new_config_tunes_them(likelihood_calls):
    """A higher peak of a config already measured conditions the memory GP on it with the last tuned
    hyperparameters (no likelihood search: re-tuning after every peak was a quarter of a 256-node tick),
    and the bound there still rises with it; the first peak of a new config tunes them again."""
    calls = likelihood_calls
    space = ConfigSpace(devices=("cpu",), batch_size_min=1, batch_size_max=256, knobs=(KnobSpace("prefetch", "int", 1, 4),))
    model = MemoryModel(space, "cpu", seed=0)
    rng = np.random.default_rng(2)
    for b in (4, 8, 16, 32):
        for p in (1, 2):
            model.add(space.config("cpu", b, prefetch=p), {"pages": 1.0}, GiB + b * 40e6 * (1 + 0.1 * p) * (1 + abs(rng.normal(0, 0.02))), GiB)
    measured = space.config("cpu", 16, prefetch=1)
    before = float(model.upper([measured], {"pages": 1.0}, 2.0)[0])
    tuned = model._gp.kernel_.theta.copy()

    model.add(measured, {"pages": 1.0}, GiB + 16 * 40e6 * 1.6, GiB)  # a higher peak of a measured config
    calls.clear()
    after = float(model.upper([measured], {"pages": 1.0}, 2.0)[0])
    assert len(calls) == 1  # scikit-learn's one likelihood value of the fitted GP: no search
    np.testing.assert_array_equal(model._gp.kernel_.theta, tuned)
    assert after > before

    model.add(space.config("cpu", 24, prefetch=4), {"pages": 1.0}, GiB + 24 * 40e6 * 1.4, GiB)  # a config never measured
    calls.clear()
    model.upper([measured], {"pages": 1.0}, 2.0)
    assert len(calls) > 1
    assert not np.array_equal(model._gp.kernel_.theta, tuned)


def test_a_ticks_batches_leave_the_feature_window_as_adding_them_one_by_one_does():
    """The optimiser's worst-case workload is read from its last ``size`` feature rows: a tick's batches
    given at once (only those that end in the window are converted) leave the same rows, and the same
    worst case, as adding every batch's per-item features one by one; batches without features add nothing."""
    from trident_flows.scheduler.constraint import FeatureWindow, per_item

    rng = np.random.default_rng(3)
    batches = [({} if k % 7 == 0 else {"pages": float(rng.gamma(2.0, 3.0)) * n, "chars": float(rng.random()) * n}, n)
               for k, n in enumerate(rng.integers(1, 64, 700))]
    one, many = FeatureWindow(size=256), FeatureWindow(size=256)
    for features, items in batches[:50]:
        one.add(per_item(features, items), items)
    many.add_batches(batches[:50])
    for features, items in batches[50:]:
        one.add(per_item(features, items), items)
    many.add_batches(batches[50:])
    assert list(many._rows) == list(one._rows)
    assert many.worst(16) == one.worst(16)
    with pytest.raises(ValueError, match="items=0"):
        many.add_batches([({"pages": 1.0}, 0)])
