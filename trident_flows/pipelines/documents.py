"""The document curation pipeline: ``build()`` (pipelines/__init__.py contract) and its run hooks.

Contract:
- Operators (``doc_rows.OPERATOR_NAMES``): ``parse``, ``ocr`` (``doc_parse``), ``langid``,
  ``quality``, ``dedup`` (``doc_filters``), ``embed`` (``doc_embed``). Each leaves marked rows
  untouched, never raises for one bad document, and sums its workload features over its rows.
- Quality knobs are user settings, execution knobs are tuned by policies; every row gets a
  ``cfg_<operator>_<knob>`` column per quality setting and engine/model used (``operator_specs``).
- ``build(input=..., synth=...)`` / ``build_rows(rows)`` build the pipeline over PDFs, generated
  documents or given rows; ``dedup_index(spec)`` / ``dedup_settings(spec)``: its shared
  near-duplicate index and settings.
- ``finish_run(spec, out_dir)`` settles near-duplicates found out of order once a run ends;
  ``resume_run(spec, out_dir)`` seeds the index from committed shards, so a resumed run keeps what
  an uninterrupted one keeps.
"""

from __future__ import annotations

import dataclasses
import os
import re
import uuid
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np

from trident_flows.core.types import CPU, GPU, ConfigSpace, KnobSpace, OpConfig
from trident_flows.pipelines.doc_embed import EmbedChunks
from trident_flows.pipelines.doc_filters import DetectLanguage, NearDuplicates, QualityFilter, minhash_values
from trident_flows.pipelines.doc_ocr import RAPIDOCR, TESSERACT
from trident_flows.pipelines.doc_parse import OcrPages, ParsePdf
from trident_flows.pipelines.doc_rows import live_rows
from trident_flows.pipelines.quality import apply_quality
from trident_flows.runtime.spec import DROP, ID, Batch, OperatorSpec, PipelineSpec


def pdf_rows(directory: Path) -> list[dict[str, Any]]:
    """One input row per PDF file of ``directory`` (sorted), id = file stem."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"input {directory} is not a directory of PDF files")
    files = sorted(p for p in directory.iterdir() if p.suffix.lower() == ".pdf")
    if not files:
        raise ValueError(f"input directory {directory} holds no *.pdf files")
    return [{"id": p.stem, "path": str(p.resolve())} for p in files]


def synth_corpus(work_dir: Path, n: int, seed: int, regimes: str | None) -> Path:
    """Generate (or reuse, if already there) a synthetic corpus under ``work_dir``."""
    from trident_flows.pipelines.synth_documents import generate

    tag = re.sub(r"[^A-Za-z0-9]+", "_", regimes or "default")
    directory = Path(work_dir) / f"documents-n{n}-seed{seed}-{tag}"
    if not (directory / "manifest.parquet").exists():
        generate(directory, n=n, regimes=regimes, seed=seed)
    return directory


def ocr_space(engine: str) -> ConfigSpace:
    """Where and how the ``ocr`` operator may run: tesseract on CPUs only; RapidOCR on a CPU or a GPU."""
    devices = (CPU, GPU) if engine == RAPIDOCR else (CPU,)
    resources = ((CPU, (1.0, 0.0)), (GPU, (1.0, 1.0))) if engine == RAPIDOCR else ((CPU, (1.0, 0.0)),)
    return ConfigSpace(devices=devices, batch_size_min=1, batch_size_max=16, resources=resources)


def operator_specs(index_name: str = "unnamed", ocr_engine: str = TESSERACT) -> tuple[OperatorSpec, ...]:
    """The six operators with their initial configs and search spaces (execution knobs only:
    quality knobs are constructor params, see ``trident_flows.pipelines.quality``); ``ocr_engine``
    is the OCR engine's name, given to ``ocr`` as its ``engine`` setting."""
    cpu_only = ((CPU, (1.0, 0.0)),)
    return (
        OperatorSpec("parse", ParsePdf, OpConfig.make(batch_size=8), replicas=1, max_replicas=16,
                     space=ConfigSpace(devices=(CPU,), batch_size_min=1, batch_size_max=64, resources=cpu_only)),
        OperatorSpec("ocr", OcrPages, OpConfig.make(batch_size=2), replicas=1, max_replicas=32,
                     params={} if ocr_engine == TESSERACT else {"engine": ocr_engine}, space=ocr_space(ocr_engine)),
        OperatorSpec("langid", DetectLanguage, OpConfig.make(batch_size=32), max_replicas=8,
                     space=ConfigSpace(devices=(CPU,), batch_size_min=1, batch_size_max=128, resources=cpu_only)),
        OperatorSpec("quality", QualityFilter, OpConfig.make(batch_size=32), max_replicas=8,
                     space=ConfigSpace(devices=(CPU,), batch_size_min=1, batch_size_max=128, resources=cpu_only)),
        OperatorSpec("dedup", NearDuplicates, OpConfig.make(batch_size=16), params={"index_name": index_name}, max_replicas=8,
                     run_params=frozenset({"index_name"}), space=ConfigSpace(devices=(CPU,), batch_size_min=1, batch_size_max=64, resources=cpu_only)),
        OperatorSpec("embed", EmbedChunks, OpConfig.make(batch_size=8, encode_batch=32), max_replicas=16,
                     space=ConfigSpace(devices=(CPU, GPU), batch_size_min=1, batch_size_max=64,
                                       knobs=(KnobSpace("encode_batch", "categorical", choices=(16, 32, 64, 128)),),
                                       resources=((CPU, (1.0, 0.0)), (GPU, (1.0, 1.0))))),
    )


