"""The decoder under load and misuse: hundreds of calls with flat memory, threads, long prompts, bad components."""

import json
import logging
import random
import threading
from pathlib import Path

import pytest
import torch

from ppdkit.data_pipeline.ngram_cache import build_ngram_table
from ppdkit.models.artifact import ArtifactError, write_component, write_ngrams
from ppdkit.models.loading import load_base_model
from ppdkit.runtime.decoder import Decoder
from ppdkit.runtime.load_options import LoadOptions
from ppdkit.runtime.drafters.draft_parts import PromptTokenParts
from ppdkit.runtime.drafters.ppd import PromptTokenSet
from ppdkit.runtime.trees.tree import best_tree_for_size

P = [[0.5, 0.2, 0.1], [0.3, 0.1], [0.2]]


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    pytest.skip("no /proc/self/status on this system")


@pytest.fixture(scope="module")
def decoder():
    """The tiny model in float32 (the native layers where they build), prompt tokens, a table."""
    base = load_base_model("tiny-llama")
    torch.manual_seed(0)
    prompts = PromptTokenSet(torch.randn(3, 64), None, 3, 1, "ensemble")
    table = build_ngram_table([[5, 6, 7, 8, 9] * 3, [10, 11, 12, 13] * 3], max_n=3, branches=2, length=6)
    parts = PromptTokenParts.of_tree(prompts, best_tree_for_size(P, 12), ngrams=table, lookup_chains=2)
    return Decoder(base.model, base.tokenizer, parts, max_length=256)


def _prompts(count: int) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(3, 60) for _ in range(rng.randint(1, 30))] for _ in range(count)]


def test_five_hundred_calls_keep_memory_flat_and_outputs_identical(decoder, capsys):
    prompts = _prompts(10)
    methods = ("ar", "ppd", "ppd-lookup")
    plan = [(i % len(prompts), methods[i % 3], 8 + (i * 7) % 41) for i in range(500)]  # mixed lengths 8..48
    first: dict[tuple[int, int], list[int]] = {}
    for p, method, n in plan[:30]:  # warm-up: allocator pools, lazily built lookup layouts
        decoder.generate(prompts[p], max_new_tokens=n, method=method)
    start = _rss_mb()
    for p, method, n in plan:
        tokens = decoder.generate(prompts[p], max_new_tokens=n, method=method).tokens
        reference = first.setdefault((p, n), tokens)  # every method, every repeat: the same tokens
        assert tokens == reference, (p, method, n)
    end = _rss_mb()
    with capsys.disabled():
        print(f"\n500 generate calls: RSS {start:.1f} MB at start, {end:.1f} MB at end")
    assert end - start < 20, (start, end)


