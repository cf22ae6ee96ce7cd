"""The real video pipeline on a tiny synthetic corpus: generator, operators chained in-process."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from trident_flows.core.types import OpConfig
from trident_flows.pipelines import synth_video
from trident_flows.pipelines.video import build
from trident_flows.pipelines.video_decode import Decode
from trident_flows.runtime.spec import DROP, ERROR, ID, SOURCE_ID, rows_to_batch

SAMPLE_FPS = 2.0


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Four tiny videos (160x120 / 320x240, 3-5 s), one of them broken (truncated)."""
    out = tmp_path_factory.mktemp("video-corpus")
    manifest = synth_video.generate(out, n=4, regimes="tiny:4", broken=0.25, seed=3, cache_dir=None)
    return out, manifest


@pytest.fixture(scope="module")
def curated(corpus, tmp_path_factory):
    """Every operator of the pipeline, chained in this process (no Ray)."""
    out, manifest = corpus
    spec = build(input=out, seed=3, work_dir=tmp_path_factory.mktemp("work"), quality={"decode.sample_fps": SAMPLE_FPS})
    batch = rows_to_batch(spec.source())
    features = {}
    for op in spec.operators:
        instance = op.build()
        features[op.name] = instance.workload_features(batch)
        batch = instance(batch)
    return manifest, pd.DataFrame({k: list(v) for k, v in batch.items()}), features


def test_generator_is_deterministic_by_seed(tmp_path):
    a = synth_video.generate(tmp_path / "a", n=2, regimes="tiny:2", broken=0.0, seed=5, cache_dir=None)
    b = synth_video.generate(tmp_path / "b", n=2, regimes="tiny:2", broken=0.0, seed=5, cache_dir=None)
    c = synth_video.generate(tmp_path / "c", n=2, regimes="tiny:2", broken=0.0, seed=6, cache_dir=None)
    cols = ["id", "width", "height", "fps", "duration_s", "kind", "cache_key"]
    pd.testing.assert_frame_equal(a[cols], b[cols])
    assert [list(x) for x in a.scene_cuts_s] == [list(x) for x in b.scene_cuts_s]
    for pa, pb in zip(a.path, b.path):
        assert open(pa, "rb").read() == open(pb, "rb").read()
    assert list(a.cache_key) != list(c.cache_key)
    assert open(a.path[0], "rb").read() != open(c.path[0], "rb").read()
    assert pd.read_parquet(tmp_path / "a" / "manifest.parquet")["id"].tolist() == a["id"].tolist()


