"""The emulated document pipeline: parse -> ocr -> langid -> quality -> dedup -> embed, from the
measured cost model ``profiles/documents.json`` (written by ``trident-flows profile documents``).

Contract of ``build(*, input, synth, seed, regimes, work_dir, profile=None, time_scale=1.0)``
(the registry contract of ``trident_flows.pipelines``): a PipelineSpec of emulated operators fed
by a synthetic stream of ``synth`` items (default 1000) whose per-item workload features
(pages, scanned pages, chars, ...) follow ``regimes`` (default: half ``short``, a quarter
``long``, a quarter ``scans``, in that order), Gamma-distributed around the profile's
per-regime means. ``input`` is refused (an emulated pipeline reads no files). A missing
profile raises ``FileNotFoundError`` naming the command that writes it.

The initial (static) configuration is sized for one node of 8 CPUs + 1 GPU: ``embed`` on the
GPU when the profile has a GPU cost for it, and the remaining CPUs shared among the CPU
operators in proportion to their modelled seconds per input item (``default_stages``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trident_flows.pipelines.emulated import Stage, emulated_pipeline, regime_plan
from trident_flows.runtime.costmodel import PipelineProfile
from trident_flows.runtime.spec import PipelineSpec
from trident_flows.scheduler.types import CPU, GPU, OpConfig

OPERATORS = ("parse", "ocr", "langid", "quality", "dedup", "embed")
DEFAULT_SHARES = {"short": 2, "long": 1, "scans": 1}
GPU_OPERATORS = ("embed",)


def default_regimes(profile: PipelineProfile, n: int) -> str:
    """``n`` items split over the profile's regimes by ``DEFAULT_SHARES`` (equal shares for others)."""
    known = list(profile.workloads) or ["default"]
    names = [r for r in DEFAULT_SHARES if r in known] + [r for r in known if r not in DEFAULT_SHARES]
    weights = [DEFAULT_SHARES.get(r, 1) for r in names]
    counts = [n * w // sum(weights) for w in weights]
    counts[0] += n - sum(counts)
    return ",".join(f"{r}:{c}" for r, c in zip(names, counts) if c > 0)


def mean_seconds_per_input_item(profile: PipelineProfile, device: str, name: str, regimes: str, n: int) -> float:
    """Modelled seconds one replica spends per *input* item of the stream (after upstream filters)."""
    blocks = regime_plan(profile.workloads, n, regimes)
    total = sum(c for _, c in blocks) or 1
    features: dict[str, float] = {}
    for regime, count in blocks:
        for f, mean in profile.workloads.get(regime, {}).items():
            features[f] = features.get(f, 0.0) + mean * count / total
    reach = 1.0
    for op in profile.operators:
        if op.name == name:
            break
        reach *= op.selectivity
    return reach * profile.operator(name).device(device).seconds(1, features)


def default_stages(profile: PipelineProfile, regimes: str, n: int, cpus: int = 8, gpus: int = 1, batch_size: int = 8,
                   gpu_batch_size: int = 32) -> list[Stage]:
    """A static placement for ``cpus`` CPUs + ``gpus`` GPUs (see the module docstring)."""
    missing = [o for o in OPERATORS if o not in {op.name for op in profile.operators}]
    if missing:
        raise ValueError(f"profile {profile.name!r} lacks operators {missing}; re-run `trident-flows profile documents`")
    gpu_ops = [o for o in OPERATORS if o in GPU_OPERATORS and GPU in profile.operator(o).devices and gpus > 0]
    cpu_ops = [o for o in OPERATORS if o not in gpu_ops]
    replicas = {o: 1 for o in cpu_ops}
    load = {o: mean_seconds_per_input_item(profile, CPU, o, regimes, n) for o in cpu_ops}
    for _ in range(max(0, cpus - len(gpu_ops) - len(cpu_ops))):
        worst = max(cpu_ops, key=lambda o: load[o] / replicas[o])
        replicas[worst] += 1
    stages = [Stage(o, OpConfig.make(CPU, batch_size=batch_size), replicas[o]) for o in cpu_ops]
    stages += [Stage(o, OpConfig.make(GPU, batch_size=gpu_batch_size, gpus=gpus / len(gpu_ops) if len(gpu_ops) > 1 else 1.0), 1)
               for o in gpu_ops]
    return sorted(stages, key=lambda s: OPERATORS.index(s.operator))


def build(*, input: Path | None = None, synth: int | None = None, seed: int = 0, regimes: str | None = None,
          work_dir: Path | None = None, profile: PipelineProfile | str | Path | None = None, time_scale: float = 1.0,
          **_: Any) -> PipelineSpec:
    """The emulated document pipeline (see the module docstring)."""
    if input is not None:
        raise ValueError("emulated-docs generates its own workload stream: use --synth N (and --regimes), not --input")
    if not isinstance(profile, PipelineProfile):
        profile = PipelineProfile.load(profile or "documents")
    n = synth if synth is not None else 1000
    regimes = regimes or default_regimes(profile, n)
    stages = default_stages(profile, regimes, n)
    return emulated_pipeline(profile, stages, name="emulated-docs", items=n, regimes=regimes, seed=seed, time_scale=time_scale)
