"""Self-Draft (Multi-Branch Self-Drafting) as a decoding method: the branches and context cache by hand, the
step's masks, greedy output identical to plain greedy decoding on both kernel paths (against transformers in float64:
tests/test_lossless.py), and sampled output with the base model's distribution."""

import pytest
from conftest import lossless_on_random_prompts, plain_tiny_decoder
from test_sampling import first_two_tokens_follow_the_model, tiny_decoder  # noqa: F401  (the fixture)

from ppdkit.models.ngram_table import NgramTable
from ppdkit.runtime.decoding_methods import get_method
from ppdkit.runtime.drafters.self_draft import Drafts, step_inputs, trie
from ppdkit.runtime.trees.tree_layout import shape_layout


def test_branches_slide_and_fill_the_context_cache():
    drafts = Drafts([[1, 2, 3], [7]], gram=2, length=3)
    drafts.update([[20, 30, 4], [8]])  # the model's guess after each branch token
    assert drafts.branches == [[2, 3, 4], [7, 8]]  # full: first dropped, guess appended; short: grows
    assert list(drafts.pool[1]) == [(2, 30)] and list(drafts.pool[2]) == [(3, 4)]  # 2 branch tokens + the guess
    assert 7 not in drafts.pool  # a branch shorter than G makes no n-gram
    drafts.update([[9, 9, 9], [8, 8]])
    assert list(drafts.pool[2]) == [(3, 4), (3, 9)] and list(drafts.pool[7]) == [(8, 8)]  # newest last
    assert drafts.candidates(2, [5, 2], None, 4) == [[3, 9], [3, 4]]  # newest first
    table = NgramTable(2, 2, 2, {(5, 2): [[3, 6], [3, 4, 1]]})
    assert drafts.candidates(2, [5, 2], table, 4) == [[3, 9], [3, 4], [3, 6]]  # the table's cut to G, once each
    assert drafts.candidates(2, [5, 2], table, 1) == [[3, 9]]


def test_the_committed_texts_ngrams_join_the_context_cache_once_each():
    drafts = Drafts([[1]], gram=2, length=3)
    drafts.read_text([5, 6, 7, 5, 6])  # a prompt: (5, 6, 7), (6, 7, 5), (7, 5, 6)
    assert list(drafts.pool[5]) == [(6, 7)] and list(drafts.pool[7]) == [(5, 6)] and 6 in drafts.pool
    drafts.read_text([5, 6, 7, 5, 6, 8])  # a step committed 8: only the new n-gram (5, 6, 8) is read
    assert list(drafts.pool[5]) == [(6, 7), (6, 8)] and list(drafts.pool[6]) == [(7, 5)]
    assert drafts.candidates(5, [5], None, 4) == [[6, 8], [6, 7]]  # the newest first
    drafts.read_text([5, 6, 7, 5, 6, 8])  # nothing new: nothing moves
    assert list(drafts.pool[5]) == [(6, 7), (6, 8)]


def test_candidates_merge_into_a_trie_and_branches_see_only_their_own_past():
    tokens, parents = trie(9, [[1, 2], [1, 3], [4]])
    assert tokens == [9, 1, 2, 3, 4] and parents == (-1, 0, 1, 1, 0)
    layout = shape_layout(parents, (-1, 0, 0, 0, 0))
    assert layout.depths.tolist() == [0, 1, 2, 2, 1]
    inputs, offsets, mask = step_inputs(tokens, layout, [[5, 6], [7]])
    assert inputs.tolist() == [9, 1, 2, 3, 4, 5, 6, 7]
    assert offsets.tolist() == [0, 1, 2, 2, 1, 1, 2, 1]
    assert layout.paths[3].tolist() == [0, 1, 3]
    assert mask[3].nonzero().flatten().tolist() == [0, 1, 3]  # a candidate: its path
    assert mask[6].nonzero().flatten().tolist() == [0, 5, 6]  # a branch token: the root and its branch's past
    assert mask[7].nonzero().flatten().tolist() == [0, 7]


@pytest.mark.parametrize("path", ["native", "pytorch"])
def test_self_draft_gives_plain_greedy_tokens_on_both_kernel_paths(path, monkeypatch):
    decoder = plain_tiny_decoder(path, monkeypatch)
    steps = emitted = 0
    for _, out in lossless_on_random_prompts(decoder, "self-draft", 48):
        assert len(out.rows_per_step) == out.steps - 1  # every step but the prompt's says what it fed
        assert max(out.rows_per_step) <= get_method("self-draft").chain_rows  # what the cache was sized for
        steps, emitted = steps + out.steps, emitted + len(out.tokens)
    assert emitted / steps > 1.02  # candidates were accepted (on this random model, rarely): the trimming ran


def test_sampled_self_draft_draws_the_base_models_first_tokens(tiny_decoder):  # noqa: F811
    first_two_tokens_follow_the_model(tiny_decoder, [5, 17, 5, 17, 5, 17, 5], "self-draft")
