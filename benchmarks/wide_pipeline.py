"""``documents10``: a 10-operator emulated pipeline, for measuring the controller's tick at scale.

The issue's tick target is "256 nodes x 10 operators"; the committed pipelines have 6 (documents)
and 7 (video). No new operator is profiled here: the pipeline is composed only of committed cost
models.

Contract: ``wide_profile()`` returns a ``PipelineProfile`` named ``documents10``: the six operators
of the committed ``documents`` profile (parse -> ocr -> langid -> quality -> dedup -> embed), each
unchanged, followed by a second copy of each of its last four stages (``langid_2``, ``quality_2``,
``dedup_2``, ``embed_2``). A copy has its original's cost model, devices, selectivity and
features (so the same config space), and only a new name: the simulator and the emulated operator
decide which rows a filter keeps from a hash of the row id and the operator's name, so ``dedup_2``
drops another 18% of the rows, not the same ones. The workloads (regimes) are the documents
profile's. Every figure measured on it is an emulated pipeline's, not a real 10-stage one's.
``load_profile(name)`` loads a committed profile, or builds this one for ``documents10``.
``LAYOUT`` is its ``EmulatedLayout``: the documents layout's (default regime shares, batch sizes) over the ten
operators, both embeds on the GPUs; its ``default_stages`` take ``wide_profile()`` (``build`` would look for a
committed ``documents10`` profile, which there is none of).
"""

from __future__ import annotations

from dataclasses import replace

from trident_flows.pipelines.emulated_docs import LAYOUT as DOCS_LAYOUT
from trident_flows.pipelines.emulated_layout import EmulatedLayout
from trident_flows.runtime.costmodel import PipelineProfile

WIDE = "documents10"
BASE = "documents"
COPIED = ("langid", "quality", "dedup", "embed")
LAYOUT: EmulatedLayout = replace(DOCS_LAYOUT, name="emulated-docs10", profile=WIDE,
                                 operators=(*DOCS_LAYOUT.operators, *(f"{name}_2" for name in COPIED)),
                                 gpu_operators=(*DOCS_LAYOUT.gpu_operators, *(f"{name}_2" for name in COPIED if name in DOCS_LAYOUT.gpu_operators)))


def wide_profile() -> PipelineProfile:
    base = PipelineProfile.load(BASE)
    copies = tuple(replace(base.operator(name), name=f"{name}_2",
                           notes=f"a copy of {BASE}'s {name} (its cost model unchanged), for a 10-operator pipeline")
                   for name in COPIED)
    measured_on = {**dict(base.measured_on), "composed": f"{BASE} + copies of {', '.join(COPIED)}"}
    return PipelineProfile(WIDE, (*base.operators, *copies), measured_on, base.workloads)


def load_profile(name: str) -> PipelineProfile:
    """The committed profile ``name``, or ``wide_profile()`` for ``documents10``."""
    return wide_profile() if name == WIDE else PipelineProfile.load(name)
