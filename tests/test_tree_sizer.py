"""Dynamic tree size (ProPD paper 4.2): the online latency model, the size choice, and decoding with it."""

import random

import pytest
import torch
from conftest import hf_greedy
from test_draft_heads import _decoder, _heads, _random_tree
from test_lossless import _random_p

from ppdkit.runtime.decoder import Decoder
from ppdkit.runtime.drafters.draft_parts import PromptTokenParts
from ppdkit.runtime.drafters.ppd import PromptTokenSet
from ppdkit.runtime.trees.tree import best_tree_for_size
from ppdkit.runtime.trees.tree_sizer import LatencyModel, TreeSizer, weighted_line

HIDDEN, VOCAB = 64, 384


def test_weighted_line_is_least_squares():
    assert weighted_line([1, 2, 3], [3, 5, 7], [1, 1, 1]) == pytest.approx((1.0, 2.0))
    # a heavily weighted point pulls the line through itself
    b0, b1 = weighted_line([0, 1, 2], [0, 1, 10], [1, 1, 1e6])
    assert b0 + b1 * 2 == pytest.approx(10, rel=1e-3)
    assert weighted_line([4, 4], [1.0, 3.0], [1, 1]) == (2.0, 0.0)  # one row count: a flat line


def test_the_latency_model_converges_on_a_synthetic_cost_curve_and_follows_a_change():
    rng = random.Random(0)
    model = LatencyModel()
    for _ in range(300):
        rows = rng.choice([4, 8, 12, 16, 24, 32, 48, 64])
        model.observe(rows, 0.012 + 0.0004 * rows + rng.gauss(0, 0.0005))
    b0, b1 = model.coefficients()
    assert b0 == pytest.approx(0.012, rel=0.1) and b1 == pytest.approx(0.0004, rel=0.1)
    for _ in range(300):  # the machine slows down (another job): recent times win, old ones fade
        rows = rng.choice([4, 8, 12, 16, 24, 32, 48, 64])
        model.observe(rows, 0.024 + 0.0008 * rows + rng.gauss(0, 0.0005))
    b0, b1 = model.coefficients()
    assert b0 == pytest.approx(0.024, rel=0.1) and b1 == pytest.approx(0.0008, rel=0.1)


def test_the_sizer_takes_the_fastest_size_and_grows_when_guesses_are_accepted_more():
    taus = {4: 1.3, 8: 1.55, 16: 1.75, 32: 1.9, 64: 2.0}
    rows = {s: s for s in taus}

    def cost(r):  # seconds: a fixed part and a per-row part, as measured on CPUs
        return 0.015 + 0.0003 * r

    sizer = TreeSizer(taus, rows, 4, every=4)
    for size in taus:  # a profile: every size once
        sizer.latency.observe(rows[size], cost(rows[size]))
    expected = max(taus, key=lambda s: taus[s] / cost(s))
    assert sizer.best() == expected == 8
    for _ in range(200):  # the text repeats itself: far more accepted than calibrated, whatever the tree
        sizer.observe(rows[sizer.size], cost(rows[sizer.size]), 1 + 3 * (taus[sizer.size] - 1))  # a mean
    assert sizer.ratio == pytest.approx(3.0, rel=0.05)
    assert sizer.size == max(taus, key=lambda s: (1 + 3 * (taus[s] - 1)) / cost(s)) == 16
    assert len(sizer.chosen) == 200 and sizer.chosen[:4] == [4] * 4 and sizer.chosen[-1] == 16  # every 4 steps


def test_dynamic_size_decoding_is_still_greedy_decoding(tiny_f64):
    """ppd, ppd-lookup and both draft heads with a size chosen per step: transformers' greedy tokens."""
    model, tok = tiny_f64
    rng, g = random.Random(5), torch.Generator().manual_seed(5)
    for case in range(6):
        k = rng.randint(1, 3)
        prompts = PromptTokenSet(torch.randn(k, HIDDEN, generator=g, dtype=torch.float64), None, k, 1, "ensemble")
        table = _random_p(rng, k)
        trees = {size: best_tree_for_size(table, size, 1) for size in (4, 8, 16, 32)}
        ppd = Decoder(model, tok, PromptTokenParts(prompts=prompts, trees=trees, size=8, dynamic_size=True))
        depth = rng.randint(1, 4)
        kind = ("feature", "medusa")[case % 2]
        heads = _decoder(model, tok, _heads(kind, depth, g, model, torch.arange(VOCAB), dtype=torch.float64),
                         _random_tree(rng, depth, 8))
        heads.draft.trees = {size: _random_tree(rng, depth, size) for size in (4, 8, 16)}
        heads.draft.taus = {4: 1.2, 8: 1.4, 16: 1.5}
        heads.draft.dynamic_size, heads.draft.size = True, 8
        ids = [rng.randrange(3, 40) for _ in range(rng.randint(1, 20))]
        truth = hf_greedy(model, ids, 40)
        for decoder, method in ((ppd, "ppd"), (ppd, "ppd-lookup"), (heads, "feature-head" if kind == "feature"
                                                                     else "medusa")):
            out = decoder.generate(ids, max_new_tokens=40, method=method)
            assert out.tokens == truth[:len(out.tokens)], (case, method)
            assert len(out.tree_sizes) == out.steps - 1  # every step but the prefill verifies a tree
            assert set(out.tree_sizes) <= set(decoder.draft.taus)
