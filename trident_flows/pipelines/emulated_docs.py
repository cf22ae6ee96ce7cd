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
operators in proportion to their modelled seconds per input item (see ``emulated_layout``).
"""

from __future__ import annotations

from typing import Any, Mapping

from trident_flows.pipelines.emulated_layout import EmulatedLayout
from trident_flows.pipelines.quality import refuse_quality
from trident_flows.runtime.spec import PipelineSpec

OPERATORS = ("parse", "ocr", "langid", "quality", "dedup", "embed")
LAYOUT = EmulatedLayout(name="emulated-docs", profile="documents", operators=OPERATORS, gpu_operators=("embed",),
                        default_shares={"short": 2, "long": 1, "scans": 1}, batch_size=8, gpu_batch_size=32)


def build(*, quality: Mapping[str, Any] | None = None, tune: Mapping[str, Any] | None = None, **options: Any) -> PipelineSpec:
    """The emulated document pipeline (see the module docstring); it has no quality knobs."""
    refuse_quality(LAYOUT.name, quality, tune)
    return LAYOUT.build(**options)
