"""Sampled decoding: typical acceptance keeps the greedy token; speculative sampling keeps the distribution."""

import math

import pytest
import torch

from ppdkit.models.tiny import build_tiny_llama
from ppdkit.runtime.acceptance import (Sampling, TreeLinks, choose, greedy_tokens, next_token_distribution,
                                       typical_threshold)
from ppdkit.runtime.decoder import Decoder
from ppdkit.runtime.drafters.draft_parts import PromptTokenParts
from ppdkit.runtime.drafters.ppd import PromptTokenSet
from ppdkit.runtime.trees.tree import best_tree_for_size

# root 0 -> guesses 1 (token 0) and 2 (token 1); node 1 -> 3 (token 2) and 4 (token 0); node 2 -> 5 (token 3)
PARENTS, DEPTHS, RANKS = [-1, 0, 0, 1, 1, 2], [0, 1, 1, 2, 2, 2], [-1, 0, 1, 0, 1, 0]
TOKENS = torch.tensor([5, 0, 1, 2, 0, 3])
LINKS = TreeLinks.of(PARENTS, DEPTHS, RANKS)


def _chi_square_p_value(counts: torch.Tensor, expected: torch.Tensor) -> float:
    """Pearson's test over the cells expected to hold at least 5 draws (the rest pooled into one)."""
    big = expected >= 5
    observed = torch.cat([counts[big], counts[~big].sum()[None]])
    wanted = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = wanted > 0
    stat = float(((observed[keep] - wanted[keep]) ** 2 / wanted[keep]).sum())
    dof = int(keep.sum()) - 1
    # Wilson-Hilferty: the chi-square upper tail through a normal approximation
    z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


def test_sampling_settings_are_checked():
    with pytest.raises(ValueError, match="temperature"):
        Sampling(temperature=-1)
    with pytest.raises(ValueError, match="speculative"):
        Sampling(temperature=1, acceptance="lenient")
    with pytest.raises(ValueError, match="epsilon"):
        Sampling(temperature=1, epsilon=0)


def test_children_are_listed_in_rank_order():
    assert LINKS.children == [[1, 2], [3, 4], [5], [], [], []]


def test_the_most_likely_token_always_clears_the_typical_threshold():
    g = torch.Generator().manual_seed(0)
    for scale in (0.1, 1.0, 5.0, 30.0):
        probs = torch.softmax(scale * torch.randn(200, 50, generator=g, dtype=torch.float64), -1)
        for eps, delta in ((0.09, 0.3), (1.0, 1.0), (0.01, 0.05)):
            assert bool((probs.max(-1).values >= typical_threshold(probs, eps, delta)).all())


def test_typical_acceptance_keeps_a_path_of_greedy_guesses():
    g = torch.Generator().manual_seed(1)
    for trial in range(50):
        logits = torch.randn(6, 8, generator=g, dtype=torch.float64) * 3
        tokens = TOKENS.clone()
        tokens[2] = logits[0].argmax()  # the root's second guess is its greedy token
        tokens[5] = logits[2].argmax()  # and that guess's child is greedy too
        if tokens[1] == tokens[2]:
            continue
        final, _ = choose(tokens, logits, LINKS, Sampling(temperature=1.0, acceptance="typical"), g)
        assert DEPTHS[final] == 2, (trial, final)


def test_greedy_choice_follows_exact_matches():
    logits = torch.full((6, 8), -5.0, dtype=torch.float64)
    logits[0, 1] = logits[2, 3] = logits[5, 7] = 5.0  # root -> 1 (node 2) -> 3 (node 5) -> next 7
    assert choose(TOKENS, logits, LINKS, Sampling()) == (5, 7)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
def test_greedy_tokens_are_argmaxs_first_maximum_on_ties(dtype):
    """bfloat16 logits tie often (8 bits of mantissa): the greedy token must be the first maximum, as argmax's, in
    one row, many rows, and rows where every value ties or is NaN."""
    g = torch.Generator().manual_seed(0)
    for rows in (1, 3, 8, 65):
        logits = (torch.randn(rows, 4096, generator=g) * 2).round().to(dtype)  # few distinct values: many ties
        logits[0, 7] = logits[0, 4000] = logits[0].max() + 1
        assert torch.equal(greedy_tokens(logits), logits.argmax(-1))
        assert int(greedy_tokens(logits[0])) == 7 == int(logits[0].argmax())
    flat, nan = torch.zeros(2, 50, dtype=dtype), torch.full((50,), float("nan"), dtype=dtype)
    assert greedy_tokens(flat).tolist() == [0, 0] and int(greedy_tokens(nan)) == int(nan.argmax())


