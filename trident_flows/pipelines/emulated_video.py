"""The emulated video pipeline: decode -> scenes -> motion -> dedup_frames -> text_detect -> safety -> embed,
from the measured cost model ``profiles/video.json`` (written by ``trident-flows profile video``).

Contract of ``build(*, input, synth, seed, regimes, work_dir, profile=None, time_scale=1.0)``
(the registry contract of ``trident_flows.pipelines``): a PipelineSpec of emulated operators fed by
``synth`` synthetic videos (default 1000) whose features follow ``regimes`` (default half
``small``, a quarter ``hd``, a quarter ``long``); ``scenes`` splits a video into the profile's
clips per video. ``input`` is refused (no files are read); a missing profile raises
``FileNotFoundError`` naming the command that writes it. The initial configuration is sized for
one node of 8 CPUs + 1 GPU (``emulated_layout``).
"""

from __future__ import annotations

from typing import Any, Mapping

from trident_flows.pipelines.emulated_layout import EmulatedLayout
from trident_flows.pipelines.quality import refuse_quality
from trident_flows.runtime.spec import PipelineSpec

OPERATORS = ("decode", "scenes", "motion", "dedup_frames", "text_detect", "safety", "embed")
LAYOUT = EmulatedLayout(name="emulated-video", profile="video", operators=OPERATORS,
                        gpu_operators=("text_detect", "safety", "embed"), default_shares={"small": 2, "hd": 1, "long": 1},
                        batch_size=4, gpu_batch_size=16)


def build(*, quality: Mapping[str, Any] | None = None, tune: Mapping[str, Any] | None = None, **options: Any) -> PipelineSpec:
    """The emulated video pipeline (see the module docstring); it has no quality knobs."""
    refuse_quality(LAYOUT.name, quality, tune)
    return LAYOUT.build(**options)
