"""The lossless claim, tested as a property: whatever the drafts hold, greedy output is plain greedy decoding.

Drafts are the prompt tokens (embeddings, EPT weights, custom decoding head), the tree a component ships,
the lookup chains and ProPD's early pruning (ppd-prune, random early heads);
none of them may change a verified token. Poisoned drafts (NaN, inf, 1e30) run on both kernel paths
(the native decoder layers and the PyTorch layers); random drafts run on the float64 tiny model against
transformers' own greedy decoding. Sampled decoding keeping the distribution is tests/test_sampling.py's.
"""

import math
import random

import pytest
import torch
from conftest import assert_gives_hf_greedy, hf_greedy, kernels_or_skip

import ppdkit.runtime.forward.linear as linear_module
from ppdkit.data_pipeline.ngram_cache import build_ngram_table
from ppdkit.models.ngram_table import NgramTable
from ppdkit.models.tiny import build_tiny_llama
from ppdkit.runtime.decoder import Decoder
from ppdkit.runtime.drafters.draft_parts import DraftParts, PromptTokenParts
from ppdkit.runtime.drafters.ppd import PromptTokenSet
from ppdkit.runtime.trees.pruning import EarlyHead
from ppdkit.runtime.trees.tree import best_tree_for_size
from ppdkit.trainer.config import CalibrateConfig

VOCAB, HIDDEN = 384, 64
TREE_SIZES = sorted({4, 6, *CalibrateConfig().sizes})  # every size the calibrate stage builds, and the small ones
POISONS = {"nan": math.nan, "+inf": math.inf, "-inf": -math.inf, "1e30": 1e30, "3e38": 3e38, "mixed": None}


def _random_p(rng: random.Random, k: int, ranks: int = 4) -> list[list[float]]:
    """A random acceptance table p[d][r] (decreasing in r, rows summing below 1): a calibrated shape."""
    table = []
    for _ in range(k):
        row = sorted((rng.random() for _ in range(ranks)), reverse=True)
        scale = rng.uniform(0.3, 0.95) / sum(row)
        table.append([x * scale for x in row])
    return table


def _random_table(rng: random.Random, max_n: int = 3, branches: int = 3, length: int = 6) -> NgramTable:
    """A corpus n-gram table of random continuations for random keys, some keyed by frequent tokens."""
    entries = {}
    for _ in range(300):
        n = rng.randint(1, max_n)
        key = tuple(rng.randrange(3, 40) for _ in range(n))
        entries[key] = [[rng.randrange(VOCAB) for _ in range(length)] for _ in range(rng.randint(1, branches))]
    return NgramTable(max_n, branches, length, entries)


def _poisoned(value: float | None, rows: int, g: torch.Generator) -> torch.Tensor:
    if value is None:  # every kind at once, beside ordinary values
        x = torch.randn(rows, HIDDEN, generator=g)
        kinds = torch.randint(0, 5, x.shape, generator=g)
        x[kinds == 0] = math.nan
        x[kinds == 1] = math.inf
        x[kinds == 2] = -3e38
        return x
    return torch.full((rows, HIDDEN), value)


def _random_early_head(g: torch.Generator, model, top_k: int, dtype=torch.float32, scale: float = 0.3) -> EarlyHead:
    """A random early prediction head after layer 1 (ppd-prune's), guessing among the whole vocabulary."""
    vocab = torch.arange(VOCAB)
    return EarlyHead((scale * torch.randn(HIDDEN, HIDDEN, generator=g)).to(dtype),
                     (scale * torch.randn(HIDDEN, generator=g)).to(dtype), vocab,
                     model.get_output_embeddings().weight.detach()[vocab].to(dtype), 1, top_k)


