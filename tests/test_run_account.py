"""The run's account (control/account.py and its parts) on made-up runs with known figures (no Ray)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from builders import batch_sample, operator_state, replica_state, runner_state

from trident_flows.control.account import ROLLED_BACK, PolicyFigures, account_of_run, build_account, policy_figures, why_no_decisions
from trident_flows.control.account_plot import timeline_png
from trident_flows.control.ooms_avoided import OomsAvoided, count_ooms_avoided
from trident_flows.control.run_record import MAX_POINTS, DecisionTaken, RunRecord
from trident_flows.control.start_estimate import Estimate, estimate_without_trident
from trident_flows.core.changes import OperatorChange
from trident_flows.core.decision import Decision, Hold, HoldKind
from trident_flows.core.output_errors import OutputWriteError
from trident_flows.core.state import ApplyOutcome, ApplyReport, ApplyStatus, RunnerState
from trident_flows.core.types import BatchSample, OpConfig, OperatorPlan, Plan, PlanKind, Rationale, ReplicaGroup
from trident_flows.loop.apply import Applied
from trident_flows.scheduler.operator_model import OperatorModel

T0 = 1_000_000.0
A = OpConfig.make(batch_size=4)
B8 = OpConfig.make(batch_size=8)
NOT_COUNTED = OomsAvoided(None, (), "not counted: test")
NO_ESTIMATE = Estimate(None, "no estimate: test")


def _state(items_in: int, ops: dict[str, tuple[int, int]], wall_s: float = 100.0) -> RunnerState:
    """A runner state: per operator (items taken, serving replicas of config A)."""
    operators = tuple(operator_state(name=name, replicas=tuple(replica_state(replica_id=f"{name}-{k}", actor_name=f"a-{name}-{k}", config=A,
                                                                             busy_fraction=0.5, batches=1)
                                                for k in range(replicas)), items_in=taken, items_out=taken, busy_fraction=0.5)
                      for name, (taken, replicas) in ops.items())
    return runner_state(operators=operators, items_in=items_in, items_written=items_in, rows_written=items_in, input_closed=True, finished=True,
                        wall_s=wall_s, throughput=items_in / wall_s, cluster_cpus=4)


def _record_at_rates(before: float, after: float, switch: float, end: float) -> tuple[RunRecord, np.ndarray]:
    """A run whose pipeline and operator ``ocr`` do ``before`` items/s until ``switch`` s, ``after`` items/s from then on."""
    record = RunRecord()
    for t in np.arange(0.0, end + 1e-9, 1.0):
        taken = int(before * min(t, switch) + after * max(0.0, t - switch))
        record.observe(_state(taken, {"ocr": (taken, 1 if t < switch else 3)}), at=T0 + t)
    done = np.concatenate([np.arange(0.0, switch, 1 / before), np.arange(switch, end, 1 / after)]) + T0
    return record, done


def _taken(at: float, landed: float | None, kind: str = "throughput", status: str = "landed", unsafe=()) -> DecisionTaken:
    return DecisionTaken(T0 + at, kind, (OperatorChange("ocr", 1, 3, "cpu/b4", "cpu/b4"),), f"{kind} because", status,
                         "" if status == "landed" else "no room", None if landed is None else T0 + landed, unsafe)


def test_a_decision_shows_what_it_changed_and_its_measured_effect_before_and_after():
    record, done = _record_at_rates(2.0, 4.0, switch=52.0, end=100.0)
    record.decisions.append(_taken(at=50.0, landed=52.0))
    account = build_account("trident", record, done[:1], done, NOT_COUNTED, NO_ESTIMATE, 3.0, "unused")
    d = account.decisions[0]
    assert d.at_s == pytest.approx(50.0) and d.landed_s == pytest.approx(52.0) and d.status == ApplyStatus.LANDED
    assert d.change_text() == "ocr 1x cpu/b4 -> 3x cpu/b4" and d.operators == ("ocr",)
    assert d.effect["window_s"] == [30.0, 30.0]
    assert d.effect["pipeline_items_per_s"]["before"] == pytest.approx(2.0, rel=0.05)
    assert d.effect["pipeline_items_per_s"]["after"] == pytest.approx(4.0, rel=0.05)
    assert d.effect["operators"]["ocr"]["before"] == pytest.approx(2.0, rel=0.05)
    assert d.effect["operators"]["ocr"]["after"] == pytest.approx(4.0, rel=0.05)
    assert "pipeline 2 -> 4 items/s" in d.effect_text() and "measured" in d.effect_text()
    data = json.loads(json.dumps(account.to_dict()))
    assert data["decisions"][0]["changes"] == [{"operator": "ocr", "from": "1x cpu/b4", "to": "3x cpu/b4"}]
    assert data["decisions_note"] == ""


def test_windows_are_cut_at_neighbouring_decisions_and_too_short_ones_are_not_measured():
    record, done = _record_at_rates(2.0, 4.0, switch=52.0, end=60.0)
    record.decisions += [_taken(at=40.0, landed=41.0), _taken(at=50.0, landed=52.0)]
    account = build_account("trident", record, done[:1], done, NOT_COUNTED, NO_ESTIMATE, 3.0, "unused")
    first, second = account.decisions
    assert first.effect["window_s"] == [30.0, 9.0]           # after it: until the next decision
    assert second.effect["window_s"] == [9.0, 8.0]           # before it: from the last landing; after: until the run's end
    record.decisions[:] = [_taken(at=57.0, landed=58.0)]
    late = build_account("trident", record, done[:1], done, NOT_COUNTED, NO_ESTIMATE, 3.0, "unused").decisions[0]
    assert late.effect is None and late.effect_note.startswith("not measured: only 2.0 s after it landed")


def test_a_rollback_marks_the_change_it_undid_and_a_refused_plan_has_no_effect():
    record, done = _record_at_rates(2.0, 2.0, switch=10.0, end=120.0)
    record.decisions += [_taken(at=20.0, landed=21.0), _taken(at=40.0, landed=None, status="refused"),
                         _taken(at=60.0, landed=61.0, kind=PlanKind.ROLLBACK.value)]
    account = build_account("trident", record, done[:1], done, NOT_COUNTED, NO_ESTIMATE, 2.0, "unused")
    statuses = [d.status for d in account.decisions]
    assert statuses == [ROLLED_BACK, ApplyStatus.REFUSED, ApplyStatus.LANDED]
    assert account.decisions[1].effect is None and account.decisions[1].effect_note == "not measured: the apply was refused, nothing changed"
    assert any("refused (no room)" in line for line in account.lines())


def test_a_run_without_decisions_says_so_plainly_and_still_draws_its_timeline(tmp_path):
    record, done = _record_at_rates(2.0, 2.0, switch=10.0, end=40.0)
    account = build_account("static", record, done[:1], done, NOT_COUNTED, NO_ESTIMATE, 2.0, why_no_decisions("static", None, record))
    assert account.to_dict()["decisions"] == []
    assert account.to_dict()["decisions_note"] == "no decisions: the static policy never changes the configuration"
    assert account.lines()[1].strip() == account.decisions_note
    assert "**no decisions: the static policy" in account.markdown()
    png = timeline_png(account, list(record.points), done, tmp_path / "t.png")
    assert png.startswith(b"\x89PNG") and (tmp_path / "t.png").read_bytes() == png
    assert "data:image/png;base64," in account.markdown(png)


def test_a_timeline_that_cannot_be_written_fails_naming_its_path():
    record, done = _record_at_rates(2.0, 2.0, switch=10.0, end=40.0)
    account = build_account("static", record, done[:1], done, NOT_COUNTED, NO_ESTIMATE, 2.0, why_no_decisions("static", None, record))
    with pytest.raises(OutputWriteError, match="cannot write /dev/full: No space left on device; free space"):
        timeline_png(account, list(record.points), done, Path("/dev/full"))  # a full device: ENOSPC names no file


def test_why_no_decisions_quotes_the_policys_last_tick():
    record = RunRecord()
    record.observe(_state(0, {"ocr": (0, 1)}), at=T0)
    policy = SimpleNamespace(last_record=SimpleNamespace(decision=Decision.no_change("waiting for samples: short: ocr (3)",
                                                                                  Hold(HoldKind.WAITING_FOR_SAMPLES))))
    assert why_no_decisions("trident", policy, record) == ("trident kept the starting configuration through 1 ticks; "
                                                           "its last tick: waiting for samples: short: ocr (3)")
    assert why_no_decisions("trident", None, record).startswith("the trident policy was never asked")


def test_the_record_keeps_an_applied_plan_with_its_outcome_and_landing_time():
    state = _state(10, {"ocr": (10, 1)})
    plan = Plan((OperatorPlan("ocr", (ReplicaGroup(A, 3),)),), 0.0, "scale ocr", Rationale(PlanKind.THROUGHPUT, 1.0, 2.0))
    report = ApplyReport(({"kind": "start"},), 4.0, 1.0, 1.0, 0.0, started_at=T0 + 1.0)
    record = RunRecord()
    taken = record.decided(state, Decision.roll_out(plan, "grow ocr"), Applied(report, report.outcome), T0)
    assert (taken.kind, taken.status, taken.landed_at, taken.reason) == (PlanKind.THROUGHPUT, ApplyStatus.LANDED, T0 + 5.0, "scale ocr")
    assert taken.changes == (OperatorChange("ocr", 1, 3, "cpu/b4", "cpu/b4"),)
    refused = record.decided(state, Decision.roll_out(plan, "grow ocr"), Applied(None, ApplyOutcome.refused("no room"), "RuntimeError: no room"), T0)
    assert (refused.status, refused.status_reason, refused.landed_at) == (ApplyStatus.REFUSED, "no room", None)


def test_a_long_record_keeps_the_whole_run_at_a_coarser_resolution():
    record = RunRecord()
    for k in range(MAX_POINTS + 10):
        record.observe(_state(k, {"ocr": (k, 1)}), at=T0 + k)
    assert len(record.points) <= MAX_POINTS and record.points[0].at == T0 and record.points[-1].at == T0 + MAX_POINTS + 9


# ------------------------------------------------------------------ the estimate without trident

def _ocr_samples(rng: np.random.Generator) -> list[BatchSample]:
    """OCR batches of 4 items: 0.008 s per item plus 1.2 s per scanned page (short documents, then scans)."""
    samples, t = [], T0
    for k in range(240):
        scanned = 0.0 if k < 160 else float(rng.uniform(3.6, 4.4))
        busy = 4 * 0.008 + 1.2 * scanned
        samples.append(batch_sample(operator="ocr", config=A, start=t, busy_s=busy, items_in=4, features={"scanned_pages": scanned}))
        t += busy
    return samples


def test_the_estimate_prices_the_starting_config_over_the_same_items_with_the_fitted_model():
    samples = _ocr_samples(np.random.default_rng(5))
    model = OperatorModel("ocr")
    assert model.fit(samples).fitted
    policy = SimpleNamespace(name="trident", ops={"ocr": SimpleNamespace(model=model)})
    state = _state(960, {"ocr": (960, 1)})
    truth = sum(s.items_in for s in samples) / sum(s.busy_s for s in samples)   # one replica of A over these very items
    est = estimate_without_trident("trident", policy, [("ocr", A, 1)], samples, state)
    assert est.items_per_s == pytest.approx(truth, rel=0.1)
    assert est.note.startswith("ESTIMATE, not a measurement") and "over the same items" in est.note and "ocr bounds it" in est.note
    # two replicas of the same config: about twice the rate (the model scales replicas it has not seen linearly)
    assert estimate_without_trident("trident", policy, [("ocr", A, 2)], samples, state).items_per_s == pytest.approx(2 * truth, rel=0.15)
    # the runner kept only part of the operator's items: said so
    assert "newest batches the runner kept (ocr 960 of 1920 items)" in estimate_without_trident(
        "trident", policy, [("ocr", A, 1)], samples, _state(960, {"ocr": (1920, 1)})).note


def test_the_estimate_is_the_bottleneck_in_input_items_per_second():
    class Linear:   # a model of known figures: 10 items/s per replica for an item of one page, slower with more pages
        ready, feature_names = True, ("pages",)

        def throughput(self, config, replicas, features):
            return SimpleNamespace(mean=10.0 * replicas / features["pages"])

    def batch(op: str, pages: float, t: float) -> BatchSample:
        return batch_sample(operator=op, replica_id="r", config=A, start=t, end=t + 1, busy_s=1.0, items_in=4,
                            features={"pages": 4 * pages})

    samples = [batch("parse", 1.0, T0 + k) for k in range(64)] + [batch("parse", 3.0, T0 + 64 + k) for k in range(64)]
    samples += [batch("embed", 2.0, T0 + k) for k in range(64)]
    policy = SimpleNamespace(name="trident", ops={"parse": SimpleNamespace(model=Linear()), "embed": SimpleNamespace(model=Linear())})
    # parse: 256 items at 10/s and 256 at 3.33/s = 512 items in 102.4 s, 5 items/s; embed takes half the input at 5 items/s
    est = estimate_without_trident("trident", policy, [("parse", A, 1), ("embed", A, 1)], samples, _state(512, {"parse": (512, 1), "embed": (256, 1)}))
    assert est.per_operator == {"parse": pytest.approx(5.0), "embed": pytest.approx(10.0)}
    assert est.items_per_s == pytest.approx(5.0) and "parse bounds it" in est.note


def test_no_estimate_without_trident_models_or_data_and_the_reason_says_which():
    samples = _ocr_samples(np.random.default_rng(1))
    state = _state(960, {"ocr": (960, 1)})
    start = [("ocr", A, 1)]
    assert estimate_without_trident("ds2", SimpleNamespace(name="ds2"), start, samples, state).note == \
        "no estimate: the ds2 policy fits no throughput models (only trident does)"
    unfitted = SimpleNamespace(name="trident", ops={"ocr": SimpleNamespace(model=OperatorModel("ocr"))})
    assert estimate_without_trident("trident", unfitted, start, samples, state).note == "no estimate: operator 'ocr' has no fitted throughput model"
    model = OperatorModel("ocr")
    model.fit(samples)
    fitted = SimpleNamespace(name="trident", ops={"ocr": SimpleNamespace(model=model)})
    assert estimate_without_trident("trident", fitted, start, [], state).note == "no estimate: no batch of operator 'ocr' is left in the run's samples"
    gpu = estimate_without_trident("trident", fitted, [("ocr", OpConfig.make("gpu", batch_size=4, gpus=1), 1)], samples, state)
    assert gpu.items_per_s is None and gpu.note.startswith("no estimate: operator 'ocr': the model cannot price the starting config gpu/b4")
    figures = policy_figures("static", None, None, samples, start, state)
    account = build_account("static", None, np.empty(0), np.empty(0), figures.ooms, figures.estimate, 1.0, figures.no_decisions_reason)
    data = account.to_dict()
    assert data["estimated_rate_without_trident"] is None and data["ooms_avoided"] is None
    assert data["estimated_rate_without_trident_note"].startswith("no estimate: the static policy")
    assert any(line.strip().startswith("ESTIMATE without trident: none (the static policy") for line in account.lines())


# ------------------------------------------------------------------ OOMs avoided

def test_ooms_avoided_counts_moves_off_configs_that_had_not_run_out_of_memory():
    ran_out = OpConfig.make(batch_size=16)
    safety = SimpleNamespace(unsafe=lambda op, config: f"{config.label()} memory upper bound 900 MiB > limit 800 MiB")
    policy = SimpleNamespace(name="trident", ops={"ocr": SimpleNamespace(unsafe={ran_out: "cpu/b16 ran out of memory"})}, safety=safety)
    safety_kind = PlanKind.MEMORY_SAFETY.value
    decisions = [_taken(10.0, 11.0, kind=safety_kind, unsafe=(("ocr", ran_out), ("ocr", B8))),
                 _taken(20.0, 21.0, kind=safety_kind, unsafe=(("ocr", B8),)),                          # the same config again
                 _taken(30.0, None, kind=safety_kind, status="refused", unsafe=(("ocr", A),)),         # never moved
                 _taken(40.0, 41.0, unsafe=())]
    ooms = count_ooms_avoided("trident", policy, decisions)
    assert ooms.count == 1 and [(o.operator, o.config, o.at) for o in ooms.configs] == [("ocr", "cpu/b8", T0 + 10.0)]
    assert "memory upper bound" in ooms.configs[0].why and "before they ran out of memory" in ooms.note
    assert count_ooms_avoided("ds2", SimpleNamespace(name="ds2"), decisions).count is None


def test_a_run_started_from_the_memory_says_so_in_every_view():
    record, done = _record_at_rates(2.0, 2.0, switch=10.0, end=40.0)
    said = "started from the memory: the remembered regime with the most items (89% of the input items): embed 10xcpu/b2"
    figures = PolicyFigures("trident", record, NOT_COUNTED, NO_ESTIMATE, "unused", said)
    account = account_of_run(figures, done[:1], done, _state(80, {"embed": (80, 80)}, wall_s=40.0))
    assert account.to_dict()["started_from"] == said
    assert account.lines()[1].strip() == said
    assert f"**Start**: {said}" in account.markdown()
    plain = account_of_run(PolicyFigures("trident", record, NOT_COUNTED, NO_ESTIMATE, "unused"), done[:1], done,
                           _state(80, {"embed": (80, 80)}, wall_s=40.0))
    assert plain.to_dict()["started_from"] is None and "**Start**" not in plain.markdown()