def test_generator_reuses_cached_files(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    first = synth_video.generate(tmp_path / "one", n=1, regimes="tiny:1", broken=0.0, seed=9, cache_dir=cache)
    monkeypatch.setattr(synth_video, "encode", lambda *a, **k: pytest.fail("a cached video was encoded again"))
    second = synth_video.generate(tmp_path / "two", n=1, regimes="tiny:1", broken=0.0, seed=9, cache_dir=cache)
    assert open(first.path[0], "rb").read() == open(second.path[0], "rb").read()


def test_regime_schedule_follows_blocks_and_rejects_unknown_names():
    plans = synth_video.plan_videos(n=5, regimes="small:2,hd:1", broken=0.0, seed=0)
    assert [p.regime for p in plans] == ["small", "small", "hd", "small", "small"]
    assert all(p.height <= 360 for p in plans if p.regime == "small") and plans[2].height >= 720
    with pytest.raises(ValueError, match="unknown regime 'huge'"):
        synth_video.parse_schedule("small:2,huge:1")
    with pytest.raises(ValueError, match="positive count"):
        synth_video.parse_schedule("small")


def test_every_broken_kind_is_dead_lettered_with_its_reason(tmp_path):
    manifest = synth_video.generate(tmp_path, n=4, regimes="tiny:4", broken=1.0, seed=1, cache_dir=None)
    assert sorted(manifest.kind) == sorted(f"broken:{k}" for k in synth_video.BROKEN_KINDS)
    out = Decode(OpConfig.make())(rows_to_batch({ID: r.id, "path": r.path} for r in manifest.itertuples()))
    reasons = dict(zip(out[ID], out[ERROR]))
    for row in manifest.itertuples():
        assert reasons[row.id].startswith("broken video: "), (row.kind, reasons[row.id])
    by_kind = {row.kind: reasons[row.id] for row in manifest.itertuples()}
    assert "still image" in by_kind["broken:png-renamed"]
    assert "no video stream" in by_kind["broken:zero-frames"]
    assert "cannot open container" in by_kind["broken:random-bytes"]


@pytest.mark.models
def test_known_scene_cuts_are_found_within_one_sampled_frame(curated):
    manifest, clips, _ = curated
    tolerance = 1.0 / SAMPLE_FPS
    for video in manifest[manifest.kind == "ok"].itertuples():
        starts = sorted(clips.loc[clips[SOURCE_ID] == video.id, "clip_start_s"])[1:]
        assert len(starts) == len(video.scene_cuts_s), (video.id, starts, list(video.scene_cuts_s))
        for found, cut in zip(starts, video.scene_cuts_s):
            assert cut <= found <= cut + tolerance + 1e-6, (video.id, found, cut)


@pytest.mark.models
def test_clips_with_overlaid_text_have_a_higher_text_share(curated):
    manifest, clips, _ = curated
    ok = clips[clips[ERROR] == ""]
    segments = dict(zip(manifest.id, manifest.text_segments_s))

    def has_text(row) -> bool:
        mid = (row.clip_start_s + row.clip_end_s) / 2
        return any(a <= mid < b for a, b in segments[row.source_id])

    flags = np.array([has_text(r) for r in ok.itertuples()])
    assert flags.any() and (~flags).any(), "the test corpus must hold clips with and without captions"
    assert ok.text_share[flags].min() > ok.text_share[~flags].max()


@pytest.mark.models
def test_every_input_is_accounted_for_once(curated):
    manifest, clips, _ = curated
    errors = clips[clips[ERROR] != ""]
    written = clips[clips[ERROR] == ""]
    assert set(errors[ID]) == set(manifest.id[manifest.kind != "ok"])
    assert errors[ERROR].str.startswith("broken video: ").all()
    assert set(written[SOURCE_ID]) | set(errors[ID]) == set(manifest.id)
    assert not set(written[SOURCE_ID]) & set(errors[ID])
    assert clips[ID].is_unique
    for vid, group in written.groupby(SOURCE_ID):
        assert list(group[ID]) == [f"{vid}/{k}" for k in range(len(group))]
        assert group.clip_start_s.iloc[0] == 0.0 and (group.clip_start_s.diff().dropna() > 0).all()
    assert (written[DROP] == "").all()


@pytest.mark.models
def test_sink_rows_are_compact_and_embedded(curated):
    _, clips, features = curated
    written = clips[clips[ERROR] == ""]
    assert "frames" not in clips.columns and "frame_times" not in clips.columns
    vectors = np.stack(written.embedding.to_list())
    assert vectors.shape == (len(written), 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    assert written.description.str.contains("second").all()
    assert ((written.safety_score >= 0) & (written.safety_score <= 1)).all() and (written.motion > 0).all()
    assert features["decode"]["pixels"] > features["scenes"]["sampled_pixels"] > features["text_detect"]["kept_pixels"] > 0
    assert features["scenes"]["sampled_frames"] == features["dedup_frames"]["clip_frames"] >= features["text_detect"]["kept_frames"] > 0
    assert features["motion"]["clip_s"] == pytest.approx(features["decode"]["duration_s"])


def test_build_names_what_is_wrong_with_its_input(tmp_path):
    with pytest.raises(ValueError, match="is not a directory"):
        build(input=tmp_path / "missing")
    with pytest.raises(ValueError, match="no video files"):
        build(input=tmp_path)
    with pytest.raises(ValueError, match="--synth N"):
        build()