@pytest.mark.parametrize("path", ["native", "pytorch"])
def test_poisoned_prompt_tokens_cannot_change_greedy_output(path, monkeypatch):
    """Prompt tokens full of NaN, inf or huge values, with NaN EPT weights, random trees and lookup chains
    from a random table: ppd and ppd-lookup give ar's tokens exactly, on the native layers and on the
    PyTorch layers alike."""
    module = kernels_or_skip("native") if path == "native" else None
    monkeypatch.setattr(linear_module, "native_kernels", lambda: module)
    model, tok = build_tiny_llama()
    model = model.float().eval()
    rng, g = random.Random(0), torch.Generator().manual_seed(0)
    table = _random_table(rng)
    for case, (name, value) in enumerate(POISONS.items()):
        k, n = 1 + case % 3, 1 + case % 2
        weights = torch.full((k, n), math.nan) if case % 2 else None  # learned EPT weights, poisoned too
        head = (_poisoned(value, HIDDEN, g), _poisoned(value, 1, g)[0])  # a custom decoding head, poisoned
        prompts = PromptTokenSet(_poisoned(value, k * n, g), weights, k, n, ["ensemble", "decoder", "encoder"][case % 3],
                                 head)
        tree = best_tree_for_size(_random_p(rng, k), rng.choice([s for s in TREE_SIZES if s <= 24 and s > n]), n)
        decoder = Decoder(model, tok, PromptTokenParts.of_tree(prompts, tree, ngrams=table, lookup_chains=2))
        decoder.draft.early_head = _random_early_head(g, model, rng.choice([1, 4, 64]))  # ppd-prune's
        assert (decoder.model.native is not None) == (module is not None)  # the path under test really runs
        for seed in range(4):
            ids = [rng.randrange(3, 40) for _ in range(rng.randint(2, 16))]  # frequent keys: lookup chains happen
            ar = decoder.generate(ids, max_new_tokens=24, method="ar").tokens
            for method in ("ppd", "ppd-lookup", "ppd-head", "ppd-prune"):
                assert decoder.generate(ids, max_new_tokens=24, method=method).tokens == ar, (name, method, seed)


def test_random_drafts_never_change_greedy_output(tiny_f64):
    """The property over many random cases (float64, transformers' greedy as the reference): random
    prompts of 1 to 40 tokens, random prompt tokens of every EPT shape and mask, random trees of every
    calibrated size, lookup chains from random tables and from tables that know the true continuation
    (so chains are often accepted whole and the cache is pruned in every way)."""
    model, tok = tiny_f64
    rng, g = random.Random(1), torch.Generator().manual_seed(1)
    steps = emitted = 0
    for case in range(80):
        k, n = rng.randint(1, 4), rng.randint(1, 3)
        weights = torch.softmax(torch.randn(k, n, generator=g, dtype=torch.float64), -1) if rng.random() < 0.5 else None
        scale = rng.choice([0.02, 1.0, 50.0])
        head = (torch.randn(HIDDEN, HIDDEN, generator=g, dtype=torch.float64) / 8,
                torch.randn(HIDDEN, generator=g, dtype=torch.float64))  # a random custom decoding head
        prompts = PromptTokenSet(scale * torch.randn(k * n, HIDDEN, generator=g, dtype=torch.float64), weights, k, n,
                                 rng.choice(["ensemble", "decoder", "encoder"]), head)
        tree = best_tree_for_size(_random_p(rng, k), rng.choice([s for s in TREE_SIZES if s > n]), n)
        ids = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 40))]
        budget = rng.randint(1, 40)
        truth = hf_greedy(model, ids, budget)
        table = (build_ngram_table([ids + truth] * 2, max_n=3, branches=3, length=6) if case % 2
                 else _random_table(rng))
        parts = PromptTokenParts.of_tree(prompts, tree, ngrams=table, lookup_chains=rng.randint(1, 3))
        decoder = Decoder(model, tok, parts)
        decoder.draft.early_head = _random_early_head(g, model, rng.choice([1, 8, 128, VOCAB]), torch.float64)
        eos = decoder.eos_ids()
        for method in ("ar", "ppd", "ppd-lookup", "ppd-head", "ppd-prune"):
            out = decoder.generate(ids, max_new_tokens=budget, method=method)
            assert out.tokens == truth[:len(out.tokens)], (case, method)
            assert len(out.tokens) == budget or out.tokens[-1] in eos, (case, method)
            if method == "ppd-lookup":
                steps, emitted = steps + out.steps, emitted + len(out.tokens)
    assert emitted / steps > 1.3  # lookup chains were really accepted: the pruning paths ran


@pytest.mark.parametrize("method", ["anpd", "self-draft"])
def test_the_drafters_without_a_component_reproduce_transformers_greedy_in_float64(tiny_f64, method):
    """ANPD's n-grams and Self-Draft's branches and context cache (with a random corpus table every other case)."""
    model, tok = tiny_f64
    rng = random.Random(1)
    for case in range(24):
        decoder = Decoder(model, tok, DraftParts(ngrams=_random_table(rng) if case % 2 else None))
        ids = [rng.randrange(3, VOCAB if case % 3 else 20) for _ in range(rng.randint(1, 48))]  # 0-2: special
        assert_gives_hf_greedy(decoder, model, method, ids, rng.randint(1, 48), case)
