"""The corpus workloads: documents and video drawn from published corpus statistics, for the headroom benchmarks.

Contract:
- ``CORPORA``: ``documents-corpus`` (``pipelines.corpus_documents`` on the documents profile) and
  ``video-corpus`` (``pipelines.corpus_video`` on the video profile), each on nodes of ``CPUS`` CPUs
  + ``GPUS`` GPUs of ``DEVICE_MEMORY`` (the closed-loop benchmarks' node).
- ``corpus_workload(name, quick, nodes=1) -> (headroom.Workload, CorpusStream)``: the headroom workload
  (each corpus source a regime, the cluster scaled to ``nodes`` nodes, its ``sources`` the published
  figures' pages) and the stream the simulator runs, whose rows are the corpus model's own items.
- ``distributions_figure(name)``: per source, the drawn distributions next to the published figures.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

from benchmarks import headroom
from benchmarks.closed_loop_workload import CPUS, DEVICE_MEMORY, GPUS
from trident_flows.pipelines import corpus_documents, corpus_video
from trident_flows.pipelines.emulated import emulated_pipeline, parse_regimes, regime_plan
from trident_flows.runtime.costmodel import PipelineProfile
from trident_flows.runtime.spec import PipelineSpec
from trident_flows.sim.static_search import StaticConfig

SEED = 46


@dataclass(frozen=True)
class Corpus:
    model: ModuleType
    profile: str
    shards: int
    quick_shards: int


CORPORA = {"documents-corpus": Corpus(corpus_documents, "documents", 40, 8),
           "video-corpus": Corpus(corpus_video, "video", 60, 12)}


@dataclass(frozen=True)
class CorpusStream:
    """A seeded stream of corpus items following a block schedule. It has the fields and methods of
    ``closed_loop_workload.Workload`` that the simulated headroom uses (``replace(stream, regimes=...)``, ``blocks``,
    ``rows``, ``spec``), but its rows are the corpus model's per-item draws (heavy tails and all), not Gamma draws
    around the regime means: the simulator runs the corpus's own items."""

    corpus: str
    variant: str
    regimes: str
    seed: int = SEED
    time_scale: float = 1.0
    memory_spikes: tuple[tuple[int, int, float], ...] = ()

    @property
    def items(self) -> int:
        return sum(c for _, c in parse_regimes(self.regimes))

    def blocks(self) -> list[tuple[str, int, int]]:
        out, start = [], 0
        for regime, count in regime_plan({}, None, self.regimes):
            out.append((regime, start, start + count))
            start += count
        return out

    def rows(self, profile: PipelineProfile | None = None) -> list[dict[str, Any]]:
        return list(CORPORA[self.corpus].model.rows(parse_regimes(self.regimes), self.seed))

    def spec(self, profile: PipelineProfile, config: StaticConfig, name: str, max_replicas: int | None = None) -> PipelineSpec:
        base = emulated_pipeline(profile, config.stages(max_replicas), name=name, items=self.items, regimes=self.regimes, seed=self.seed,
                                 time_scale=self.time_scale)
        return replace(base, source=functools.partial(self.rows, None))


def corpus_workload(name: str, quick: bool, nodes: int = 1) -> tuple[headroom.Workload, CorpusStream]:
    """The headroom workload and the simulated stream of corpus ``name``: the profile with each corpus source's mean
    item as a regime (``profile`` of the model), the stream's blocks (``shards`` shards of the model's shard size,
    seeded, consecutive shards of one source merged; ``quick_shards`` with ``quick``), the cluster scaled to ``nodes``
    nodes, and the workload's ``sources`` (the published figures' pages)."""
    if name not in CORPORA:
        raise ValueError(f"unknown corpus workload {name!r}; choose from {sorted(CORPORA)}")
    corpus = CORPORA[name]
    profile = corpus.model.profile(PipelineProfile.load(corpus.profile), seed=SEED)
    schedule = tuple(corpus.model.blocks(corpus.quick_shards if quick else corpus.shards, SEED))
    blocks = {s: round(b) for s, b in corpus.model.MEAN_BLOCK_ITEMS.items()}
    note = (f"{name}: {len(schedule)} blocks of {corpus.model.SHARD_ITEMS}-item shards, sources {dict(corpus.model.SHARES)}, "
            f"mean block items {blocks} (shard / (1 - share)); {nodes} node(s) of {CPUS} CPUs + {GPUS} GPUs. "
            f"{corpus.model.OUTSIDE_PROFILE}")
    workload = headroom.Workload(name, profile, CPUS * nodes, GPUS * nodes, DEVICE_MEMORY, schedule, note=note,
                                 sources=corpus.model.SOURCES)
    stream = CorpusStream(name, "corpus", ",".join(f"{r}:{n}" for r, n in schedule))
    return workload, stream


def figures_of(name: str) -> list[dict[str, Any]]:
    return [f.to_dict() for f in CORPORA[name].model.FIGURES]


def distributions_figure(name: str, sample: int = 20_000):
    """Per source, the drawn distributions with the published figures they come from marked (docs/corpus-documents.png,
    docs/corpus-video.png)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    model = CORPORA[name].model
    rng = np.random.default_rng(SEED)
    drawn = {s: model.draw(s, sample, rng) for s in model.SHARES}
    if model is corpus_documents:
        panels = [("pages", "pages per document", [(corpus_documents.PAGES_MEAN, "PDFA mean 8.6")]),
                  ("chars", "characters per document", [(8_775, "FinePDFs p50"), (102_657, "p90"), (707_362, "p99")]),
                  ("bytes", "file bytes", [(corpus_documents.BYTES_MEAN, "SafeDocs mean"), (2**20, "1 MiB (24% above)")]),
                  ("scanned_pages", "scanned pages per document", [])]
    else:
        panels = [("duration_s", "source duration (s)", [(300, "InternVid 49% <= 5 min"), (600, "75% <= 10 min"),
                                                         (1200, "92% <= 20 min"), (corpus_video.CLIP_MEAN_S, "Panda clip mean 8.5 s")]),
                  ("pixels", "decoded pixels per video", []),
                  ("frames", "frames per video", []),
                  ("kept_frames", "kept frames per clip", [])]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.4))
    for ax, (feature, label, marks) in zip(axes, panels):
        values = np.concatenate([v[feature] for v in drawn.values()])
        lo, hi = max(values[values > 0].min(), 1e-3) if (values > 0).any() else 1e-3, max(values.max(), 1.0)
        bins = np.logspace(np.log10(lo), np.log10(hi), 40)
        for source, v in drawn.items():
            ax.hist(v[feature][v[feature] > 0], bins=bins, alpha=0.55, label=f"{source} ({model.SHARES[source]:.0%})")
        for x, text in marks:
            ax.axvline(x, color="black", linewidth=0.8, linestyle="--")
            ax.text(x, ax.get_ylim()[1] * 0.95, text, rotation=90, fontsize=7, va="top", ha="right")
        ax.set_xscale("log")
        ax.set_title(label, fontsize=9)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{name}: drawn distributions (seed {SEED}, {sample} per source); dashed: published figures "
                 f"({', '.join(s.split('/')[2] for s in model.SOURCES)})", fontsize=8)
    fig.tight_layout()
    return fig
