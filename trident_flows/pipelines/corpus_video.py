"""A video corpus drawn from published statistics of video curation corpora, as feature rows for the video cost model.

Contract:
- ``FIGURES``: every number the model uses, each a ``corpus_model.Figure`` (published, derived or
  ASSUMED, with its source or reason); ``SOURCES``: the pages.
- Sources (regimes): ``web`` (long videos as InternVid collected them), ``clips`` (pre-cut clips as
  OpenVid-1M and Panda-70M ship them) and ``uhd`` (4K sources, ASSUMED); ``SHARES`` by item count.
- ``draw(source, n, rng)``: per-video features of the video profile (frames, pixels, sampled and
  per-clip frames, kept shares).
- Arrangement: tar shards of ``SHARD_ITEMS`` items of one source in a source-blind order
  (``corpus_model.arrange``); ``MEAN_BLOCK_ITEMS`` follow from ``SHARES`` and the shard size.
- ``blocks``, ``rows``, ``profile`` as in ``corpus_documents`` (``profile`` also sets ``scenes``'
  selectivity to ``CLIPS_PER_VIDEO``). ``OUTSIDE_PROFILE`` says where these videos lie beyond what
  ``profiles/video.json`` was measured on (the cost model extrapolated there).
"""

from __future__ import annotations

import math
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from trident_flows.pipelines import corpus_model
from trident_flows.pipelines.corpus_model import ASSUMED, DERIVED, PUBLISHED, Figure
from trident_flows.runtime.costmodel import PipelineProfile

WEB, CLIPS, UHD = "web", "clips", "uhd"
FEATURES = ("pixels", "frames", "duration_s", "frame_pixels", "sampled_source_pixels", "sampled_frames", "sampled_pixels", "clip_frames",
            "clip_pixels", "clip_s", "kept_frames", "kept_pixels", "safety_frames")

INTERNVID = "https://github.com/OpenGVLab/InternVideo/tree/main/Data/InternVid"
PANDA = "https://github.com/snap-research/Panda-70M/blob/main/dataset_dataloading/README.md"
OPENVID = "https://arxiv.org/abs/2407.02371"
OPENVID_WDS = "https://huggingface.co/datasets/Dev-Jahn/OpenVid-1M-wds"

RESOLUTIONS = {"360p": (640, 360), "480p": (854, 480), "720p": (1280, 720), "1080p": (1920, 1080), "2160p": (3840, 2160)}
# InternVid: 85% 720P, 15% 360P-720P (split evenly between 360p and 480p: ASSUMED)
RES_MIX = {WEB: {"720p": 0.85, "480p": 0.075, "360p": 0.075},
           CLIPS: {"1080p": 433 / 1019, "720p": 1 - 433 / 1019},
           UHD: {"2160p": 1.0}}
FPS_MIX = {24: 0.20, 25: 0.15, 30: 0.50, 60: 0.15}
# InternVid's duration bins (seconds): 49% <= 5 min, 26% 5-10 min, 8% > 20 min, so 17% 10-20 min
DURATION_BINS = ((2.0, 300.0, 0.49), (300.0, 600.0, 0.26), (600.0, 1200.0, 0.17), (1200.0, 3600.0, 0.08))
INTERNVID_MEAN_S = 351.9
_PANDA_CLIPS, _PANDA_HOURS, _PANDA_SOURCES = 70_723_513, 167e3, 3_779_763
CLIP_MEAN_S = _PANDA_HOURS * 3600 / _PANDA_CLIPS
CLIP_SIGMA = 0.5
_INTERNVID_VIDEOS, _OPENVID_CLIPS = 7.0e6, 1_019_957
UHD_SHARE = 0.05
SHARES = {WEB: (1 - UHD_SHARE) * _INTERNVID_VIDEOS / (_INTERNVID_VIDEOS + _OPENVID_CLIPS),
          CLIPS: (1 - UHD_SHARE) * _OPENVID_CLIPS / (_INTERNVID_VIDEOS + _OPENVID_CLIPS), UHD: UHD_SHARE}
SHARD_ITEMS = round(1_018_957 / 3_484)
MEAN_BLOCK_ITEMS = {s: corpus_model.mean_block_items(q, SHARD_ITEMS) for s, q in SHARES.items()}
SAMPLE_FPS, SAMPLE_PIXELS = 2.0, 480 * 270
# InternVid: 234M clips from 7M videos; the corpus profile's scenes splits each video into this many clips
CLIPS_PER_VIDEO = 234e6 / 7e6
# profiles/video.json: kept / clip frames over its three regimes
KEPT_SHARE = (5.0 + 16.897435897435898 + 4.75) / (5.875 + 17.974358974358974 + 5.333333333333333)
SAFETY_FRAMES = 4.0

