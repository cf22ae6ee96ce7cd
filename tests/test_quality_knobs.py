"""Quality knobs are the user's, execution knobs the scheduler's; near-duplicate removal ignores arrival order."""

from __future__ import annotations

import random
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trident_flows.core.types import KnobRole, OpConfig
from trident_flows.pipelines import PIPELINES, build_pipeline, doc_filters, doc_parse, documents, video, video_decode
from trident_flows.pipelines.doc_dedup import LshIndex, release_index, shared_index
from trident_flows.pipelines.doc_text import paragraph
from trident_flows.pipelines.quality import TUNABLE, apply_quality, declared, output_note, parse_settings, quality_settings, tunable_quality
from trident_flows.runtime.spec import PipelineSpec

REAL = {"documents": documents.operator_specs, "video": video.operator_specs}


def _shipped_specs(name: str):
    if name in REAL:
        return REAL[name]()
    return build_pipeline(name, synth=20).operators


@pytest.mark.parametrize("pipeline", sorted(PIPELINES))
def test_every_knob_in_every_shipped_search_space_is_an_execution_knob(pipeline):
    for op in _shipped_specs(pipeline):
        quality, execution = declared(op.cls)
        quality_names = {k.name for k in quality}
        for knob in op.space.knobs:
            assert knob.role is KnobRole.EXECUTION, f"{pipeline}.{op.name}: knob {knob.name} is marked {knob.role.value}"
            assert knob.name in execution and knob.name not in quality_names, f"{pipeline}.{op.name}: {knob.name} is not declared as an execution knob"
        for name in op.config.knob_dict:  # the starting config holds execution knobs only
            assert name in execution, f"{pipeline}.{op.name}: starting config sets {name}, not an execution knob"
        assert op.space.quality_knobs == ()


@pytest.mark.parametrize("pipeline", sorted(REAL))
def test_real_operators_declare_their_quality_knobs(pipeline):
    for op in REAL[pipeline]():
        assert hasattr(op.cls, "QUALITY_KNOBS") and hasattr(op.cls, "EXECUTION_KNOBS"), op.name
        for knob in op.cls.QUALITY_KNOBS:
            assert knob.check(op.name, knob.default) == knob.default  # the default lies in the declared domain
    knobs = {o.name: {k.name for k in o.cls.QUALITY_KNOBS} for o in REAL[pipeline]()}
    expected = {"documents": {"parse": {"min_page_chars", "max_pages", "max_image_megapixels"},
                              "ocr": {"engine", "dpi", "lang", "rec_batch", "max_page_megapixels"}, "embed": {"chunk_words"}},
                "video": {"decode": {"sample_fps", "max_side"}, "safety": {"frames_per_clip", "threshold"}}}[pipeline]
    assert {name: knobs[name] for name in expected} == expected


def test_quality_settings_reach_the_operator_as_params_and_no_config_can_change_them():
    specs = apply_quality("video", video.operator_specs(), {"decode.sample_fps": "1.5"})
    decode = next(o for o in specs if o.name == "decode")
    assert decode.params["sample_fps"] == 1.5 and "sample_fps" not in decode.config.knob_dict
    assert decode.build().sample_fps == 1.5
    # a plan that carried a quality knob would be refused by the replica, not silently applied
    with pytest.raises(ValueError, match="sets quality knob sample_fps.*not marked tunable"):
        decode.build(decode.config.with_changes(sample_fps=0.5))
    with pytest.raises(ValueError, match="does not have"):
        decode.build(decode.config.with_changes(speed=3))
    assert video_decode.Decode(OpConfig.make(sample_fps=0.5), **{TUNABLE: ("sample_fps",)}).sample_fps == 0.5


def test_a_quality_knob_marked_tunable_joins_the_space_with_exactly_its_range():
    specs = apply_quality("documents", documents.operator_specs(), {"ocr.dpi": 120}, {"ocr.dpi": "200..300"})
    ocr = next(o for o in specs if o.name == "ocr")
    (knob,) = ocr.space.knobs
    assert (knob.name, knob.role, knob.low, knob.high) == ("dpi", KnobRole.QUALITY, 200, 300)
    assert ocr.config.knob("dpi") == 200  # the setting, moved into the range
    assert ocr.params[TUNABLE] == ("dpi",)
    assert quality_settings("ocr", doc_parse.OcrPages, ocr.config.with_changes(dpi=250), ocr.params)["dpi"] == 250
    spec = PipelineSpec("documents", specs, lambda: iter(()))
    assert tunable_quality(spec) == ["ocr.dpi"]
    assert "outputs can differ by configuration" in output_note(spec) and "cfg_ocr_dpi" in output_note(spec)
    assert output_note(PipelineSpec("documents", documents.operator_specs(), lambda: iter(()))) == ""
    lang = apply_quality("documents", documents.operator_specs(), tune={"ocr.lang": "eng|osd"})
    assert next(o for o in lang if o.name == "ocr").space.knobs[0].choices == ("eng", "osd")


