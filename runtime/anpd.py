"""ANPD (papers/003): guesses from an adaptive multi-level n-gram module of the live text, verified as one
chain. Needs no component: any base model decodes with it (`ppdkit decode --base NAME --method anpd`).

The module counts, for every n in 2..N, which token followed each (n-1)-token context of the prompt and of
the output so far (Update: every accepted token, Algorithm 1), and guesses the most frequent follower of
the longest context that has one (Multi-Level N-gram, Algorithm 2). A step drafts K tokens by querying K
times, each guess appended to the context of the next; one forward verifies the chain under the root, and
acceptance keeps its longest verified prefix (runtime/acceptance.py), so the output is the base model's.
Defaults N = 5, K = 7: the paper's choice (section 4.4), where longer contexts and chains stopped paying.
"""

from collections.abc import Callable

import torch

from .acceptance import Sampling, pick
from .kv_cache import KVCache
from .tree_layout import TreeLayout, shape_layout
from .verify import verify_tree

MAX_N, DRAFT_LENGTH = 5, 7


class AdaptiveNgram:
    """The token counts of the text so far by context, for contexts of 1..max_n-1 tokens."""

    def __init__(self, tokens: list[int], max_n: int = MAX_N):
        if max_n < 2:
            raise ValueError(f"ANPD's n-grams need max_n >= 2 (one context token at least), not {max_n}")
        self.max_n = max_n
        self.tokens: list[int] = []
        self.counts: dict[tuple[int, ...], dict[int, int]] = {}  # context -> follower -> count
        self.best: dict[tuple[int, ...], int] = {}  # context -> its most frequent follower (ties: the latest)
        self.extend(tokens)

    def extend(self, tokens: list[int]) -> None:
        for token in tokens:
            end = len(self.tokens)
            for n in range(1, min(self.max_n - 1, end) + 1):
                context = tuple(self.tokens[end - n:end])
                followers = self.counts.setdefault(context, {})
                followers[token] = followers.get(token, 0) + 1
                if followers[token] >= followers.get(self.best.get(context, token), 0):
                    self.best[context] = token
            self.tokens.append(token)

    def query(self, text: list[int]) -> int | None:
        """The guess after `text`: the most frequent follower of its longest ending seen before."""
        for n in range(min(self.max_n - 1, len(text)), 0, -1):
            guess = self.best.get(tuple(text[len(text) - n:]))
            if guess is not None:
                return guess
        return None

    def draft(self, length: int) -> list[int]:
        """Up to `length` guesses after the text, each read with the ones before it (fewer when a context was
        never seen)."""
        text = self.tokens[-(self.max_n - 1):]
        chain: list[int] = []
        while len(chain) < length:
            guess = self.query(text)
            if guess is None:
                break
            chain.append(guess)
            text = (text + [guess])[-(self.max_n - 1):]
        return chain


def chain_layout(length: int) -> TreeLayout:
    """The layout of the root and a chain of `length` guesses under it (a tree with one branch)."""
    return shape_layout(tuple(range(-1, length)), (-1,) + (0,) * length)


def decode_anpd(decoder, ids: torch.Tensor, cache: KVCache, emit: Callable[[list[int]], bool], sampling: Sampling,
                generator: torch.Generator | None, sizer=None, max_n: int = MAX_N,
                draft_length: int = DRAFT_LENGTH) -> None:
    """Read the prompt ids [P], then draft-and-verify steps until `emit` says stop (one chain: `sizer` is None)."""
    model = decoder.model
    hidden = model.forward(model.embed_ids(ids), torch.arange(len(ids)), cache, None)  # [P, H]
    cache.commit(None, len(ids))
    root = pick(model.logits(hidden[-1]), sampling, generator)
    ngrams = AdaptiveNgram(ids.tolist(), max_n)
    done = emit([root])
    while not done:
        ngrams.extend([root])
        tokens = torch.tensor([root] + ngrams.draft(draft_length))  # [L + 1]
        _, next_token, path = verify_tree(model, cache, chain_layout(len(tokens) - 1), tokens, sampling, generator)
        accepted = tokens[path[1:]].tolist()
        ngrams.extend(accepted)
        root = next_token
        done = emit(accepted + [next_token], rows=len(tokens))
