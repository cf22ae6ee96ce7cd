"""The fast cases of ``trident-flows bench faults``: a full or read-only output filesystem, adversarial
PDFs through the parser, and replicas or the runner SIGKILLed while a pipeline runs."""

from __future__ import annotations

import os
import random
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from benchmarks import faults
from trident_flows.runtime import resume
from trident_flows.runtime.sink import Sink, read_ids


@pytest.fixture
def small_fs(tmp_path):
    """A 2 MiB tmpfs of our own (needs root: mount)."""
    mount = tmp_path / "fs"
    why = faults._mount_tmpfs(mount, "2m")
    if why:
        pytest.skip(why)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _rows(shard: str, n: int) -> list[dict]:
    return [{"id": f"{shard}-{k}", "text": "x" * 100} for k in range(n)]


def _only_whole_parquet(out: Path) -> None:
    for sub in ("data", "dead_letter"):
        for p in (out / sub).iterdir():
            assert p.name.endswith(".parquet"), f"stray file {p}"
            pq.read_table(p)


def test_a_full_output_filesystem_fails_naming_the_path_and_leaves_only_whole_files(small_fs):
    shards = [resume.InputShard("shard-00000", tuple(_rows("a", 10))), resume.InputShard("shard-00001", tuple(_rows("b", 10)))]
    resume.open_run(small_fs, "p", shards)
    sink = Sink(small_fs)
    sink.write_part("shard-00000", _rows("a", 10), [])
    sink.commit("shard-00000")
    filler = small_fs / "filler.bin"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass
    with pytest.raises(OSError, match=f"cannot write {small_fs}.*free space on that filesystem"):
        sink.write_part("shard-00001", _rows("b", 2000), [])
        sink.commit("shard-00001")
    _only_whole_parquet(small_fs)
    filler.unlink()
    plan = resume.open_run(small_fs, "p", shards)
    assert [s.shard_id for s in plan.pending] == ["shard-00001"]
    assert sorted(read_ids(small_fs)[0]) == sorted(r["id"] for r in _rows("a", 10))


def test_a_read_only_output_filesystem_fails_naming_the_path(small_fs):
    shards = [resume.InputShard("shard-00000", tuple(_rows("a", 5)))]
    resume.open_run(small_fs, "p", shards)
    sink = Sink(small_fs)
    sink.write_part("shard-00000", _rows("a", 5), [])
    subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)
    try:
        with pytest.raises(OSError, match=f"cannot write {small_fs}/.*Read-only file system.*make it writable"):
            sink.commit("shard-00000")
        _only_whole_parquet(small_fs)
        assert resume.committed_shards(small_fs) == set()
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(small_fs)], check=True)


def test_adversarial_pdfs_are_each_dead_lettered_with_their_reason_before_anything_is_decoded(tmp_path):
    from benchmarks.faults_inputs import adversarial_pdfs
    from trident_flows.core.types import OpConfig
    from trident_flows.pipelines.doc_parse import ParsePdf
    from trident_flows.pipelines.documents import pdf_rows
    from trident_flows.pipelines.synth_documents import generate
    from trident_flows.runtime.spec import ERROR, rows_to_batch

    generate(tmp_path / "good", n=1, broken=0.0, duplicates=0.0, seed=1)
    kinds = adversarial_pdfs(tmp_path / "adv", next((tmp_path / "good").glob("*.pdf")))
    rows = {r["id"]: r for r in pdf_rows(tmp_path / "adv")}
    assert set(rows) == set(kinds)
    out = ParsePdf(OpConfig.make(batch_size=8))(rows_to_batch(list(rows.values())))
    result = {str(i): str(e) for i, e in zip(out["id"], out[ERROR])}
    for name in ("adv-zero-byte", "adv-truncated", "adv-not-a-pdf"):
        assert result[name].startswith(("corrupt PDF", "unreadable PDF")), result[name]
    assert result["adv-encrypted"].startswith("encrypted PDF"), result["adv-encrypted"]
    assert result["adv-decompression-bomb"].startswith(
        f"decompression bomb: page 1 image would be {faults.BOMB_PIXELS ** 2 / 1e6:.0f} megapixels "
        f"({faults.BOMB_PIXELS}x{faults.BOMB_PIXELS}) decoded from a "), result["adv-decompression-bomb"]
    assert "limit 100; raise the quality setting parse.max_image_megapixels" in result["adv-decompression-bomb"]
    assert result["adv-blank-pages"] == (f"PDF has {faults.BLANK_PAGES} pages, limit 2000; raise the quality setting "
                                         "parse.max_pages to accept it")
    # the limits are the user's: raised, the same files parse
    lenient = ParsePdf(OpConfig.make(batch_size=8), max_pages=faults.BLANK_PAGES, max_image_megapixels=200.0)
    out = lenient(rows_to_batch([rows["adv-decompression-bomb"], rows["adv-blank-pages"]]))
    assert list(out[ERROR]) == ["", ""] and list(out["pages"]) == [1, faults.BLANK_PAGES]


