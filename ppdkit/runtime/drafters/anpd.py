"""ANPD (Adaptive N-gram Parallel Decoding): guesses from an adaptive multi-level n-gram module of the live
text, verified as one chain. Needs no component: any base model decodes with it
(`ppdkit decode --base NAME --method anpd`).

The module counts, for every n in 2..N, which token followed each (n-1)-token context of the prompt and of
the output so far (Update: every accepted token, Algorithm 1), and guesses the most frequent follower of
the longest context that has one (Multi-Level N-gram, Algorithm 2). A step drafts K tokens by querying K
times, each guess appended to the context of the next; one forward verifies the chain under the root, and
acceptance keeps its longest verified prefix (runtime/acceptance.py), so the output is the base model's.
Defaults N = 5, K = 7: the paper's choice (section 4.4), where longer contexts and chains stopped paying.
"""

import torch

from ..forward.kv_cache import KVCache
from ..trees.tree_layout import TreeLayout, shape_layout
from .drafter import Drafter, Proposal, Verified

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


class AnpdDrafter(Drafter):
    """A chain of up to `draft_length` guesses from the live text's n-grams of up to `max_n` tokens."""

    def __init__(self, decoder, cache: KVCache, max_n: int = MAX_N, draft_length: int = DRAFT_LENGTH):
        super().__init__(decoder, cache)
        self.max_n, self.draft_length, self.ngrams = max_n, draft_length, None

    def prompt_read(self, ids: torch.Tensor, hidden: torch.Tensor, states: torch.Tensor | None) -> None:
        self.ngrams = AdaptiveNgram(ids.tolist(), self.max_n)

    def propose(self, root: int) -> Proposal:
        self.ngrams.extend([root])
        chain = self.ngrams.draft(self.draft_length)
        return Proposal(torch.tensor([root] + chain), chain_layout(len(chain)))  # [L + 1]

    def accept(self, proposal: Proposal, verified: Verified) -> None:
        self.ngrams.extend(verified.accepted)
