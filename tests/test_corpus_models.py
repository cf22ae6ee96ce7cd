"""The corpus models: their draws reproduce the cited figures, their blocks follow the stated derivation, and their
rows run through the simulator without loss."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from benchmarks.corpus_workloads import CORPORA, corpus_workload
from trident_flows.core.types import ClusterSpec
from trident_flows.pipelines import corpus_documents as docs
from trident_flows.pipelines import corpus_model
from trident_flows.pipelines import corpus_video as video
from trident_flows.pipelines.corpus_model import ASSUMED, DERIVED, PUBLISHED
from trident_flows.runtime.costmodel import PipelineProfile
from trident_flows.sim.runner import SimRunner
from trident_flows.sim.static_search import search_static


def test_every_figure_is_labelled_and_a_published_one_names_its_page():
    for model in (docs, video):
        assert model.SOURCES and all(s.startswith("https://") for s in model.SOURCES)
        assert set(model.SOURCES) == {f.source for f in model.FIGURES if f.source}
        for f in model.FIGURES:
            assert f.kind in (PUBLISHED, DERIVED, ASSUMED) and f.says
            if f.kind == PUBLISHED:
                assert f.source.startswith("https://")
    with pytest.raises(ValueError, match="URL"):
        corpus_model.Figure("x", 1.0, PUBLISHED, "somewhere", "says")


def test_documents_reproduce_their_cited_statistics():
    web = docs.summary(docs.draw(docs.WEB, 200_000, np.random.default_rng(1)))
    assert web["pages_mean"] == pytest.approx(18.6 / 2.16, rel=0.05)  # PDFA: 18.6M pages over 2.16M documents
    assert web["chars_p50"] == pytest.approx(8_775, rel=0.03)  # FinePDFs eng sample quantiles
    assert web["chars_p90"] == pytest.approx(102_657, rel=0.05)
    assert web["chars_p99"] == pytest.approx(707_362, rel=0.15)  # the check the fit was not made on
    assert web["bytes_mean"] == pytest.approx(8e12 / 7_932_878, rel=0.05)  # SafeDocs: ~8 TB over ~7.9M PDFs
    assert web["over_1mib"] == pytest.approx(2_020_913 / 8_410_703, abs=0.01)  # truncated by Common Crawl at 1 MB
    assert web["scanned_share"] == pytest.approx(docs.WEB_SCANNED_SHARE, abs=0.005)
    archive = docs.summary(docs.draw(docs.ARCHIVE, 5_000, np.random.default_rng(2)))
    assert archive["scanned_share"] == 1.0


def test_video_reproduces_its_cited_statistics():
    rng = np.random.default_rng(3)
    web = video.summary(video.draw(video.WEB, 100_000, rng), video.WEB)
    # InternVid: 49% <= 5 min, 26% 5-10 min, 8% > 20 min; 85% 720P
    assert web["share_le_5min"] == pytest.approx(0.49, abs=0.01)
    assert web["share_5_10min"] == pytest.approx(0.26, abs=0.01)
    assert web["share_gt_20min"] == pytest.approx(0.08, abs=0.01)
    assert web["share_720p"] == pytest.approx(0.85, abs=0.01)
    clips = video.summary(video.draw(video.CLIPS, 100_000, rng), video.CLIPS)
    assert clips["duration_mean_s"] == pytest.approx(167e3 * 3600 / 70_723_513, rel=0.02)  # Panda-70M mean clip
    assert clips["share_1080p"] == pytest.approx(433 / 1019, abs=0.01)  # OpenVid-1M: 433K 1080p
    uhd = video.summary(video.draw(video.UHD, 2_000, rng), video.UHD)
    assert uhd["share_2160p"] == 1.0


def test_video_features_follow_the_pipelines_sampling_and_the_corpus_profile_splits_at_internvids_clips():
    f = video.draw(video.WEB, 1_000, np.random.default_rng(4))
    assert np.allclose(f["sampled_pixels"], f["sampled_frames"] * 480 * 270)
    assert np.allclose(f["clip_frames"] * video.CLIPS_PER_VIDEO, f["sampled_frames"], rtol=1e-3, atol=0.02)
    assert (f["safety_frames"] <= 4).all() and (f["kept_frames"] <= f["clip_frames"]).all()
    prof = video.profile(PipelineProfile.load("video"), sample=500)
    assert prof.operator("scenes").selectivity == pytest.approx(234 / 7)
    assert set(prof.workloads) == set(video.SHARES)


def test_block_lengths_follow_from_the_shares_and_the_shard_size():
    assert docs.ARCHIVE_SHARE == pytest.approx((17_474 + 9_989 + 9_997) / 270_250)
    assert docs.MEAN_BLOCK_ITEMS[docs.ARCHIVE] == pytest.approx(docs.SHARD_ITEMS / (1 - docs.ARCHIVE_SHARE))
    assert video.SHARD_ITEMS == 292 and video.MEAN_BLOCK_ITEMS[video.UHD] == pytest.approx(292 / 0.95)
    for model in (docs, video):
        blocks = model.blocks(20_000, seed=5)
        assert sum(n for _, n in blocks) == 20_000 * model.SHARD_ITEMS
        assert all(a[0] != b[0] for a, b in zip(blocks, blocks[1:]))  # consecutive shards of one source are one block
        for source, share in model.SHARES.items():
            mine = [n for s, n in blocks if s == source]
            assert np.mean(mine) == pytest.approx(corpus_model.mean_block_items(share, model.SHARD_ITEMS), rel=0.06)
            assert sum(mine) / (20_000 * model.SHARD_ITEMS) == pytest.approx(share, abs=0.01)


def test_rows_are_seeded_and_named_as_the_emulated_source_names_them():
    a = list(docs.rows([(docs.WEB, 3), (docs.ARCHIVE, 2)], seed=7))
    assert a == list(docs.rows([(docs.WEB, 3), (docs.ARCHIVE, 2)], seed=7))
    assert [r["id"] for r in a] == [f"item-{k:07d}" for k in range(5)]
    assert [r["regime"] for r in a] == ["web"] * 3 + ["archive"] * 2


@pytest.mark.parametrize("name,regimes", [("documents-corpus", "web:60,archive:15,web:20"),
                                          ("video-corpus", "clips:30,web:6,uhd:2,clips:10")])
def test_corpus_rows_run_through_the_simulator_without_loss(name, regimes):
    workload, stream = corpus_workload(name, quick=True)
    assert workload.sources == CORPORA[name].model.SOURCES
    stream = replace(stream, regimes=regimes)
    profile = workload.profile
    mean = {f: float(np.mean([v.get(f, 0.0) for v in profile.workloads.values()])) for f in next(iter(profile.workloads.values()))}
    config = search_static(profile, mean, cpus=16, gpus=2, device_memory_bytes=8 * 2**30, gpu_batches=(8, 16), cpu_batch=4)
    runner = SimRunner(stream.spec(profile, config, "test"), ClusterSpec.single_node(16, 2, gpu_memory_bytes=8 * 2**30))
    runner.start()
    while not runner.finished:
        runner.run_until(runner.now + 600.0)
    assert runner.inputs_done == stream.items and runner.inputs_dead == 0
