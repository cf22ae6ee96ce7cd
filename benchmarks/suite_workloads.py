"""The workloads of the closed-loop suite, live and simulated: a profile, its layout, the node's GPUs and a seeded
stream of regime blocks each.

Contract: ``suite_workloads(quick, names) -> list[SuiteWorkload]`` builds the workloads called ``names``
(``WORKLOADS``) on one logical node of ``CPUS`` CPUs (+ ``GPUS`` GPUs of ``DEVICE_MEMORY``): ``gpu-ocr``,
``cpu-only`` and ``video`` with blocks of ``BLOCK_S`` production seconds each at their optimum
(``equal_time_regimes``; quick: ``QUICK_BLOCK_S``) run at ``TIME_SCALE``, ``docs-baseline`` and
``video-baseline`` the streams of ``closed-loop`` and ``closed-loop-video`` (``suite_workloads`` says
what each is). ``SuiteWorkload.streams()`` gives the regimes stream and its memory-spike
variant, ``baselines`` the static configurations every system starts from, ``headroom_workload`` the
stream as the cost model's headroom reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from benchmarks import closed_loop_workload, headroom
from benchmarks.baselines import Baselines, tune_baselines
from benchmarks.closed_loop_workload import Workload
from trident_flows.pipelines.emulated_docs import LAYOUT as DOCS_LAYOUT
from trident_flows.pipelines.emulated_layout import EmulatedLayout
from trident_flows.pipelines.emulated_video import LAYOUT as VIDEO_LAYOUT
from trident_flows.runtime.costmodel import PipelineProfile

CPUS, GPUS = closed_loop_workload.CPUS, closed_loop_workload.GPUS
DEVICE_MEMORY = closed_loop_workload.DEVICE_MEMORY
# Production seconds per block, and the time scale they run at. A full run keeps blocks of five minutes,
# the upper end of the regime lengths of real corpora: in the simulator, trident gains 1.15x over
# static-default on cpu-only with 5-minute blocks, 1.05x with 4, 1.01x with 3 and nothing with 1-minute
# blocks, which end before a change has paid for its cold starts. The scale keeps the fastest regime
# (short born-digital documents, ~73 items/s at its optimum) within what the runtime moves on 2 cores.
BLOCK_S, QUICK_BLOCK_S = 300.0, 6.0
TIME_SCALE = 0.5
FIRST_N_SHARE = 0.05  # static-first-n profiles the first 5% of the stream (at least MIN_FIRST_N items)
MIN_FIRST_N = 10
SEED = 11
SPIKE_FACTOR = closed_loop_workload.SPIKE_FACTOR


@dataclass(frozen=True)
class SuiteWorkload:
    """One workload of the suite: a profile, its default layout, GPUs on the node, a schedule and a time scale."""

    name: str
    profile: str
    layout: EmulatedLayout
    gpus: int
    regimes: str  # block schedule, "regime:items,..."
    time_scale: float
    note: str
    spike_regime: str = "long"

    def streams(self) -> tuple[Workload, Workload]:
        """The regimes stream and its memory-spike variant (the middle 80% of the first ``spike_regime`` block)."""
        base = Workload("regimes", self.regimes, seed=SEED, time_scale=self.time_scale)
        _, start, end = next(b for b in base.blocks() if b[0] == self.spike_regime)
        count = max(1, int(0.8 * (end - start)))
        return base, Workload("spikes", self.regimes, seed=SEED, time_scale=self.time_scale,
                              memory_spikes=((start + (end - start - count) // 2, count, SPIKE_FACTOR),))

    def baselines(self, profile: PipelineProfile, stream: Workload, rows: Sequence[Mapping[str, Any]]) -> Baselines:
        """The static configurations every system starts from on ``stream`` (``rows``: its rows under ``profile``)."""
        return tune_baselines(profile, self.layout, rows, stream.blocks(), cpus=CPUS, gpus=self.gpus, device_memory_bytes=DEVICE_MEMORY,
                              gpu_batches=closed_loop_workload.GPU_BATCHES, cpu_batch=closed_loop_workload.CPU_BATCH,
                              first_n=max(MIN_FIRST_N, int(len(rows) * FIRST_N_SHARE)))

    def headroom_workload(self, profile: PipelineProfile) -> headroom.Workload:
        schedule = tuple((regime, end - start) for regime, start, end in self.streams()[0].blocks())
        return headroom.Workload(self.name, profile, CPUS, self.gpus, DEVICE_MEMORY, schedule, note=self.note)


def equal_time_regimes(profile: PipelineProfile, gpus: int, regimes: Sequence[str], seconds: float) -> str:
    """A schedule whose blocks each last ``seconds`` at their regime's optimum (production speed, cost model)."""
    probe = headroom.Workload("probe", profile, CPUS, gpus, DEVICE_MEMORY, tuple((r, 1) for r in dict.fromkeys(regimes)))
    opts = headroom.options(probe)
    rate = {r: headroom.regime_optimum(probe, r, opts)[0] for r in dict.fromkeys(regimes)}
    return ",".join(f"{r}:{max(1, int(rate[r] * seconds))}" for r in regimes)