@pytest.mark.parametrize("quality, tune, message", [
    ({}, {"ocr.dpi": ""}, r"ocr.dpi is marked tunable without a range.*--tune ocr.dpi=50..600"),
    ({}, {"ocr.dpi": None}, r"without a range"),
    ({}, {"ocr.dpi": "300"}, r"must be written LOW..HIGH"),
    ({}, {"ocr.dpi": "300..100"}, r"low > high"),
    ({}, {"ocr.dpi": "10..300"}, r"dpi=.10.* outside 50..600"),
    ({}, {"dedup.threshold": "0.6..0.8"}, r"cannot be tunable \(the index shared by all replicas"),
    ({"ocr.dpi": 1000}, {}, r"outside 50..600"),
    ({"ocr.dpi": "high"}, {}, r"must be a int"),
    ({"ocr.threads": 2}, {}, r"threads is an execution knob"),
    ({"embed.batch_size": 2}, {}, r"batch_size is an execution knob"),
    ({"ocr.resolution": 2}, {}, r"no quality knob 'resolution'.*\['engine', 'dpi', 'lang', 'rec_batch', 'max_page_megapixels'\]"),
    ({"render.dpi": 200}, {}, r"an operator of pipeline 'documents'"),
    ({"dpi": 200}, {}, r"write OPERATOR.KNOB"),
])
def test_bad_quality_settings_are_refused_saying_what_to_change(quality, tune, message):
    with pytest.raises(ValueError, match=message):
        apply_quality("documents", documents.operator_specs(), quality, tune)


def test_emulated_pipelines_refuse_quality_settings():
    with pytest.raises(ValueError, match="has no quality knobs.*drop --quality/--tune ocr.dpi"):
        build_pipeline("emulated-docs", synth=10, quality={"ocr.dpi": 200})
    with pytest.raises(ValueError, match="has no quality knobs"):
        build_pipeline("emulated-video", synth=10, tune={"decode.sample_fps": "1..2"})


def test_cli_settings_parse_and_refuse():
    assert parse_settings(["ocr.dpi=200", "quality.min_chars = 100"], "--quality") == {"ocr.dpi": "200", "quality.min_chars": "100"}
    with pytest.raises(ValueError, match="write OPERATOR.KNOB=VALUE, e.g. --tune ocr.dpi=100..300"):
        parse_settings(["ocr.dpi"], "--tune")


def test_prefect_pipeline_block_carries_and_checks_quality_settings(tmp_path):
    from pydantic import ValidationError

    from trident_flows.blocks import PipelineSettingsBlock

    block = PipelineSettingsBlock(pipeline="documents", synth=4, quality={"ocr.dpi": 200}, tune={"embed.chunk_words": "64..256"})
    options = block.build_options(tmp_path)
    assert options["quality"] == {"ocr.dpi": 200} and options["tune"] == {"embed.chunk_words": "64..256"}
    with pytest.raises(ValidationError, match="ocr.dpi is marked tunable without a range"):
        PipelineSettingsBlock(pipeline="documents", synth=4, tune={"ocr.dpi": ""})
    with pytest.raises(ValidationError, match="no quality knob"):
        PipelineSettingsBlock(pipeline="video", synth=4, quality={"decode.fps": 1})


# ------------------------------------------------------------------ near-duplicates, whatever the order

