"""The fast cases of ``trident-flows bench faults``: a full or read-only output filesystem, adversarial
PDFs through the parser, and replicas or the runner SIGKILLed while a pipeline runs."""

from __future__ import annotations

import os
import random
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from trident_flows.bench import faults
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


def test_adversarial_pdfs_are_each_rejected_with_a_reason_or_parsed(tmp_path):
    from trident_flows.bench.faults_inputs import adversarial_pdfs
    from trident_flows.pipelines.documents import ParsePdf, pdf_rows
    from trident_flows.pipelines.synth_documents import generate
    from trident_flows.runtime.spec import ERROR, rows_to_batch
    from trident_flows.scheduler.types import OpConfig

    generate(tmp_path / "good", n=1, broken=0.0, duplicates=0.0, seed=1)
    kinds = adversarial_pdfs(tmp_path / "adv", next((tmp_path / "good").glob("*.pdf")))
    rows = {r["id"]: r for r in pdf_rows(tmp_path / "adv")}
    assert set(rows) == set(kinds)
    out = ParsePdf(OpConfig.make(batch_size=8))(rows_to_batch(list(rows.values())))
    result = {str(i): (str(e), int(p), int(s)) for i, e, p, s in zip(out["id"], out[ERROR], out["pages"], out["scanned_pages"])}
    for name in ("adv-zero-byte", "adv-truncated", "adv-not-a-pdf"):
        assert result[name][0].startswith(("corrupt PDF", "unreadable PDF")), result[name]
    assert result["adv-encrypted"][0].startswith("encrypted PDF"), result["adv-encrypted"]
    # the bomb parses to one image-only page (OCR renders it at a fixed dpi, not at the image's size)
    assert result["adv-decompression-bomb"] == ("", 1, 1)
    assert result["adv-blank-pages"] == ("", faults.BLANK_PAGES, 0)


@pytest.mark.ray
def test_replicas_and_the_runner_sigkilled_lose_and_duplicate_nothing(ray_cluster, tmp_path):
    once = faults.case_replica_kill(tmp_path, 200, 1, random.Random(1))
    assert once.faults_injected == 1 and once.ok, once
    # recovery time is a benchmark figure (bench faults): a run may end before the killed replica's loss is noticed
    assert once.lost == 0 and once.duplicated == 0 and once.items_in == 200 and once.written + once.dead_lettered == 200
    runner = faults.case_runner_kill(tmp_path, 200)
    assert runner.faults_injected == 1 and runner.details["runner_died"], runner
    assert runner.ok and runner.lost == 0 and runner.duplicated == 0 and runner.items_in == 200, runner
    assert os.path.exists(tmp_path / "runner-kill" / resume.MANIFEST)