def test_speculative_acceptance_emits_the_target_distribution():
    """A Markov 'model' over 6 tokens: the first two emitted tokens must be distributed as p0(x1) T(x1, x2),
    whatever the guesses (some likely, some not) and whichever node the step ends at."""
    g = torch.Generator().manual_seed(2)
    v = 6
    p0 = torch.tensor([0.40, 0.25, 0.05, 0.10, 0.15, 0.05], dtype=torch.float64)
    table = torch.softmax(2 * torch.randn(v, v, generator=g, dtype=torch.float64), -1)  # T(x1, .)
    tokens = torch.tensor([5, 0, 3, 2, 0, 1])  # root 5; guesses 0 and 3; after 0: 2 and 0; after 3: 1
    rows = torch.stack([p0] + [table[t] for t in tokens[1:].tolist()])  # each node's next-token distribution
    logits = rows.log()  # at temperature 1 the rule sees exactly these distributions
    counts = torch.zeros(v, v)
    draws, past_root = 40_000, 0
    for _ in range(draws):
        final, nxt = choose(tokens, logits, LINKS, Sampling(temperature=1.0), g)
        past_root += final > 0
        emitted = [int(tokens[n]) for n in _path(final)] + [nxt]
        if len(emitted) == 1:  # the step ended at the root: the next step would draw x2 from T(x1, .)
            emitted.append(int(torch.multinomial(table[emitted[0]], 1, generator=g)))
        counts[emitted[0], emitted[1]] += 1
    expected = (p0[:, None] * table * draws).float()
    assert _chi_square_p_value(counts.flatten(), expected.flatten()) > 1e-3
    # the guesses were really used: a first guess (token 0 or 3) is kept with probability 0.40 + 0.10
    assert 0.48 < past_root / draws < 0.52


def _path(node: int) -> list[int]:
    path = []
    while node > 0:
        path.append(node)
        node = PARENTS[node]
    return path[::-1]


def test_temperature_scales_the_distribution():
    logits = torch.tensor([2.0, 1.0, 0.0], dtype=torch.float64)
    assert torch.allclose(next_token_distribution(logits, 0.5), torch.softmax(logits * 2, -1))


@pytest.fixture(scope="module")
def tiny_decoder():
    model, tok = build_tiny_llama()
    model = model.double().eval()
    g = torch.Generator().manual_seed(3)
    prompts = PromptTokenSet(torch.randn(3, model.config.hidden_size, generator=g, dtype=torch.float64), None,
                             3, 1, "ensemble")
    tree = best_tree_for_size([[0.5, 0.2, 0.1], [0.3, 0.1], [0.2]], 16)
    return Decoder(model, tok, PromptTokenParts.of_tree(prompts, tree), 256)


def first_two_tokens_follow_the_model(decoder, ids: list[int], method: str, draws: int = 1500) -> None:
    """Sampled decoding with `method` (temperature 0.7): the first two new tokens, over `draws` seeds, follow
    the model's own distributions (a chi-square test each); the second comes out of the first step's
    acceptance whenever that step kept a guess."""
    with torch.inference_mode():
        model = decoder.hf_model
        p1 = torch.softmax(model(torch.tensor([ids])).logits[0, -1] / 0.7, -1)  # [V]
        every_x1 = torch.cat([torch.tensor(ids).expand(len(p1), -1), torch.arange(len(p1))[:, None]], 1)
        p2_given_x1 = torch.softmax(model(every_x1).logits[:, -1] / 0.7, -1)  # [V, V]
    p1_going_on = p1.clone()
    p1_going_on[list(decoder.eos_ids())] = 0  # an end-of-sequence first token has no second token
    p2 = p1_going_on @ p2_given_x1  # the second token's marginal, through the step's own choice
    first, second = torch.zeros(len(p1)), torch.zeros(len(p1))
    for seed in range(draws):
        tokens = decoder.generate(ids, max_new_tokens=2, method=method, temperature=0.7, seed=seed).tokens
        first[tokens[0]] += 1
        if len(tokens) > 1:
            second[tokens[1]] += 1
    assert _chi_square_p_value(first, (p1 * draws).float()) > 1e-3, method
    assert _chi_square_p_value(second, (p2 * draws).float()) > 1e-3, method


def test_sampled_ppd_draws_the_base_models_first_tokens(tiny_decoder):
    """Sampled PPD on the tiny model: the first two new tokens follow the model's own distribution."""
    decoder, ids = tiny_decoder, [5, 17, 42, 9, 100, 7]
    first_two_tokens_follow_the_model(decoder, ids, "ppd")
    typical = decoder.generate(ids, max_new_tokens=8, method="ppd", temperature=0.7, acceptance="typical", seed=0)
    assert len(typical.tokens) == 8