def test_ocr_refuses_a_page_that_would_render_beyond_its_limit(tmp_path):
    from fpdf import FPDF

    from trident_flows.core.types import OpConfig
    from trident_flows.pipelines.doc_parse import OcrPages
    from trident_flows.runtime.spec import ERROR, rows_to_batch

    pdf = FPDF(format=(5000, 5000))  # a page of 5 m square (mm); PDF readers cap it at 200 inches: 872 megapixels at 150 dpi
    pdf.add_page()
    (tmp_path / "huge.pdf").write_bytes(bytes(pdf.output()))
    row = {"id": "huge", "path": str(tmp_path / "huge.pdf"), "page_texts": [""], "scanned_page_numbers": [0]}
    out = OcrPages(OpConfig.make())(rows_to_batch([row]))
    assert out[ERROR][0] == ("OCR failed on page 1: page image would be 872 megapixels at 150 dpi, limit 150; "
                             "raise the quality setting ocr.max_page_megapixels to accept it"), out[ERROR][0]


def test_a_video_with_a_broken_stream_is_dead_lettered_with_its_reason(tmp_path):
    from benchmarks.faults_inputs import broken_stream_video
    from trident_flows.core.types import OpConfig
    from trident_flows.pipelines import synth_video
    from trident_flows.pipelines.video_decode import Decode, probe
    from trident_flows.runtime.spec import ERROR, ID, rows_to_batch

    good = synth_video.generate(tmp_path, n=1, regimes="tiny:1", broken=0.0, seed=3, cache_dir=None).path[0]
    (tmp_path / "broken-stream.mp4").write_bytes(broken_stream_video())
    assert probe(tmp_path / "broken-stream.mp4")["frames"] > 0  # the container is intact: it looks like a video
    out = Decode(OpConfig.make())(rows_to_batch([{ID: "good", "path": good}, {ID: "broken", "path": str(tmp_path / "broken-stream.mp4")}]))
    assert out[ERROR][0] == "" and len(out["frames"][0]) > 0
    assert out[ERROR][1].startswith("broken video: corrupt video stream"), out[ERROR][1]


# Items per case: enough for a run of 20-30 s on 2 cores, so the kill (2 s after the first item, or after the first
# of 30 shards is committed) lands mid-run; the benchmark (bench faults) runs the same cases on 200 and 400 items.
FAULT_ITEMS = 60


# `make test-slow`: two runs of the benchmark's cases (~1.5 min). `make test` keeps both faults, cheaper:
# test_runtime_stream.py::test_replica_killed_mid_batch_loses_nothing kills a replica mid-batch, and
# test_resume.py's interrupted-run test SIGKILLs the runner of `trident-flows run`, which resumes without loss.
@pytest.mark.slow
@pytest.mark.ray
def test_replicas_and_the_runner_sigkilled_lose_and_duplicate_nothing(ray_cluster, tmp_path):
    n = FAULT_ITEMS
    once = faults.case_replica_kill(tmp_path, n, 1, random.Random(1))
    assert once.faults_injected == 1 and once.ok, once
    # recovery time is a benchmark figure (bench faults): a run may end before the killed replica's loss is noticed
    assert once.lost == 0 and once.duplicated == 0 and once.items_in == n and once.written + once.dead_lettered == n
    runner = faults.case_runner_kill(tmp_path, n)
    assert runner.faults_injected == 1 and runner.details["runner_died"], runner
    assert 0 < runner.details["shards_committed_before_rerun"] < 30, runner  # killed mid-run: the re-run resumed
    assert runner.ok and runner.lost == 0 and runner.duplicated == 0 and runner.items_in == n, runner
    assert os.path.exists(tmp_path / "runner-kill" / resume.MANIFEST)
