"""The real video-curation pipeline: decode -> scenes -> motion -> dedup_frames -> text_detect -> safety -> embed.

Contract:
- Operators: ``decode`` (``video_decode``), ``scenes``, ``motion``, ``dedup_frames``
  (``video_clips``), ``text_detect``, ``safety``, ``embed`` (``video_models``); frames travel as
  small sampled arrays (``video_rows``). A broken file is dead-lettered with its reason; nothing raises.
- Sampling and analysis settings are quality knobs (``pipelines.quality``), recorded on every row
  as ``cfg_<operator>_<knob>``; ``infer_frames``, device, batch size and replicas are execution knobs.
- Workload features, summed over live rows: ``decode``: ``pixels``, ``frames``, ``duration_s``,
  ``frame_pixels``, ``sampled_source_pixels``;
  ``scenes``: ``sampled_*``; ``motion`` / ``dedup_frames``: ``clip_*``; ``text_detect`` / ``safety``
  / ``embed``: ``kept_*``, ``clip_s`` and ``safety_frames``.
- ``build(input=..., synth=...)`` builds the pipeline over a directory of videos or generated ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Mapping

from trident_flows.core.types import CPU, GPU, ConfigSpace, KnobSpace, OpConfig
from trident_flows.pipelines.quality import apply_quality
from trident_flows.pipelines.video_clips import DedupFrames, Motion, Scenes
from trident_flows.pipelines.video_decode import VIDEO_SUFFIXES, Decode
from trident_flows.pipelines.video_models import Embed, Safety, TextDetect
from trident_flows.runtime.spec import ID, OperatorSpec, PipelineSpec

MODEL_RESOURCES = ((CPU, (1.0, 0.0)), (GPU, (1.0, 0.25)))


def operator_specs() -> tuple[OperatorSpec, ...]:
    """The seven operators with their starting configs and search spaces (execution knobs only:
    quality knobs are constructor params, see ``trident_flows.pipelines.quality``)."""
    cpu_only = ((CPU, (1.0, 0.0)),)
    return (
        OperatorSpec("decode", Decode, OpConfig.make(batch_size=1), replicas=2,
                     space=ConfigSpace(devices=(CPU,), batch_size_min=1, batch_size_max=8, resources=cpu_only)),
        OperatorSpec("scenes", Scenes, OpConfig.make(batch_size=2), space=ConfigSpace(devices=(CPU,), batch_size_max=16, resources=cpu_only)),
        OperatorSpec("motion", Motion, OpConfig.make(batch_size=8), space=ConfigSpace(devices=(CPU,), batch_size_max=32, resources=cpu_only)),
        OperatorSpec("dedup_frames", DedupFrames, OpConfig.make(batch_size=8),
                     space=ConfigSpace(devices=(CPU,), batch_size_max=32, resources=cpu_only)),
        OperatorSpec("text_detect", TextDetect, OpConfig.make(batch_size=4),
                     space=ConfigSpace(devices=(CPU, GPU), batch_size_min=1, batch_size_max=32, resources=MODEL_RESOURCES,
                                       knobs=(KnobSpace("infer_frames", "int", 1, 64),))),
        OperatorSpec("safety", Safety, OpConfig.make(batch_size=8),
                     space=ConfigSpace(devices=(CPU, GPU), batch_size_min=1, batch_size_max=64, resources=MODEL_RESOURCES,
                                       knobs=(KnobSpace("infer_frames", "int", 1, 64),))),
        OperatorSpec("embed", Embed, OpConfig.make(batch_size=16),
                     space=ConfigSpace(devices=(CPU, GPU), batch_size_min=1, batch_size_max=128, resources=MODEL_RESOURCES)),
    )


def file_rows(paths: list[Path], ids: list[str]) -> list[dict[str, Any]]:
    return [{ID: i, "path": str(p)} for i, p in zip(ids, paths)]


def build(*, input: Path | None = None, synth: int | None = None, seed: int = 0, regimes: str | None = None,
          work_dir: Path = Path(".trident-work"), broken: float = 0.1, quality: Mapping[str, Any] | None = None,
          tune: Mapping[str, Any] | None = None) -> PipelineSpec:
    """The real video pipeline over a directory of videos, or ``synth`` generated ones.

    ``quality`` sets quality knobs (``{"decode.sample_fps": 1.0}``); ``tune`` marks some tunable
    with a range (``{"decode.sample_fps": "1..4"}``); see ``trident_flows.pipelines.quality``."""
    if input is not None:
        root = Path(input)
        if not root.is_dir():
            raise ValueError(f"video pipeline: --input {root} is not a directory of video files")
        paths = sorted(p for p in root.rglob("*") if p.suffix.lower() in VIDEO_SUFFIXES)
        if not paths:
            raise ValueError(f"video pipeline: no video files ({', '.join(VIDEO_SUFFIXES)}) under {root}")
        rows = file_rows(paths, [str(p.relative_to(root).with_suffix("")) for p in paths])
    elif synth:
        from trident_flows.pipelines.synth_video import generate

        manifest = generate(Path(work_dir) / f"synth-video-s{seed}-n{synth}", n=synth, regimes=regimes, broken=broken, seed=seed)
        rows = [{ID: r.id, "path": r.path, "regime": r.regime} for r in manifest.itertuples()]
    else:
        raise ValueError("video pipeline: give --input DIR (a folder of videos) or --synth N (generate N videos)")

    def source() -> Iterator[dict[str, Any]]:
        return iter([dict(r) for r in rows])

    return PipelineSpec("video", apply_quality("video", operator_specs(), quality, tune), source, items=len(rows))
