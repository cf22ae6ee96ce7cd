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
seconds per input video (see ``emulated_layout``).
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
