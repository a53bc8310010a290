"""Grown draft trees (ppdkit/runtime/trees/grown_tree.py: the feature head's tree grown from its own confidence, ANPD's
chain merged in): the choice of proposals by hand, the size chosen for what it costs, and the lossless property
whatever the head holds (poisoned heads on both kernel paths, random heads in float64 against transformers'
greedy, repetitive text so the chains are accepted), and sampled decoding that keeps the model's distribution."""

import dataclasses
import math
import random

import pytest
import torch
from conftest import hf_greedy, tiny_model_on
from test_draft_heads import HIDDEN, VOCAB, _decoder, _heads
from test_sampling import first_two_tokens_follow_the_model

from ppdkit.runtime.trees.grown_tree import (ChainSource, Proposals, StepCost, add_chain, best_count, breadth_first,
                                             by_value, latency_model, tree_shape)

GROWN = ("feature-grown", "feature-grown-anpd")


def test_proposals_are_chosen_by_value_and_keep_their_paths():
    found = Proposals()
    a = found.add(math.log(0.6), 1, 10, -1)
    found.add(math.log(0.3), 1, 11, -1)
    found.add(math.log(0.6 * 0.5), 2, 12, a)
    add_chain(found, [10, 20, 21], rate=0.5)  # 10 is the head's first proposal: its value stays the higher
    assert found.values[a] == math.log(0.6) and len(found.values) == 5
    assert found.parents[3] == a and found.parents[4] == 3  # 20 under the head's 10, then 21
    assert found.values[3] == pytest.approx(2 * math.log(0.5)) and found.values[4] == pytest.approx(3 * math.log(0.5))
    chosen = by_value(found, 4)
    assert chosen == [a, 1, 2, 3]  # 0.6, then 0.3 (depth 1) before the equally valued 0.3 (depth 2), then 0.25
    assert tree_shape(chosen, found.parents) == ((-1, 0, 0, 1, 1), (-1, 0, 1, 0, 1))
    add_chain(found, [30], rate=0.9)  # a confident chain outranks the head's second guess
    assert by_value(found, 2) == [5, a]


def test_a_tree_shape_takes_one_order_whatever_order_its_nodes_were_chosen_in():
    """breadth_first: every order of one tree's proposals (parents first) gives one node order, so one layout; the
    nodes keep their parents and each node's children keep their order (their ranks)."""
    rng = random.Random(5)
    for _ in range(200):
        parents = [-1]  # proposal 0 under the root, each later one under the root or an earlier proposal
        for i in range(1, rng.randint(1, 9)):
            parents.append(rng.randrange(-1, i))
        shapes = set()
        for _ in range(6):  # parents-first orders of the same proposals, siblings kept in one order
            chosen = []
            waiting = sorted(range(len(parents)))
            while waiting:
                p = rng.choice([q for q in waiting if parents[q] == -1 or parents[q] in chosen])
                later = [q for q in waiting if parents[q] == parents[p] and q < p]
                p = later[0] if later else p  # a node's earlier siblings first: their ranks stay
                chosen.append(p)
                waiting.remove(p)
            order = breadth_first(chosen, parents)
            assert sorted(order) == sorted(chosen)
            assert all(parents[p] == -1 or order.index(parents[p]) < order.index(p) for p in order)
            siblings = lambda seq, parent: [q for q in seq if parents[q] == parent]  # noqa: E731
            assert all(siblings(order, p) == siblings(chosen, p) for p in [-1, *chosen])
            shapes.add(tree_shape(order, parents))
        assert len(shapes) == 1


def test_the_chain_rate_counts_guesses_right_after_right_predecessors():
    chains = ChainSource([1, 2, 3, 1, 2, 3, 1])
    assert chains.draft(2) == [3, 1, 2, 3, 1, 2, 3] and chains.rate == 0.5
    chains.update([3, 1, 2, 3, 1, 2, 3], [3, 1], 9)  # two right, the third known token (9) wrong
    assert (chains.right, chains.tried) == (3.0, 5.0)
    chains.update([3, 1], [3], 1)  # both right, nothing known wrong
    assert (chains.right, chains.tried) == (5.0, 7.0)


