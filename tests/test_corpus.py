"""The self-distilled corpus: shards whole or absent, resumed where they stopped, checked by sha256, read by
`datasets` and by the data stage; benchmark prompts kept out of it, the committed corpus included."""

import pyarrow.parquet as pq
import pytest
from conftest import kernels_or_skip

from ppdkit.data_pipeline.config import DataConfig
from ppdkit.data_pipeline.contamination import benchmark_index
from ppdkit.data_pipeline.corpus import (CorpusError, CorpusRow, answer_spans, committed_corpus,
                                         load_corpus, open_corpus, read_rows, stream_rows)
from ppdkit.data_pipeline.corpus_grow import CorpusConfig, grow_corpus, next_source
from ppdkit.data_pipeline.data_stage import run_data_stage, split_holdout_by_id
from ppdkit.data_pipeline.readers import iter_rows
from ppdkit.jobs.spec import SpecError, spec_from_dict
from ppdkit.models.config import BaseModelConfig

TINY = dict(base_model="tiny-llama", rows_per_shard=3, max_new_tokens=8, max_length=320, generate_batch=4,
            mix={"magpie-coding": 1.0, "chitchat": 1.0})


def _grow(root, shards: int):
    kernels_or_skip("native")
    return grow_corpus(root, CorpusConfig(**TINY), max_shards=shards)


def test_answer_spans_are_the_loss_masks_runs():
    mask = [0, 1, 1, 0, 0, 1, 0, 1]
    assert answer_spans(mask) == [(1, 3), (5, 6), (7, 8)]
    row = CorpusRow("a", "s", list(range(8)), answer_spans(mask), 0, 0.0, None)
    assert row.loss_mask() == mask


def test_a_corpus_grows_shard_by_shard_and_resumes_where_it_stopped(tmp_path):
    """Three shards in two runs (the second after a writer stopped between rename and record, and mid-write) are
    the same bytes as three in one run; `datasets` reads them; ids are stored as uint16."""
    once, twice = tmp_path / "once", tmp_path / "twice"
    _grow(once, 3)
    _grow(twice, 2)
    shards = twice / "shards"
    (shards / "chitchat-s0-00000099.parquet").write_bytes(b"half")  # renamed, never recorded
    (shards / ".magpie-coding-s0-00000003.parquet.tmp").write_bytes(b"half")  # stopped mid-write
    _grow(twice, 1)
    first, second = open_corpus(once), open_corpus(twice)
    assert [(s["file"], s["sha256"]) for s in first.shards] == [(s["file"], s["sha256"]) for s in second.shards]
    assert sorted(p.name for p in shards.iterdir()) == sorted(s["file"].split("/")[1] for s in second.shards)
    # the mix's order, then the source furthest below its share; each source goes on from its last row
    assert [(s["source"], s["first"]) for s in second.shards][:2] == [("magpie-coding", 0), ("chitchat", 0)]
    assert second.shards[2]["first"] == 3
    figures = second.figures()
    assert figures["rows"] == sum(s["rows"] for s in second.shards) > 0
    assert set(figures["by_source"]) == {"magpie-coding", "chitchat"}
    dataset = load_corpus(twice)
    assert len(dataset) == figures["rows"]
    assert sum(len(ids) for ids in dataset["input_ids"]) == figures["tokens"]
    assert str(pq.read_schema(twice / second.shards[0]["file"]).field("input_ids").type) == "list<element: uint16>"
    record = second.shards[0]
    assert record["compute_dtype"] in ("bfloat16", "float32") and record["settings"]["seed"] == 0
    # a conversation that ends on a question (chitchat has many one-liners) gets the model's answer
    assert not any(s["skipped"] for s in second.shards), [s["skipped"] for s in second.shards]
    for row in read_rows(second):
        assert any(row.loss_mask()) and len(row.input_ids) <= TINY["max_length"]
        assert (row.prompt_temperature is not None) == row.source.startswith("magpie")


def test_a_damaged_shard_or_another_models_corpus_is_refused(tmp_path):
    root = tmp_path / "c"
    _grow(root, 1)
    corpus = open_corpus(root)
    with pytest.raises(CorpusError, match="another base model"):
        corpus.check_base_model("sha256:other", corpus.manifest["tokenizer"])
    with pytest.raises(CorpusError, match="another tokenizer"):
        corpus.check_base_model(corpus.manifest["fingerprint"], {"class": "X", "size": 1, "vocab_sha256": "0"})
    path = root / corpus.shards[0]["file"]
    path.write_bytes(path.read_bytes()[:-1] + b"\0")
    with pytest.raises(CorpusError, match="does not match the sha256.*restore it"):
        load_corpus(root)
    path.unlink()
    with pytest.raises(CorpusError, match="missing"):
        open_corpus(root).verify()
    with pytest.raises(CorpusError, match="not a corpus"):
        open_corpus(tmp_path)
    with pytest.raises(ValueError, match="unknown sources"):
        CorpusConfig(mix={"mt-bench-copy": 1.0})
    with pytest.raises(ValueError, match="extra"):
        CorpusConfig(rows_per_shards=3)