def build(*, input: Path | None = None, synth: int | None = None, seed: int = 0, regimes: str | None = None,
          work_dir: Path = Path("work"), quality: Mapping[str, Any] | None = None, tune: Mapping[str, Any] | None = None) -> PipelineSpec:
    """The document pipeline over a directory of PDFs, or over ``synth`` generated documents.

    ``quality`` sets quality knobs (``{"ocr.dpi": 200}``); ``tune`` marks some tunable with a range
    (``{"ocr.dpi": "100..300"}``); see ``trident_flows.pipelines.quality``."""
    if input is not None:
        rows = pdf_rows(Path(input))
    elif synth is not None:
        rows = pdf_rows(synth_corpus(Path(work_dir), synth, seed, regimes))
    else:
        raise ValueError("the documents pipeline needs input=<directory of PDFs> or synth=<number of documents>")
    return build_rows(rows, quality=quality, tune=tune)


def build_rows(rows: list[dict[str, Any]], *, quality: Mapping[str, Any] | None = None, tune: Mapping[str, Any] | None = None) -> PipelineSpec:
    """The document pipeline over given input rows (``id``, ``path`` of a local PDF), e.g. a corpus run's new files."""
    index_name = f"docs-{uuid.uuid4().hex[:12]}"

    def source() -> Iterator[dict[str, Any]]:
        return iter([dict(r) for r in rows])

    specs = apply_quality("documents", operator_specs(index_name), quality, tune)
    # the OCR engine chosen for the run decides where OCR may run (RapidOCR: CPU or GPU)
    engine = str(next(s for s in specs if s.name == "ocr").params.get("engine", TESSERACT))
    specs = tuple(dataclasses.replace(s, space=dataclasses.replace(ocr_space(engine), knobs=s.space.knobs)) if s.name == "ocr" else s
                  for s in specs)
    return PipelineSpec("documents", specs, source, items=len(rows))


def dedup_index_name(spec: PipelineSpec) -> str:
    """The name of the shared dedup index of a built spec (to release it after a run)."""
    return str(spec.operator("dedup").params["index_name"])


# columns only the operators after dedup write: a row dedup marks never gets them
_AFTER_DEDUP = ("chunks", "embeddings", *(f"cfg_embed_{k}" for k in ("chunk_words", "model")))


def dedup_settings(spec: PipelineSpec) -> tuple[float, int]:
    """The dedup operator's ``threshold`` and ``num_perm`` in a built spec."""
    dedup = spec.operator("dedup")
    knobs = {k.name: k.default for k in NearDuplicates.QUALITY_KNOBS}
    knobs.update({k: v for k, v in dedup.params.items() if k in knobs})
    return float(knobs["threshold"]), int(knobs["num_perm"])


def dedup_index(spec: PipelineSpec) -> Any:
    """The handle of a built spec's shared near-duplicate index (doc_dedup.shared_index)."""
    from trident_flows.pipelines.doc_dedup import shared_index

    return shared_index(dedup_index_name(spec), *dedup_settings(spec))


def apply_revisions(table: Any, revisions: Mapping[str, str]) -> tuple[Any, int]:
    """``table`` (Arrow, output rows) with the rows of ``revisions``' ids marked ``_drop = "duplicate-of:<id>"``,
    ``duplicate_of`` set and their embedding columns cleared (what an in-order run writes); and how many rows changed."""
    import pyarrow as pa
    import pyarrow.compute as pc

    ids = table.column(ID).to_pylist()
    if not any(i in revisions for i in ids):
        return table, 0
    mask = pa.array([i in revisions for i in ids])
    replace = {DROP: [f"duplicate-of:{revisions[i]}" if i in revisions else None for i in ids],
               "duplicate_of": [revisions.get(i) for i in ids]}
    for name, values in replace.items():
        column = pa.array(values, pa.string())
        old = table.column(name).cast(pa.string()) if name in table.column_names else pa.nulls(len(ids), pa.string())
        merged = pc.if_else(mask, column, old)
        table = table.set_column(table.column_names.index(name), name, merged) if name in table.column_names else table.append_column(name, merged)
    for name in (c for c in _AFTER_DEDUP if c in table.column_names):
        column = table.column(name)
        table = table.set_column(table.column_names.index(name), name, pc.if_else(mask, pa.nulls(len(ids), column.type), column))
    return table, int(sum(mask.to_pylist()))