def test_the_tree_takes_the_proposals_that_pay_for_their_rows():
    values = [math.log(p) for p in (0.9, 0.8, 0.2, 0.05)]
    flat = [1.0] * 6  # rows cost nothing: every proposal worth anything is verified
    assert best_count(values, flat, 1.0) == 4
    steep = [0.0] + [1.0 + 0.5 * (rows - 1) for rows in range(1, 6)]  # each row half a one-token step
    assert best_count(values, steep, 1.0) == 2  # 2.7 tokens for 2 s beats 1.9 for 1.5 and 2.9 for 2.5
    assert best_count(values, steep, 0.1) == 0  # guesses kept a tenth as often as valued: none pays
    assert best_count(values, steep, 1.0, overhead=100.0) == 4  # drafting dominates: rows are nearly free


def test_no_proposal_below_the_floor_is_verified_and_one_above_it_is():
    """StepCost.floor, what growth stops at: a proposal worth less is never among the ones best_count takes,
    whatever the other proposals; one worth more is, while the tree has rows to spare (random trees and costs)."""
    rng = random.Random(0)
    above = 0
    for _ in range(2000):
        values = [math.log(rng.uniform(0.01, 1.0)) for _ in range(rng.randint(0, 9))]
        b0, b1 = rng.uniform(0.005, 0.03), rng.uniform(0.0001, 0.01)
        cost = StepCost([b0 + b1 * rows for rows in range(17)], rng.uniform(0.2, 1.5), rng.uniform(0.0, 0.01))
        floor = cost.floor(values)
        below = sorted(values + [floor - 1e-6], reverse=True)
        assert cost.count(below) <= sum(v > floor for v in values)  # the new proposal is never taken
        if all(v > floor + 1e-6 for v in values):  # then a proposal just above the floor comes last, and is taken
            assert cost.count(sorted(values, reverse=True) + [floor + 1e-6]) == len(values) + 1
            above += 1
    assert above > 100
    assert StepCost([0.01] * 8, 1.0, 0.0).floor([0.0]) == -math.inf  # rows come free: nothing is cut


def test_a_drafter_prices_its_rows_from_the_profiles_trees_of_its_own_size():
    """A feature head's profile holds its calibrated trees of up to 88 rows, whose time per row (float32 on a 2-core
    AVX2 EPYC, ms) is far above an 8-row tree's: a line through all of them made no guess pay."""
    sizes = {2: 45.0, 4: 49.0, 8: 81.0, 32: 380.0, 88: 1079.0}
    profile = {"one_token_ms": 43.6, "rows": [{"size": s, "latency_ms": ms + 2.0, "draft_ms": 2.0}
                                              for s, ms in sizes.items()]}
    own = latency_model(profile, 8, most_rows=8)
    assert sorted(own.times) == [1, 2, 4, 8]
    every = latency_model(profile, 8)
    assert sorted(every.times) == [1, 2, 4, 8, 32, 88]
    assert 2 * own.coefficients()[1] < every.coefficients()[1]  # seconds per row


@pytest.mark.parametrize("path", ["native", "pytorch"])
def test_poisoned_and_random_heads_cannot_change_greedy_output(path, monkeypatch):
    """Feature heads full of NaN, inf or huge values, or random ones, grow garbage trees; the output is ar's."""
    model, tok = tiny_model_on(path, monkeypatch)
    rng, g = random.Random(0), torch.Generator().manual_seed(0)
    for case, value in enumerate((None, math.nan, math.inf, -math.inf, 1e30, 3e38)):
        heads = _heads("feature", 4, g, model, torch.arange(3, VOCAB, 3), scale=rng.choice([0.1, 3.0]))
        if value is not None:
            heads = dataclasses.replace(heads, tensors=tuple(torch.full_like(t, value) if i == case % 3 else t
                                                             for i, t in enumerate(heads.tensors)))
        decoder = _decoder(model, tok, heads, None)
        assert (decoder.model.native is not None) == (path == "native")  # the path under test really runs
        for seed in range(3):
            ids = [rng.randrange(3, VOCAB) for _ in range(rng.randint(1, 16))] * rng.choice([1, 3])
            plain = decoder.generate(ids, max_new_tokens=24, method="ar").tokens
            for method in GROWN:
                assert decoder.generate(ids, max_new_tokens=24, method=method).tokens == plain, (case, seed, method)