def test_threads_take_turns_and_get_what_sequential_calls_get(decoder, monkeypatch):
    jobs = [(ids, method, 24) for ids in _prompts(6) for method in ("ar", "ppd", "ppd-lookup")]
    expected = [decoder.generate(ids, max_new_tokens=n, method=method).tokens for ids, method, n in jobs]
    active, most = [0], [0]
    forward = decoder.model.forward

    def counting_forward(*args, **kwargs):  # how many generate calls are inside a forward at once
        active[0] += 1
        most[0] = max(most[0], active[0])
        try:
            return forward(*args, **kwargs)
        finally:
            active[0] -= 1

    monkeypatch.setattr(decoder.model, "forward", counting_forward)
    results: dict[int, list[int]] = {}

    def worker(offset: int) -> None:
        for i in range(offset, len(jobs), 4):
            ids, method, n = jobs[i]
            results[i] = decoder.generate(ids, max_new_tokens=n, method=method).tokens

    threads = [threading.Thread(target=worker, args=(offset,)) for offset in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [results[i] for i in range(len(jobs))] == expected
    assert most[0] == 1  # serialized: never two steps at once, never a shared cache


def test_a_prompt_beyond_the_context_is_refused_or_cut_from_the_left(decoder, caplog):
    long = [7 + i % 50 for i in range(300)]  # max_length is 256
    with pytest.raises(ValueError, match=r"the prompt has 300 tokens.*max_length=256.*truncate='left'"):
        decoder.generate(long, max_new_tokens=16, method="ppd")
    with caplog.at_level(logging.WARNING):
        cut = decoder.generate(long, max_new_tokens=16, method="ppd", truncate="left")
    assert "keeping its last" in caplog.text
    room = 256 - 16 - decoder.step_rows("ppd")
    assert cut.tokens == decoder.generate(long[-room:], max_new_tokens=16, method="ar").tokens
    with pytest.raises(ValueError, match="outside the vocabulary"):
        decoder.generate([5, 10_000], max_new_tokens=4, method="ar")
    with pytest.raises(ValueError, match="empty"):
        decoder.generate([], max_new_tokens=4, method="ar")
    with pytest.raises(ValueError, match="max_new_tokens"):
        decoder.generate([5], max_new_tokens=0, method="ar")


@pytest.fixture
def tiny_component(tmp_path):
    """A component for the tiny model that passes its checksums, with a tree and an n-gram table."""
    base = load_base_model("tiny-llama")
    directory = tmp_path / "component"
    write_component(directory, "ept", {"num_prompt_tokens": 3, "num_epts": 1, "mask": "ensemble"}, "tiny-llama",
                    base.fingerprint, {}, {"prompt_embeddings": torch.randn(3, 1, 64)},
                    extras={"trees": {"trees": {"12": best_tree_for_size(P, 12).to_json()}}})
    write_ngrams(directory, build_ngram_table([[5, 6, 7, 8] * 3], max_n=2, branches=2, length=3).to_tensors())
    return directory


def _rewrite(directory: Path, **changes) -> None:
    """Rebuild the component with some parts changed (checksums listed anew: only the shape is wrong)."""
    meta = json.loads((directory / "component.json").read_text())
    trees = json.loads((directory / "trees.json").read_text())
    tensors = {"prompt_embeddings": changes.get("embeddings", torch.randn(3, 1, 64)), **changes.get("head", {})}
    write_component(directory, "ept", meta["hyperparameters"], "tiny-llama", meta["base_model"]["fingerprint"], {},
                    tensors, extras={"trees": changes.get("trees", trees)})
    if "ngrams" in changes:
        write_ngrams(directory, changes["ngrams"])


def test_a_well_formed_component_decodes(tiny_component):
    decoder = Decoder.from_pretrained(tiny_component, tree_size=12)
    ids = [5, 6, 7, 8, 5, 6]
    assert decoder.generate(ids, max_new_tokens=12, method="ppd-lookup").tokens == decoder.generate(ids,
                            max_new_tokens=12, method="ar").tokens


def test_a_component_with_a_head_decodes_with_ppd_head(tiny_component):
    _rewrite(tiny_component, head={"head_weight": torch.randn(64, 64) / 8, "head_bias": torch.randn(64)})
    decoder = Decoder.from_pretrained(tiny_component, tree_size=12)
    assert decoder.methods() == ["ar", "auto", "anpd", "self-draft", "ppd", "ppd-lookup", "ppd-head"]
    ids = [5, 6, 7, 8, 5, 6]
    assert decoder.generate(ids, max_new_tokens=12, method="ppd-head").tokens == decoder.generate(ids,
                            max_new_tokens=12, method="ar").tokens


@pytest.mark.parametrize("damage", ["embedding-shape", "tree-parent", "tree-states", "tree-rank", "ngram-id",
                                    "head-shape", "hyperparameters"])
def test_a_component_built_wrong_is_refused_at_load(tiny_component, damage):
    trees = json.loads((tiny_component / "trees.json").read_text())
    state = trees["trees"]["12"]["states"]["3"]
    changes, expected = {}, ""
    if damage == "embedding-shape":
        changes["embeddings"], expected = torch.randn(3, 1, 32), r"prompt_embeddings must be \[3, 1, 64\]"
    elif damage == "tree-parent":
        state["parents"][2] = 5
        changes["trees"], expected = trees, "the tree of size 12 cannot be used: state 3: node 2"
    elif damage == "tree-states":
        del trees["trees"]["12"]["states"]["2"]
        changes["trees"], expected = trees, r"states \[1, 3\], expected 1..3"
    elif damage == "tree-rank":
        state["ranks"][1] = 10_000
        changes["trees"], expected = trees, "rank 10000, outside"
    elif damage == "hyperparameters":  # the typed read (models/component_hyperparameters.py) names each key
        meta = json.loads((tiny_component / "component.json").read_text())
        meta["hyperparameters"].pop("num_epts")
        meta["hyperparameters"]["mask"] = "diagonal"
        (tiny_component / "component.json").write_text(json.dumps(meta))
        expected = (r"hyperparameters of a ept component are not usable \(num_epts: Field required; mask: Input should "
                    r"be 'ensemble', 'decoder' or 'encoder'\)")
    elif damage == "head-shape":
        changes["head"] = {"head_weight": torch.randn(64, 32)}
        expected = r"custom decoding head needs head_weight \[H, H\] and head_bias \[H\] for .* hidden size H=64"
    else:
        changes["ngrams"] = build_ngram_table([[5, 6, 900] * 3], max_n=1, branches=1, length=2).to_tensors()
        expected = "token id 900, outside the base model's vocabulary of 384"
    _rewrite(tiny_component, **changes)
    with pytest.raises(ArtifactError, match=expected):
        Decoder.from_pretrained(tiny_component, tree_size=12)


def test_streamed_tokens_are_the_answers_tokens_and_should_stop_ends_it(tiny_component):
    """A step that emits several tokens and reaches the budget (or an end token) streams all of them up to the last
    one kept, for every method; `should_stop` ends the answer after the step it first says so."""
    decoder = Decoder.from_pretrained(tiny_component, tree_size=12)
    rng = random.Random(1)
    for method in ("ar", "ppd", "ppd-lookup", "anpd", "self-draft"):
        for budget in (1, 5, 9, 23):
            ids = [5, 6, 7, 8] * rng.randint(1, 4)
            streamed: list[int] = []
            result = decoder.generate(ids, max_new_tokens=budget, method=method, stream=streamed.extend)
            assert streamed == result.tokens, (method, budget)
        steps = []
        stopped = decoder.generate([5, 6, 7, 8] * 3, max_new_tokens=40, method=method, stream=steps.append,
                                   should_stop=lambda: len(steps) == 2)
        assert len(steps) == 2 and stopped.tokens == [t for step in steps for t in step], method


def test_loading_takes_one_typed_options_object_and_refuses_what_does_not_apply(tiny_component):
    options = LoadOptions(tree_size=12, dtype="float32")
    by_object = Decoder.from_pretrained(tiny_component, options)
    assert by_object.draft.size == 12 and by_object.model.weight_format == "float32"
    ids = [5, 6, 7, 8]
    assert by_object.generate(ids, max_new_tokens=8, method="ppd").tokens == Decoder.from_pretrained(
        tiny_component, tree_size=12, dtype="float32").generate(ids, max_new_tokens=8, method="ar").tokens
    with pytest.raises(ValueError, match="unknown load option.s. tree_sise; the options are dtype"):
        Decoder.from_pretrained(tiny_component, tree_sise=12)
    with pytest.raises(ValueError, match="tree_size, lookup_chains cannot apply to a base model alone"):
        Decoder.from_base("tiny-llama", options, lookup_chains=2)
    with pytest.raises(ValueError, match="skip_map cannot apply to a component"):
        Decoder.from_pretrained(tiny_component, skip_map=(0, 0))
    with pytest.raises(ValueError, match="unknown dtype 'float8'"):
        Decoder.from_pretrained(tiny_component, dtype="float8")
    with pytest.raises(TypeError, match="pass dtype, tree_size, ... by name"):
        Decoder.from_base("tiny-llama", "float32")
