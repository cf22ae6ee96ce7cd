"""The emulated video pipeline: decode -> scenes -> motion -> dedup_frames -> text_detect -> safety -> embed,
from the measured cost model ``profiles/video.json`` (written by ``trident-flows profile video``).

Contract of ``build(*, input, synth, seed, regimes, work_dir, profile=None, time_scale=1.0)``
(the registry contract of ``trident_flows.pipelines``): a PipelineSpec of emulated operators
(``trident_flows.pipelines.emulated``) fed by a synthetic stream of ``synth`` videos (default
1000) whose workload features (source pixels/frames/seconds, sampled frames, per-clip frames
and pixels) follow ``regimes`` (default: half ``small``, a quarter ``hd``, a quarter ``long``,
in that order), Gamma-distributed around the profile's per-regime means. ``scenes`` splits a
video into clips at the profile's measured clips-per-video (its selectivity); each clip row
carries the per-clip features. ``input`` is refused (an emulated pipeline reads no files); a
missing profile raises ``FileNotFoundError`` naming the command that writes it.

The initial (static) configuration is sized for one node of 8 CPUs + 1 GPU: the model
operators (``text_detect``, ``safety``, ``embed``) share the GPU when the profile has a GPU
cost for them, and the CPUs left go to the CPU operators in proportion to their modelled
seconds per input video (``default_stages``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trident_flows.pipelines.emulated import Stage, emulated_pipeline
from trident_flows.pipelines.emulated_docs import mean_seconds_per_input_item
from trident_flows.runtime.costmodel import PipelineProfile
from trident_flows.runtime.spec import PipelineSpec
from trident_flows.scheduler.types import CPU, GPU, OpConfig

OPERATORS = ("decode", "scenes", "motion", "dedup_frames", "text_detect", "safety", "embed")
GPU_OPERATORS = ("text_detect", "safety", "embed")
DEFAULT_SHARES = {"small": 2, "hd": 1, "long": 1}


def default_regimes(profile: PipelineProfile, n: int) -> str:
    """``n`` videos split over the profile's regimes by ``DEFAULT_SHARES`` (equal shares for others)."""
    names = list(DEFAULT_SHARES) if set(DEFAULT_SHARES) <= set(profile.workloads) else list(profile.workloads) or ["default"]
    weights = [DEFAULT_SHARES.get(r, 1) for r in names]
    counts = [n * w // sum(weights) for w in weights]
    counts[0] += n - sum(counts)
    return ",".join(f"{r}:{c}" for r, c in zip(names, counts) if c > 0)


def default_stages(profile: PipelineProfile, regimes: str, n: int, cpus: int = 8, gpus: int = 1, batch_size: int = 4,
                   gpu_batch_size: int = 16) -> list[Stage]:
    """A static placement for ``cpus`` CPUs + ``gpus`` GPUs (see the module docstring)."""
    missing = [o for o in OPERATORS if o not in {op.name for op in profile.operators}]
    if missing:
        raise ValueError(f"profile {profile.name!r} lacks operators {missing}; re-run `trident-flows profile video`")
    gpu_ops = [o for o in OPERATORS if o in GPU_OPERATORS and GPU in profile.operator(o).devices and gpus > 0]
    cpu_ops = [o for o in OPERATORS if o not in gpu_ops]
    replicas = {o: 1 for o in cpu_ops}
    load = {o: mean_seconds_per_input_item(profile, CPU, o, regimes, n) for o in cpu_ops}
    for _ in range(max(0, cpus - len(gpu_ops) - len(cpu_ops))):  # a GPU replica holds a CPU too
        worst = max(cpu_ops, key=lambda o: load[o] / replicas[o])
        replicas[worst] += 1
    share = gpus / len(gpu_ops) if gpu_ops else 0.0
    stages = [Stage(o, OpConfig.make(CPU, batch_size=batch_size), replicas[o]) for o in cpu_ops]
    stages += [Stage(o, OpConfig.make(GPU, batch_size=gpu_batch_size, gpus=share), 1) for o in gpu_ops]
    return sorted(stages, key=lambda s: OPERATORS.index(s.operator))


def build(*, input: Path | None = None, synth: int | None = None, seed: int = 0, regimes: str | None = None,
          work_dir: Path | None = None, profile: PipelineProfile | str | Path | None = None, time_scale: float = 1.0,
          **_: Any) -> PipelineSpec:
    """The emulated video pipeline (see the module docstring)."""
    if input is not None:
        raise ValueError("emulated-video generates its own workload stream: use --synth N (and --regimes), not --input")
    if not isinstance(profile, PipelineProfile):
        profile = PipelineProfile.load(profile or "video")
    n = synth if synth is not None else 1000
    regimes = regimes or default_regimes(profile, n)
    stages = default_stages(profile, regimes, n)
    return emulated_pipeline(profile, stages, name="emulated-video", items=n, regimes=regimes, seed=seed, time_scale=time_scale)