FIGURES: tuple[Figure, ...] = (
    Figure("source video duration, share <= 5 min", 0.49, PUBLISHED, INTERNVID,
           "'Almost half (49%) of the videos are five minutes or less, while a quarter (26%) fall between five and ten "
           "minutes. Only 8% of the videos are over 20 minutes long.' (so 17% 10-20 min)"),
    Figure("source video duration, mean (s)", INTERNVID_MEAN_S, PUBLISHED, INTERNVID,
           "'every video lasts 351.9s on average'; NOT reproduced: the published bins put at least 276 s of the mean in the "
           "three upper bins at their lower edges, and log-uniform bins give ~470 s (the bins are kept, the mean is not)"),
    Figure("source video duration, bin edges", 3600.0, ASSUMED, "",
           "within a bin durations are log-uniform; the open bins are closed at 2 s and 3600 s"),
    Figure("web resolution mix (720p share)", 0.85, PUBLISHED, INTERNVID,
           "'85% were high-resolution (720P), while the remaining 15% had lower resolutions ranging from 360P to 720P' "
           "(the 15% split evenly between 360p and 480p: ASSUMED)"),
    Figure("clip length, mean (s)", CLIP_MEAN_S, DERIVED, PANDA,
           f"Panda-70M training (full): 70,723,513 samples, 167 khrs: {CLIP_MEAN_S:.2f} s per clip (from 3,779,763 source "
           f"videos: {_PANDA_CLIPS / _PANDA_SOURCES:.1f} clips each)"),
    Figure("clip length, log-sd", CLIP_SIGMA, ASSUMED, INTERNVID,
           "not published; 0.5 gives P(<= 10 s) ~0.72 where InternVid reports 85% of its clips at 0-10 s (other corpus)"),
    Figure("clips resolution mix (1080p share)", 433 / 1019, DERIVED, OPENVID,
           "OpenVid-1M: over 1 million clips, of which 433K 1080p (OpenVidHD-0.4M); the rest ASSUMED 720p"),
    Figure("items: InternVid source videos", _INTERNVID_VIDEOS, PUBLISHED, INTERNVID,
           "'over 7 million videos lasting nearly 760K hours, yielding 234M video clips'"),
    Figure("items: OpenVid-1M clips", _OPENVID_CLIPS, PUBLISHED, OPENVID_WDS,
           "WebDataset repackaging of OpenVid-1M: 1,019,957 samples in 3,484 shards of ~2 GB (train) + 4 (val)"),
    Figure("4K (2160p) share of items", UHD_SHARE, ASSUMED, "",
           "none of InternVid, Panda-70M / HD-VILA-100M, OpenVid-1M publishes 4K content; 5% ASSUMED so the 360p-4K span the "
           "curation pipelines meet is in the stream"),
    Figure("frame rate mix", 30.0, ASSUMED, "",
           f"not published by these corpora; ASSUMED {dict(FPS_MIX)} (fps: share) for every source"),
    Figure("items per shard", SHARD_ITEMS, DERIVED, OPENVID_WDS, f"1,018,957 train samples / 3,484 shards = {SHARD_ITEMS}"),
    Figure("clips per video", CLIPS_PER_VIDEO, DERIVED, INTERNVID,
           f"234M clips / 7M videos = {CLIPS_PER_VIDEO:.1f}: the corpus profile's scenes selectivity (the measured profile "
           "splits its synthetic videos at 5.05). A fixed selectivity splits every item alike: a clips-source item (one "
           "8.5 s clip) becomes 33 rows carrying 1/33 of its frames each, so per-row fixed costs (embed's 0.4 ms per clip "
           "on GPU) are counted 33 times for those items; at 5.05 an hour-long source gave clips of 700 s "
           "whose text_detect batch (linear in kept pixels) needs more than an 8 GiB device"),
    Figure("kept share of clip frames", KEPT_SHARE, DERIVED, "",
           f"profiles/video.json: kept / clip frames {KEPT_SHARE:.3f} over its three regimes"),
)
SOURCES = corpus_model.sources_of(FIGURES)

OUTSIDE_PROFILE = (
    "profiles/video.json was measured on 48 synthetic videos: the workload regimes (0.1-2.1 megapixels per frame at 8-12 fps, "
    "4-116 s) and a sweep of 360p, 720p, 1080p and 4K (0.23-8.3 MP) at 24, 30 and 60 fps, 1-4 s long. Decode seconds are "
    "fitted on source pixels, frames and the source pixels of the frames it keeps; decode memory on seconds of video plus "
    "the decoder's buffers for a batch's largest frame (a 4K batch's peak is in the model). Corpus videos are within the "
    "measured range per frame, but sources up to an hour long are extrapolated in frames and seconds (116 s measured). The "
    "later operators see 2 frames/s at 480 px whatever the source.")