def _cluster_corpus() -> list[tuple[str, np.ndarray]]:
    """Documents with near-duplicate clusters whose members have scattered ids, and a chain
    (a ~ b, b ~ c, a !~ c) where first-writer-wins keeps a different set in different orders."""
    rng = random.Random(3)
    docs: dict[str, str] = {}
    for k in range(6):
        base = paragraph(random.Random(100 + k), "en", 250)
        members = rng.sample(range(100), 3)
        for j, m in enumerate(members):
            words = base.split()
            for _ in range(j * 2):
                words[rng.randrange(len(words))] = "zzz"
            docs[f"doc-{m:03d}"] = " ".join(words)
    words = paragraph(random.Random(7), "en", 400).split()
    drift = list(words)  # every 24th word changed: estimated similarity 0.76 to the base
    for i in range(0, len(drift), 24):
        drift[i] = "qqq"
    further = list(drift)  # 12 words later, every 24th again: 0.79 to drift, 0.60 to the base
    for i in range(12, len(further), 24):
        further[i] = "www"
    docs.update({"chain-a": " ".join(words), "chain-b": " ".join(drift), "chain-c": " ".join(further)})
    for k in range(5):
        docs[f"solo-{k}"] = paragraph(random.Random(500 + k), "fr", 200)
    return [(i, doc_filters.minhash_values(t, 128)) for i, t in sorted(docs.items())]


def _final_answers(items: list[tuple[str, np.ndarray]], order: list[int], batch: int) -> dict[str, str]:
    index = LshIndex(0.7, 128)
    answers: dict[str, str] = {}
    shuffled = [items[i] for i in order]
    for start in range(0, len(shuffled), batch):
        chunk = sorted(shuffled[start:start + batch])
        answers.update(zip([k for k, _ in chunk], index.check_and_insert(chunk)))
    answers.update(index.revisions())
    return answers


def test_near_duplicate_answers_do_not_depend_on_arrival_order():
    items = _cluster_corpus()
    in_order = _final_answers(items, list(range(len(items))), 4)
    sim = {(a, b): float(np.mean(x == y)) for a, x in items for b, y in items}
    # the chain really is a chain, and the rule is what the docstring says: smallest smaller-id match
    assert sim[("chain-a", "chain-b")] >= 0.7 and sim[("chain-b", "chain-c")] >= 0.7 and sim[("chain-a", "chain-c")] < 0.7
    assert in_order["chain-a"] == "" and in_order["chain-b"] == "chain-a" and in_order["chain-c"] == "chain-b"
    assert sum(1 for v in in_order.values() if v) >= 12
    for key, answer in in_order.items():
        if answer:
            assert answer < key and sim[(key, answer)] >= 0.7
    rng = random.Random(11)
    for trial in range(25):
        order = list(range(len(items)))
        rng.shuffle(order)
        assert _final_answers(items, order, rng.choice([1, 3, 8])) == in_order, f"trial {trial}"


def test_late_smaller_id_revises_the_kept_row_in_the_committed_output(tmp_path):
    text = paragraph(random.Random(0), "en", 300)
    near = text.replace("committee", "commission", 1)
    name = f"test-{uuid.uuid4().hex}"
    try:
        dedup = doc_filters.NearDuplicates(OpConfig.make(), index_name=name)
        from trident_flows.runtime.spec import rows_to_batch

        first = dedup(rows_to_batch([{"id": "doc-2", "text": near}]))  # the larger id arrives first: kept for now
        second = dedup(rows_to_batch([{"id": "doc-1", "text": text}]))
        assert first["_drop"][0] == "" and second["_drop"][0] == ""
        assert shared_index(name, 0.7, 128).revisions() == {"doc-2": "doc-1"}
        data = tmp_path / "data"
        data.mkdir()
        pq.write_table(pa.table({"id": ["doc-1", "doc-2", "doc-3"], "_drop": [None, None, "quality:too-short"],
                                 "duplicate_of": ["", "", None], "chunks": [1, 2, None],
                                 "embeddings": [[[0.5] * 3], [[0.1] * 3, [0.2] * 3], None],
                                 "cfg_embed_model": ["m", "m", None]}), data / "shard=0.parquet")
        spec = PipelineSpec("documents", documents.operator_specs(name), lambda: iter(()))
        assert documents.finish_run(spec, tmp_path) == {"revised": 1, "rows_changed": 1}
        out = pq.read_table(data / "shard=0.parquet").to_pylist()
        assert out[1] == {"id": "doc-2", "_drop": "duplicate-of:doc-1", "duplicate_of": "doc-1", "chunks": None, "embeddings": None,
                          "cfg_embed_model": None}
        assert out[0]["_drop"] is None and out[0]["embeddings"] == [[0.5] * 3] and out[2]["_drop"] == "quality:too-short"
        assert documents.finish_run(spec, tmp_path)["rows_changed"] == 1  # idempotent: same rows, same values
        assert pq.read_table(data / "shard=0.parquet").to_pylist() == out
    finally:
        release_index(name)
