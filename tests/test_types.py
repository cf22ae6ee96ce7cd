"""The core value types: validation messages, hashing and JSON round trips."""

import json
import pickle

import pytest
from builders import batch_sample

from trident_flows.core.types import (
    BatchSample,
    CanaryEnd,
    CanaryVerdict,
    ClusterSpec,
    OpConfig,
    OperatorPlan,
    Outcome,
    Plan,
    PlanKind,
    Rationale,
    ReplicaGroup,
)


def test_opconfig_is_hashable_and_round_trips():
    a = OpConfig.make("gpu", batch_size=16, threads=2)
    b = OpConfig.make("gpu", batch_size=16, threads=2)
    assert a == b and hash(a) == hash(b)
    assert a.gpus == 1.0 and a.knob("threads") == 2
    assert OpConfig.from_dict(json.loads(json.dumps(a.to_dict()))) == a
    assert a.with_changes(batch_size=32, threads=4) == OpConfig.make("gpu", batch_size=32, threads=4)


@pytest.mark.parametrize("kwargs, message", [
    (dict(batch_size=0), "batch_size must be an integer >= 1"),
    (dict(device="gpu", gpus=0.0), "needs gpus > 0"),
    (dict(device="cpu", gpus=1.0), "cannot hold gpus"),
])
def test_opconfig_refuses_bad_values_with_a_message(kwargs, message):
    with pytest.raises(ValueError, match=message):
        OpConfig(**kwargs)


def test_batch_sample_and_plan_round_trip_through_json():
    s = batch_sample(operator="ocr", replica_id="ocr-1", config=OpConfig(), start=1.0, end=2.0, busy_s=0.9, items_in=8,
                     features={"pages": 12.0}, peak_host_mem_bytes=10, outcome=Outcome.OOM, config_epoch=3)
    assert BatchSample.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    plan = Plan((OperatorPlan("ocr", (ReplicaGroup(OpConfig(), 3, "node"),), "bottleneck"),), 12.5, "test")
    assert Plan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    assert plan.for_operator("ocr").replicas == 3
    why = Rationale(PlanKind.MEMORY_SAFETY, 1.5, 2.0, 20.0, 81.0, ("ocr",), unsafe=(("ocr", OpConfig.make("cpu", batch_size=64)),),
                    canaries_ended=(CanaryEnd("ocr", OpConfig.make("cpu", batch_size=16), CanaryVerdict.REJECTED),))
    plan = Plan(plan.operators, 12.5, "", why)
    assert Plan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    assert round(why.payback_s) == 162  # 81 items lost to the switch / 0.5 items/s gained


def test_cluster_spec_totals():
    spec = ClusterSpec.single_node(cpus=16, gpus=2)
    assert spec.total_cpus == 16 and spec.total_gpus == 2


def test_opconfig_hash_is_cached_but_never_pickled():
    a = OpConfig.make("gpu", batch_size=8, fps=2)
    assert hash(a) == hash(OpConfig.make("gpu", batch_size=8, fps=2))
    clone = pickle.loads(pickle.dumps(a))
    assert "_hash" not in clone.__dict__  # another process would compute its own string hashes
    assert clone == a and {a: 1}[clone] == 1