def test_grown_trees_reproduce_transformers_greedy_in_float64(tiny_f64):
    """Random heads in float64 against transformers' greedy; repeated prompts give chains that are accepted, so
    multi-token steps and the pruning of the cache to the kept path really run."""
    model, tok = tiny_f64
    rng, g = random.Random(5), torch.Generator().manual_seed(5)
    emitted = steps = 0
    for case in range(24):
        vocab = torch.tensor(sorted(rng.sample(range(VOCAB), rng.choice([16, 128, VOCAB]))))
        heads = _heads("feature", 4, g, model, vocab, scale=rng.choice([0.01, 0.3, 3.0]), dtype=torch.float64)
        decoder = _decoder(model, tok, heads, None)
        ids = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 12))] * rng.choice([1, 4])
        budget = rng.randint(1, 40)
        truth = hf_greedy(model, ids, budget)
        for method in GROWN:
            out = decoder.generate(ids, max_new_tokens=budget, method=method)
            assert out.tokens == truth[:len(out.tokens)] and len(out.tokens) in (budget, len(truth)), (case, method)
            if method == "feature-grown-anpd":
                emitted, steps = emitted + len(out.tokens), steps + out.steps
    assert emitted / steps > 1.3  # chains were accepted


def test_sampled_grown_trees_draw_the_base_models_first_tokens(tiny_f64):
    model, tok = tiny_f64
    heads = _heads("feature", 4, torch.Generator().manual_seed(6), model, torch.arange(VOCAB), scale=0.01,
                   dtype=torch.float64)
    decoder = _decoder(model, tok, heads, None)
    assert HIDDEN == model.config.hidden_size
    first_two_tokens_follow_the_model(decoder, [5, 17, 42, 5, 17, 42, 5, 17], "feature-grown-anpd")


def test_a_draft_that_costs_more_than_it_keeps_runs_plain_steps(monkeypatch):
    """Never a slowdown: a grown tree whose drafting takes far longer than a forward (here 40 ms against the tiny
    model's ~1 ms) decodes mostly plain steps, a drafted one now and then, with ar's tokens; given its tree size by
    name, it drafts every step, as asked."""
    import time

    from ppdkit.runtime.batching.drafting_choice import PROBE
    from ppdkit.runtime.trees.grown_tree import FeatureDrafter

    model, tok = tiny_model_on("pytorch", monkeypatch)
    heads = _heads("feature", 4, torch.Generator().manual_seed(7), model, torch.arange(VOCAB), scale=0.3)
    grow = FeatureDrafter.grow

    def slow_grow(self, *args, **kwargs):
        time.sleep(0.04)
        return grow(self, *args, **kwargs)

    monkeypatch.setattr(FeatureDrafter, "grow", slow_grow)
    decoder = _decoder(model, tok, heads, None)
    ids = [5, 9, 14, 5, 9, 14, 5, 9]
    plain = decoder.generate(ids, max_new_tokens=48, method="ar").tokens
    out = decoder.generate(ids, max_new_tokens=48, method="feature-grown")
    assert out.tokens == plain
    drafted = sum(rows > 1 for rows in out.rows_per_step)
    # the first two steps (the first reads the prompt: unweighed), then two a probe once in PROBE: the rest plain
    assert drafted <= 2 + 2 * (len(out.rows_per_step) // PROBE + 1), out.rows_per_step
    assert drafted < len(out.rows_per_step) / 3
    choice = decoder.drafting_choices["feature-grown"]  # what it measured carries over to the next answer
    assert choice.seen[(1, False)] > 0 and choice.figures[(1, True)][1] > 0.04
    again = decoder.generate(ids, max_new_tokens=48, method="feature-grown")
    assert again.tokens == plain and sum(rows > 1 for rows in again.rows_per_step) < len(again.rows_per_step) / 3
    decoder.draft.grown_nodes = 4  # a tree size given by name
    out = decoder.generate(ids, max_new_tokens=48, method="feature-grown")
    assert out.tokens == plain and min(out.rows_per_step) > 1, out.rows_per_step
