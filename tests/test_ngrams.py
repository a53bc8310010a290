"""The corpus n-gram table: counting by hand, its file form, and lossless decoding with its chains."""

import torch
from conftest import hf_greedy

from ppdkit.data_pipeline.ngram_cache import build_ngram_table
from ppdkit.models.artifact import read_component, write_component, write_ngrams
from ppdkit.models.ngram_table import NgramTable
from ppdkit.runtime.decoder import Decoder
from ppdkit.runtime.drafters.draft_parts import PromptTokenParts
from ppdkit.runtime.forward.llama import LeanLlama
from ppdkit.runtime.drafters.lookup import ContextIndex, draft_chains, root_only, with_lookup_chains
from ppdkit.runtime.drafters.ppd import PromptTokenSet, ppd_step, prefill
from ppdkit.runtime.trees.tree import best_tree_for_size
from ppdkit.runtime.trees.tree_layout import layout_tree

P = [[0.5, 0.2, 0.1], [0.3, 0.1], [0.2]]


def test_ngram_table_by_hand():
    texts = [[1, 2, 3, 4, 1, 2, 5], [1, 2, 3, 4], [7, 8]]
    table = build_ngram_table(texts, max_n=2, branches=2, length=2, min_count=2)
    assert table.entries[(1, 2)] == [[3, 4], [5, 5]]  # (3, 4) followed twice; (5) ran into the end: padded
    assert table.entries[(1,)] == [[2, 3], [2, 5]]
    assert table.entries[(2,)] == [[3, 4], [5, 5]]
    assert (7,) not in table.entries and (2, 3) in table.entries  # (7) was seen once
    assert table.continuations([6, 1, 2]) == [[3, 4], [5, 5]]  # the longest known suffix wins
    assert table.continuations([6, 9, 1]) == [[2, 3], [2, 5]]  # (9, 1) unknown: falls back to (1)
    assert table.continuations([6]) == []
    assert NgramTable.from_tensors(table.to_tensors()) == table
    assert table.to_tensors()["keys_1"].dtype == torch.uint16
    assert build_ngram_table([[70000, 1, 70000, 1]], min_count=1).to_tensors()["keys_1"].dtype == torch.int32


def test_draft_chains_put_the_context_first_and_drop_repeats():
    table = build_ngram_table([[5, 6, 1], [5, 6, 1], [5, 7, 2]], max_n=1, branches=3, length=2, min_count=1)
    assert draft_chains(ContextIndex([5, 6, 8, 5]), table, 3, 2) == [[6, 8], [6, 1], [7, 2]]
    # the context's chain is the table's too: offered once
    assert draft_chains(ContextIndex([5, 6, 1, 5]), table, 3, 2) == [[6, 1], [7, 2]]
    assert draft_chains(ContextIndex([5, 6, 1, 5]), table, 1, 2) == [[6, 1]]
    assert draft_chains(ContextIndex([3]), None, 3, 2) == []


def test_component_carries_its_ngram_table(tmp_path):
    table = build_ngram_table([[1, 2, 3, 1, 2, 4]], min_count=1)
    write_component(tmp_path, "ept", {}, "tiny", "sha256:x", {}, {"w": torch.zeros(1)})
    assert read_component(tmp_path).ngrams is None
    write_ngrams(tmp_path, table.to_tensors())
    assert NgramTable.from_tensors(read_component(tmp_path).ngrams) == table


def test_a_step_accepts_the_right_one_of_several_chains(tiny_f64):
    """Two chains under a root without guesses (state 0): the wrong one is dropped, the right one kept."""
    model, _ = tiny_f64
    lean = LeanLlama(model, 256)
    ids = torch.randint(3, 384, (10,), generator=torch.Generator().manual_seed(1)).tolist()
    reference = hf_greedy(model, ids, 5)
    prompts = PromptTokenSet(torch.randn(3, 64, dtype=torch.float64), None, 3, 1, "ensemble")
    layout = layout_tree(with_lookup_chains(root_only(3), 2, 3), 1, "ensemble")
    cache = lean.new_cache(128)
    root, guesses = prefill(lean, cache, torch.tensor(ids), prompts, 3)
    wrong = [(t + 1) % 384 for t in reference[1:4]]
    step = ppd_step(lean, cache, prompts, layout, root, guesses, 3, chain=wrong + reference[1:4])
    assert root == reference[0] and step.accepted == reference[1:4] and step.next_token == reference[4]
    assert step.state == 0 and cache.length == len(ids) + 4  # ended on a chain: no guesses; root + chain cached


def test_ppd_with_corpus_chains_is_plain_greedy(tiny_f64):
    model, tok = tiny_f64
    torch.manual_seed(5)
    prompts = PromptTokenSet(torch.randn(3, 64, dtype=torch.float64), None, 3, 1, "ensemble")
    g = torch.Generator().manual_seed(0)
    corpus = [torch.randint(3, 384, (30,), generator=g).tolist() for _ in range(20)]  # chains mostly wrong
    table = build_ngram_table(corpus, min_count=1)
    plain = Decoder(model, tok, PromptTokenParts.of_tree(prompts, best_tree_for_size(P, 12)))
    with_table = Decoder(model, tok, PromptTokenParts.of_tree(prompts, best_tree_for_size(P, 12), ngrams=table,
                                                              lookup_chains=4))
    assert with_table.draft.lookup_layout(3, 4, 3).size == plain.draft.lookup_layout(3, 1, 3).size + 9
    for seed in range(12):
        ids = torch.randint(3, 384, (8,), generator=torch.Generator().manual_seed(100 + seed)).tolist()
        ids = ids + corpus[seed][:3]  # an ending the table knows: its chains are verified, and dropped
        assert with_table.generate(ids, max_new_tokens=40, method="ppd-lookup").tokens == hf_greedy(model, ids, 40)