def finish_run(spec: PipelineSpec, out_dir: Path) -> dict[str, int]:
    """Apply the dedup index's revisions to a finished run's committed output (see doc_dedup).

    A document kept while streaming whose smaller-id near-duplicate arrived later is marked
    ``_drop = "duplicate-of:<id>"`` with ``duplicate_of`` set, and its embedding columns are
    cleared, so the data table is what an in-order run writes (``apply_revisions``). Each changed
    shard file is rewritten atomically. Returns ``{"revised": ids revised, "rows_changed": rows rewritten}``.
    """
    import pyarrow.parquet as pq

    revisions = dedup_index(spec).revisions()
    changed = 0
    for path in sorted((Path(out_dir) / "data").glob("*.parquet")) if revisions else []:
        table, rows = apply_revisions(pq.read_table(path), revisions)
        if not rows:
            continue
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, path)
        changed += rows
    return {"revised": len(revisions), "rows_changed": changed}


def _reached_dedup(drop: str | None) -> bool:
    """Whether a data row went through dedup (kept, or marked a near-duplicate), not dropped before it."""
    return not drop or drop.startswith("duplicate-of:")


def _dead_lettered_after_dedup(spec: PipelineSpec, out_dir: Path) -> set[str]:
    """Ids the committed dead-letter table holds from an operator after dedup (they went through it, kept)."""
    import pyarrow.parquet as pq

    names = [op.name for op in spec.operators]
    after = set(names[names.index("dedup") + 1:])
    found: set[str] = set()
    for path in sorted((Path(out_dir) / "dead_letter").glob("*.parquet")):
        found.update(str(r[ID]) for r in pq.read_table(path, columns=[ID, "operator"]).to_pylist() if r["operator"] in after)
    return found


def _texts_again(spec: PipelineSpec, ids: set[str]) -> list[tuple[str, str]]:
    """``(id, text)`` of the input documents ``ids`` as dedup saw them: the operators before it, run again in
    this process (deterministic: the same text). Only documents none of them marks are returned."""
    from trident_flows.runtime.spec import rows_to_batch

    rows = [r for r in spec.source() if str(r[ID]) in ids]
    if not rows:
        return []
    names = [op.name for op in spec.operators]
    batch = rows_to_batch(rows)
    for op in spec.operators[:names.index("dedup")]:
        batch = op.build()(batch)
    return [(str(batch[ID][i]), str(batch["text"][i])) for i in live_rows(batch)]


def resume_run(spec: PipelineSpec, out_dir: Path) -> dict[str, int]:
    """Seed the run's near-duplicate index with the documents of ``out_dir``'s committed shards
    (call it after ``resume.open_run``, which leaves only committed shards' files, and before any
    replica starts). Each committed row that went through dedup is inserted with the answer its row
    holds (doc_dedup ``LshIndex.seed``): a pending document that near-duplicates a committed one is
    dropped, and a committed one whose smaller-id match is pending is revised by ``finish_run``.
    A document dead-lettered by an operator after dedup (embed) went through it too, kept, but its
    text is not in the output: it is read again by the operators before dedup, in this process.
    Returns ``{"seeded": documents inserted, "reparsed": documents read again}``."""
    import pyarrow.parquet as pq

    num_perm = dedup_settings(spec)[1]
    index = dedup_index(spec)
    seeded = 0
    for path in sorted((Path(out_dir) / "data").glob("*.parquet")):
        names = set(pq.read_schema(path).names)
        if "text" not in names:  # a shard whose every row was dead-lettered or dropped before ocr
            continue
        table = pq.read_table(path, columns=[c for c in (ID, "text", DROP, "duplicate_of") if c in names]).to_pylist()
        items = [(str(row[ID]), minhash_values(str(row["text"]), num_perm), str(row.get("duplicate_of") or ""))
                 for row in table if _reached_dedup(row.get(DROP))]
        seeded += index.seed(items) if items else 0
    again = _texts_again(spec, _dead_lettered_after_dedup(spec, out_dir))
    if again:
        seeded += index.seed([(key, minhash_values(text, num_perm), "") for key, text in again])
    return {"seeded": seeded, "reparsed": len(again)}


def run_in_process(spec: PipelineSpec, batch_size: int = 8) -> Batch:
    """Chain every operator in this process over the whole source (tests, profiling): one output batch."""
    from trident_flows.runtime.spec import rows_to_batch

    ops = [op.build() for op in spec.operators]
    rows = list(spec.source())
    parts: list[Batch] = []
    for start in range(0, len(rows), batch_size):
        batch = rows_to_batch(rows[start:start + batch_size])
        for op in ops:
            batch = op(batch)
        parts.append(batch)
    return {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