def _durations(source: str, n: int, rng: np.random.Generator) -> np.ndarray:
    if source == CLIPS:
        return rng.lognormal(math.log(corpus_model.median_from_mean(CLIP_MEAN_S, CLIP_SIGMA)), CLIP_SIGMA, n)
    k = rng.choice(len(DURATION_BINS), size=n, p=[p for _, _, p in DURATION_BINS])
    lo = np.log([DURATION_BINS[i][0] for i in k])
    hi = np.log([DURATION_BINS[i][1] for i in k])
    return np.exp(lo + (hi - lo) * rng.random(n))


def _pick(mix: Mapping[Any, float], n: int, rng: np.random.Generator) -> list[Any]:
    keys = list(mix)
    return [keys[i] for i in rng.choice(len(keys), size=n, p=np.array([mix[k] for k in keys]) / sum(mix.values()))]


def draw(source: str, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Features of ``n`` videos of ``source``.

    Resolution from the source's mix, frame rate from a mix ASSUMED (none of these corpora publishes one),
    duration from InternVid's published duration bins (log-uniform within each bin) for ``web`` and ``uhd``,
    lognormal around Panda-70M's mean clip length for ``clips``. Features are the video profile's: ``frames`` =
    duration x fps, ``pixels`` = frames x width x height (what ``decode`` costs), ``frame_pixels`` = width x height
    (the decoder's frame buffers), ``sampled_source_pixels`` = sampled frames x width x height (each converted and
    downscaled), ``sampled_frames`` = duration x
    ``SAMPLE_FPS`` at ``SAMPLE_PIXELS`` each (the pipeline samples 2 frames/s scaled to 480 px on the long side,
    whatever the source resolution), per clip ``clip_*`` = the video's sampled frames over the profile's clips per
    video (the corpus profile's ``scenes`` splits at InternVid's clips per video, so a video's clip work is
    conserved, not its clip count), ``kept_*`` at the profile's measured kept share, ``safety_frames`` = at most 4."""
    if source not in SHARES:
        raise ValueError(f"unknown video source {source!r}; the model has {sorted(SHARES)}")
    wh = np.array([RESOLUTIONS[r] for r in _pick(RES_MIX[source], n, rng)], dtype=float)
    fps = np.array(_pick(FPS_MIX, n, rng), dtype=float)
    duration = np.round(_durations(source, n, rng), 2)
    frames = np.maximum(1.0, np.round(duration * fps))
    sampled = np.maximum(1.0, np.floor(duration * SAMPLE_FPS))
    clip_frames = sampled / CLIPS_PER_VIDEO
    kept = clip_frames * KEPT_SHARE
    size = wh[:, 0] * wh[:, 1]
    return {"pixels": frames * size, "frames": frames, "duration_s": duration, "frame_pixels": size, "sampled_source_pixels": sampled * size,
            "sampled_frames": sampled, "sampled_pixels": sampled * SAMPLE_PIXELS, "clip_frames": np.round(clip_frames, 3),
            "clip_pixels": np.round(clip_frames * SAMPLE_PIXELS), "clip_s": np.round(duration / CLIPS_PER_VIDEO, 3),
            "kept_frames": np.round(kept, 3), "kept_pixels": np.round(kept * SAMPLE_PIXELS),
            "safety_frames": np.minimum(np.round(kept, 3), SAFETY_FRAMES)}


def blocks(shards: int, seed: int) -> list[tuple[str, int]]:
    return corpus_model.arrange(SHARES, SHARD_ITEMS, shards, seed)


def rows(schedule: Sequence[tuple[str, int]], seed: int) -> Iterator[dict[str, Any]]:
    return corpus_model.rows(schedule, draw, seed)


def profile(base: PipelineProfile, seed: int = 0, sample: int = 20_000) -> PipelineProfile:
    """``base`` (the video profile) with each source's mean video, from a seeded sample, as its workloads."""
    from dataclasses import replace

    means = corpus_model.regime_means(list(rows([(s, sample) for s in SHARES], seed)), FEATURES)
    ops = tuple(replace(op, selectivity=CLIPS_PER_VIDEO) if op.name == "scenes" else op for op in base.operators)
    return replace(base, operators=ops, workloads=means)


def summary(sample: Mapping[str, np.ndarray], source: str) -> dict[str, float]:
    """The statistics the cited figures fix, measured on drawn features of one source."""
    d = sample["duration_s"]
    per_frame = sample["pixels"] / sample["frames"]
    out = {"duration_mean_s": float(d.mean()), "share_720p": float((per_frame == 1280 * 720).mean()),
           "share_1080p": float((per_frame == 1920 * 1080).mean()), "share_2160p": float((per_frame == 3840 * 2160).mean())}
    if source != CLIPS:
        out.update({"share_le_5min": float((d <= 300).mean()), "share_5_10min": float(((d > 300) & (d <= 600)).mean()),
                    "share_gt_20min": float((d > 1200).mean())})
    return out
