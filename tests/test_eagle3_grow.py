"""EAGLE-3's tree grown in one native call (runtime/kernels/eagle3_grow.cpp) against the level-by-level growth it
replaces where the CPU kernels run the draft: the same proposals, to the bit, and the same draft rows written."""

import random

import pytest
import torch
from conftest import tiny_model_on
from test_draft_heads import VOCAB
from test_eagle3 import _decoder, _draft_tensors

from ppdkit.runtime.drafters.eagle3_drafter import Eagle3Drafter, native_grows
from ppdkit.runtime.forward.linear import SKINNY_MAX_ROWS
from ppdkit.runtime.trees.grown_tree import StepCost
from ppdkit.runtime.trees.tree_values import FEATURES, TreeValues


def _fields(found) -> tuple:
    return found.values, found.depths, found.tokens, found.parents, found.drafts


@pytest.mark.parametrize("valued", [False, True], ids=["draft-probabilities", "tree-values"])
@pytest.mark.parametrize("sized", [False, True], ids=["fixed", "sized"])
@pytest.mark.parametrize("bf16", [False, True], ids=["float32", "bfloat16"])
def test_the_native_grow_is_the_level_by_level_one(valued, sized, bf16, monkeypatch):
    """Random drafts (confident to flat), random tree values, steps sized by random costs or fixed: both growths give
    the same proposals (values, depths, tokens, parents, the draft's log-probabilities) and the same draft rows."""
    model, tok = tiny_model_on("native", monkeypatch)
    if bf16:
        model = model.bfloat16()
    rng = random.Random(7)
    vocab = torch.arange(3, VOCAB, 3)
    drafted = levels = 0
    for trial in range(8):
        tensors = _draft_tensors(model, vocab, trial, scale=rng.choice([0.1, 0.5, 3.0]))
        if trial % 2:
            tensors["lm_head.weight"] = 10 * tensors["lm_head.weight"]  # confident: deep, narrow trees
        decoder = _decoder(model, tok, tensors, vocab)
        if valued:
            decoder.draft.tree_values = TreeValues(tuple(rng.uniform(-2, 2) for _ in FEATURES), {})
        beam, depth, nodes = rng.choice([(2, 5, 8), (3, 4, 12), (4, 6, 16)])
        drafter = Eagle3Drafter(decoder, decoder.model.new_cache(96), nodes=nodes, beam=beam, depth=depth)
        assert native_grows(decoder.model, drafter.draft, beam)  # the path under test really runs
        ids = torch.tensor([rng.randrange(VOCAB) for _ in range(12)])
        drafter.prefill(ids[:10])
        # the pending 10 rows (the prompt's here) are read in the native call too; for half the trials they go after
        # earlier steps' rows, as a step's do
        if trial % 4 < 2:
            drafter.draft_cache.length = rng.randrange(3, 20)
        pending, cache = (drafter.pending_states, drafter.pending_tokens), drafter.draft_cache
        before = cache.length
        cost = None
        if sized:
            b1 = 10 ** rng.uniform(-5, -3)
            cost = StepCost([0.01 + b1 * rows for rows in range(nodes + 1)], rng.uniform(0.3, 1.0), 0.002)
        grown, rows = [], []
        for native in (False, True):
            cache.k[..., before:] = 0
            cache.v[:, :, before:] = 0
            cache.length, (drafter.pending_states, drafter.pending_tokens) = before, pending
            if native:
                grown.append(drafter.grow_native(int(ids[10]), nodes - 1, cost))
            else:
                grown.append(drafter.grow_levels(drafter._read_verified(int(ids[10])), nodes - 1, cost))
            assert cache.length == before + 10 and drafter.pending_states is None  # the read rows kept, no tree's
            rows.append((cache.k[..., before:].clone(), cache.v[:, :, before:].clone()))
        assert _fields(grown[0]) == _fields(grown[1]), trial
        assert all(torch.equal(a, b) for a, b in zip(*rows)), trial  # the read rows and the last tree's
        drafted += len(grown[0].values)
        levels += max(grown[0].depths)
    assert drafted >= 40 and levels >= 16  # trees of several levels were grown, not only the first


@pytest.mark.parametrize("sized", [False, True], ids=["fixed", "sized"])
@pytest.mark.parametrize("pending", [6, SKINNY_MAX_ROWS + 4], ids=["read-in-the-call", "read-before"])
def test_the_native_parallel_grow_is_the_python_one(sized, pending, monkeypatch):
    """The draft with prompt tokens (Eagle3ParallelDrafter): the native call's tree over its one readout is
    grow_marginals's, to the bit, and both write the same read rows: a step's few rows read in the call, or a prompt's
    too many for it read before."""
    from ppdkit.runtime.drafters.eagle3_drafter import Eagle3ParallelDrafter

    model, tok = tiny_model_on("native", monkeypatch)
    rng = random.Random(11)
    vocab = torch.arange(3, VOCAB, 3)
    drafted = 0
    for trial in range(6):
        tensors = _draft_tensors(model, vocab, trial, scale=rng.choice([0.1, 0.5, 3.0]))
        decoder = _decoder(model, tok, tensors, vocab)
        g = torch.Generator().manual_seed(trial)
        count = rng.choice([1, 3, 5])
        decoder.draft.eagle3.parallel = tuple(torch.randn(count, model.config.hidden_size, generator=g)
                                              for _ in range(2))
        beam, nodes = rng.choice([(2, 8), (3, 12)])
        drafter = Eagle3ParallelDrafter(decoder, decoder.model.new_cache(SKINNY_MAX_ROWS + 32), nodes=nodes,
                                        beam=beam, depth=5)
        assert native_grows(decoder.model, drafter.draft, beam)
        ids = torch.tensor([rng.randrange(VOCAB) for _ in range(pending + 1)])
        drafter.prefill(ids[:pending])
        saved, cache = (drafter.pending_states, drafter.pending_tokens), drafter.draft_cache
        cost = StepCost([0.01 + 1e-4 * rows for rows in range(nodes + 1)], rng.uniform(0.3, 1.0), 0.002) if sized \
            else None
        grown, rows = [], []
        for native in (False, True):
            cache.k.zero_(), cache.v.zero_()
            cache.length, (drafter.pending_states, drafter.pending_tokens) = 0, saved
            grown.append((drafter.grow_native if native else drafter.grow_marginals)(int(ids[-1]), nodes - 1, cost))
            assert cache.length == pending and drafter.pending_states is None  # the prompt tokens' rows not kept
            rows.append((cache.k[..., :pending].clone(), cache.v[:, :, :pending].clone()))
        assert _fields(grown[0]) == _fields(grown[1]), trial
        assert all(torch.equal(a, b) for a, b in zip(*rows)), trial
        drafted += len(grown[0].values)
    assert drafted >= 20