def test_the_data_stage_reads_a_corpus_as_it_is_stored(tmp_path):
    """data.source naming a corpus folder: its rows as stored (ids and answer spans), split into train and held-out;
    a spec that would regenerate a corpus is refused."""
    root = tmp_path / "c"
    _grow(root, 2)
    stored = {r.id: r for r in read_rows(open_corpus(root))}
    summary = run_data_stage(BaseModelConfig(name="tiny-llama", quantization="none"),
                             DataConfig(source=str(root), limit=None, holdout=0.25, check_sequences=0), tmp_path / "d")
    from datasets import load_from_disk

    rows = [*load_from_disk(str(tmp_path / "d" / "train")), *load_from_disk(str(tmp_path / "d" / "holdout"))]
    assert summary["train_sequences"] + summary["holdout_sequences"] == len(stored) == len(rows)
    for row in rows:
        assert row["input_ids"] == stored[row["id"]].input_ids and row["loss_mask"] == stored[row["id"]].loss_mask()
    with pytest.raises(SpecError, match="set teacher.regenerate false"):
        spec_from_dict({"name": "x", "base_model": {"name": "tiny-llama"}, "data": {"source": str(root)},
                        "teacher": {"regenerate": True}})


def test_the_mix_keeps_each_source_at_its_share():
    class Shards:
        shards = [{"source": "a", "tokens": 300}, {"source": "b", "tokens": 100}]

    assert next_source(Shards, {"a": 1.0, "b": 1.0}, set()) == "b"
    assert next_source(Shards, {"a": 4.0, "b": 1.0}, set()) == "a"
    assert next_source(Shards, {"a": 1.0, "b": 1.0}, {"b"}) == "a"
    assert next_source(Shards, {"a": 1.0}, {"a"}) is None


def test_benchmark_prompts_and_near_copies_are_caught():
    index = benchmark_index()
    question = next(row for _, row in iter_rows("mt-bench"))["turns"][0]
    assert index.match(question) is not None
    assert index.match("Hi! " + question.upper().replace(",", " ;") + " Thanks.") is not None  # case, punctuation
    words = question.split()
    assert index.match(" ".join(words[: len(words) // 2] + ["really"] + words[len(words) // 2:])) is not None
    humaneval = next(row for _, row in iter_rows("humaneval"))["prompt"]
    assert index.match(humaneval) is not None
    assert index.match("Write a poem about the sea and the sky at night, with rhymes.") is None
    assert index.match("Tell me about the history of Rome.") is None


@pytest.mark.slow
def test_the_committed_corpus_is_whole_mixed_and_free_of_benchmark_prompts():
    """Every committed shard matches its sha256; no conversation's prompts copy or nearly copy an MT-Bench turn or a
    HumanEval prompt (its non-answer tokens decoded and matched by word n-grams); at least three sources."""
    from ppdkit.models.loading import load_tokenizer

    corpus = open_corpus(committed_corpus("smollm2-135m"))
    assert corpus.shards and len(corpus.figures()["by_source"]) >= 3
    tokenizer, index = load_tokenizer("smollm2-135m"), benchmark_index()
    copies, seen = [], 0
    for row in stream_rows(corpus):  # verifies every sha256 first
        seen += 1
        mask = row.loss_mask()
        asked = tokenizer.decode([t for t, m in zip(row.input_ids, mask) if not m], skip_special_tokens=True)
        if (item := index.match(asked)) is not None:
            copies.append((row.id, item))
    assert seen == sum(shard["rows"] for shard in corpus.shards) > 0 and not copies


def test_a_held_out_row_stays_held_out_as_the_corpus_grows():
    """Continual training judges each run on held-out rows: one that an earlier, smaller corpus held out must never
    be trained on later."""
    rows = [CorpusRow(id=f"magpie-writing-{i:07d}", source="magpie-writing", input_ids=[1], answer_spans=[(0, 1)],
                      seed=0, temperature=0.0, prompt_temperature=0.8) for i in range(4000)]
    train_small, held_small = split_holdout_by_id(rows[:1000], 0.02, seed=0)
    train_big, held_big = split_holdout_by_id(rows, 0.02, seed=0)
    assert {r.id for r in held_small} <= {r.id for r in held_big}
    assert not {r.id for r in held_small} & {r.id for r in train_big}
    assert 40 <= len(held_big) <= 120 and len(train_big) + len(held_big) == 4000  # about 2%
    assert len(split_holdout_by_id(rows[:3], 0.02, seed=0)[1]) == 1  # a tiny set still holds one out
    assert split_holdout_by_id(rows[:3], 0.0, seed=0)[1] == []
