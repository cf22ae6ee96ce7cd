"""A pipeline is sized to the cluster it gets, and emulated replicas sharing cores contend for them."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace

import pytest
from test_runtime_support import child_env, docs_test_profile

from trident_flows.core.state import RuntimeConfigError
from trident_flows.core.types import CPU, GPU, ConfigSpace
from trident_flows.pipelines import emulated_docs
from trident_flows.pipelines.emulated import EmulatedOperator, cost_params, synthetic_rows
from trident_flows.runtime.sizing import fit_to_cluster
from trident_flows.runtime.spec import rows_to_batch


def build(*, synth: int | None = None, seed: int = 0, regimes: str | None = None, **_):
    """A pipeline-registry entry for the CLI test: the emulated document layout (8 CPUs + 1 GPU) on the millisecond test profile."""
    return emulated_docs.build(synth=synth or 200, seed=seed, regimes=regimes, profile=docs_test_profile())


def _held(spec) -> tuple[float, float]:
    return (sum(o.config.cpus * o.replicas for o in spec.operators), sum(o.config.gpus * o.replicas for o in spec.operators))


def test_a_pipeline_that_fits_is_run_as_built():
    spec = build()
    assert fit_to_cluster(spec, 8, 1).spec is spec and fit_to_cluster(spec, 16, 2).notes == ()


def test_two_cpus_and_no_gpu_get_every_operator_a_fraction_of_a_cpu():
    spec = build()
    sizing = fit_to_cluster(spec, 2, 0)
    fitted = sizing.spec
    cpus, gpus = _held(fitted)
    assert cpus <= 2 and gpus == 0
    assert [o.replicas for o in fitted.operators] == [1] * 6
    assert {o.config.cpus for o in fitted.operators} == {0.3333}
    embed = fitted.operator("embed")
    assert embed.config.device == CPU and embed.config.batch_size == spec.operator("embed").config.batch_size
    # a replica the scheduler adds later is as large as the ones the run started with
    assert embed.space.config(CPU, 4).cpus == 0.3333 and embed.space.config(GPU, 4).cpus == 0.3333
    assert any("embed runs on the CPU" in n for n in sizing.notes) and "6 replicas share 2 CPUs, each holding 0.3333 CPU" in sizing.notes
    assert [r["id"] for r in fitted.source()] == [r["id"] for r in spec.source()]


def test_fewer_replicas_come_before_fractions_of_a_cpu():
    fitted = fit_to_cluster(build(), 6, 0).spec
    assert _held(fitted) == (6, 0) and {o.config.cpus for o in fitted.operators} == {1.0}


def test_gpu_replicas_share_the_gpus_they_get():
    spec = build()
    two = replace(spec, operators=tuple(replace(o, replicas=2) if o.name == "embed" else o for o in spec.operators))
    fitted = fit_to_cluster(two, 16, 1).spec
    assert fitted.operator("embed").replicas == 1 and _held(fitted)[1] <= 1


def test_an_operator_that_cannot_run_on_a_cpu_is_refused_without_gpus():
    spec = build()
    gpu_only = replace(spec.operator("embed"), space=ConfigSpace(devices=(GPU,)))
    spec = replace(spec, operators=tuple(gpu_only if o.name == "embed" else o for o in spec.operators))
    with pytest.raises(RuntimeConfigError, match=r"'embed' runs only on gpu .* --gpus"):
        fit_to_cluster(spec, 8, 0)


@pytest.mark.ray
def test_the_node_core_pool_runs_as_many_kernels_at_once_as_the_node_has_cpus(ray_cluster):
    from trident_flows.runtime import devices

    pool = devices.node_cores()
    cores = ray_cluster.get(pool.info.remote())["cores"]
    assert cores == int(ray_cluster.cluster_resources()["CPU"])
    start = time.perf_counter()
    ray_cluster.get([pool.run.remote(0.3) for _ in range(3 * cores)])
    assert time.perf_counter() - start >= 3 * 0.3 * 0.95  # three waves: no more kernels at once than cores


@pytest.mark.ray
def test_emulated_replicas_use_the_core_pool_only_when_holding_a_fraction_of_a_cpu(ray_cluster):
    from trident_flows.runtime import devices

    profile = docs_test_profile()
    spec = build()
    config = spec.operator("parse").config
    batch = rows_to_batch(list(synthetic_rows(profile.workloads, 8, "long:8", seed=0)))
    pool = devices.node_cores()

    def kernels_after(cpus: float) -> int:
        op = EmulatedOperator(config.with_changes(cpus=cpus), name="parse", cost=cost_params(profile.operator("parse")))
        before = ray_cluster.get(pool.info.remote())["kernels"]
        op(batch)
        return ray_cluster.get(pool.info.remote())["kernels"] - before

    assert kernels_after(0.5) == 1
    assert kernels_after(1.0) == 0


def test_the_run_command_sizes_the_pipeline_to_a_two_cpu_cluster(tmp_path):
    """``trident-flows run`` on a local Ray node of 2 CPUs and no GPU, in a fresh process: the
    8-CPU + 1-GPU layout is shrunk to fit, the trident policy (the default: no --policy) schedules it, nothing is lost."""
    script = f"""
import trident_flows.pipelines as pipelines
pipelines.PIPELINES["sizing-test"] = "test_sizing"
from trident_flows.cli import app
app(["run", "sizing-test", "--synth", "200", "--cpus", "2", "--gpus", "0", "--tick-s", "0.5",
     "--out", {str(tmp_path / 'out')!r}, "--summary-json", {str(tmp_path / 's.json')!r}])
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=child_env())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "sized to the cluster (2 CPUs, 0 GPUs)" in proc.stdout and "Running HiGHS" not in proc.stdout
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["items_in"] == 200 and summary["items_missing"] == 0 and summary["duplicate_ids"] == 0
    assert summary["policy"] == "trident"
    assert summary["operators"]["embed"]["configs"] and all(k.startswith("cpu/") for k in summary["operators"]["embed"]["configs"])