WORKLOADS = ("gpu-ocr", "cpu-only", "docs-baseline", "video-baseline", "video")


def suite_workloads(quick: bool, names: Sequence[str] = WORKLOADS) -> list[SuiteWorkload]:
    """The workloads called ``names``, in the suite's order (see the module docstring):
    - ``gpu-ocr``: documents with RapidOCR as the OCR engine (``profiles/documents-rapidocr.json``: OCR measured on
      CPU, its GPU cost derived, see that profile), 16 CPUs + 2 GPUs, so OCR and embedding compete for the GPUs;
      blocks born-digital ``short`` -> ``scans`` -> ``long`` (long reports, born-digital with a few scanned pages:
      the mixed regime) -> ``short``;
    - ``cpu-only``: documents (tesseract) on 16 CPUs and no GPU, the same blocks;
    - ``docs-baseline`` / ``video-baseline``: the streams of ``closed-loop`` / ``closed-loop-video`` (16 CPUs +
      2 GPUs), kept as the cases with little headroom;
    - ``video``: video on 16 CPUs + 2 GPUs, blocks ``small`` -> ``hd`` -> ``long`` -> ``small``."""
    unknown = sorted(set(names) - set(WORKLOADS))
    if unknown:
        raise ValueError(f"unknown suite workload(s) {unknown}; choose from {list(WORKLOADS)}")
    seconds = QUICK_BLOCK_S if quick else BLOCK_S
    doc_blocks, video_blocks = ("short", "scans", "long", "short"), ("small", "hd", "long", "small")
    old_docs, old_video = closed_loop_workload.PIPELINES["documents"], closed_loop_workload.PIPELINES["video"]
    each = f"blocks of {seconds:g} s each at their optimum (production time), time scale {TIME_SCALE:g}"

    def equal_time(profile: str, gpus: int, blocks: Sequence[str]) -> str:
        return equal_time_regimes(PipelineProfile.load(profile), gpus, blocks, seconds)

    build = {
        "gpu-ocr": lambda: SuiteWorkload(
            "gpu-ocr", "documents-rapidocr", DOCS_LAYOUT, GPUS, equal_time("documents-rapidocr", GPUS, doc_blocks), TIME_SCALE,
            f"documents, OCR by RapidOCR (CPU measured, GPU derived), {CPUS} CPUs + {GPUS} GPUs, {each}"),
        "cpu-only": lambda: SuiteWorkload(
            "cpu-only", "documents", DOCS_LAYOUT, 0, equal_time("documents", 0, doc_blocks), TIME_SCALE,
            f"documents (tesseract) on {CPUS} CPUs, no GPU, {each}"),
        "docs-baseline": lambda: SuiteWorkload(
            "docs-baseline", "documents", DOCS_LAYOUT, GPUS, old_docs.quick_regimes if quick else old_docs.regimes,
            old_docs.quick_time_scale if quick else old_docs.time_scale, "the closed-loop benchmark's documents stream"),
        "video-baseline": lambda: SuiteWorkload(
            "video-baseline", "video", VIDEO_LAYOUT, GPUS, old_video.quick_regimes if quick else old_video.regimes,
            old_video.quick_time_scale if quick else old_video.time_scale, "the closed-loop-video benchmark's stream"),
        "video": lambda: SuiteWorkload(
            "video", "video", VIDEO_LAYOUT, GPUS, equal_time("video", GPUS, video_blocks), TIME_SCALE,
            f"video on {CPUS} CPUs + {GPUS} GPUs, {each}; the profile's regimes (small, hd, long) bound the variation"),
    }
    return [build[name]() for name in WORKLOADS if name in names]
