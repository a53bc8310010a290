"""Self-Draft (Multi-Branch Self-Drafting): drafting branches of the model's own guesses ride in the verification
forward. No component is needed; a component's corpus n-gram table (models/ngram_table.py) adds candidates when present.

Each step feeds one sequence: the root (the token decoded last), a trie of candidate continuations of the
root, and N drafting branches of up to L tokens. Candidates see the committed text and their own path (as every
tree here); branch b's tokens see the committed text, the root and branch b's earlier tokens (block-diagonal
causal masks, figure 3b), never a candidate or another branch. Each branch row's greedy guess is a draft of
the token after it:
- the guess after a branch's last token is appended to it; once it holds L tokens its first is dropped too
  (Algorithm 1's sliding window);
- every G consecutive branch tokens with the guess after the last form a (G+1)-gram; its first token keys an
  LRU pool of continuations (the other G tokens): the context cache.
- every G + 1 consecutive tokens of the committed text (prompt and answer) are put in the same pool, after the
  branches' (the authors' code does this, `ContextCache.update_cache`; the paper's text does not say so): the
  text's own n-grams are what a copying answer (code, lists, quotes) repeats.
The next step's candidates are the pool's continuations of the new root (most recent first), then the corpus
table's for the text's ending, at most C, merged into a trie. Only the verified path's cache entries are
kept (a branch row's are discarded as a prompt token's are) and acceptance is the runtime's
(runtime/acceptance.py), so the output is the base model's: greedy exactly, sampled in distribution.

Branches start as one token each, drawn from the prompt with a fixed seed (decoding repeats itself).
The paper's N = L = 6, G = 4 are for an A100, where rows cost almost nothing; on a few CPU cores every row of a
step costs, so ppdkit's defaults are smaller (runtime/decoding_methods.py says why, docs/history.md what it cost).
"""

import random
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from ..acceptance import greedy_tokens
from ..forward.kv_cache import KVCache
from ..trees.tree_layout import TreeLayout, shape_layout
from .drafter import Drafter, Proposal, Verified

POOL = 8  # continuations kept per key token in the context cache (least recently used dropped first)


@dataclass
class Drafts:
    """The branches and the context cache of one generate call."""

    branches: list[list[int]]
    gram: int  # G
    length: int  # L
    pool: dict[int, OrderedDict] = field(default_factory=dict)  # key token -> {continuation: None}, newest last
    read: int = 0  # the text's n-grams starting before this position are in the pool

    @classmethod
    def start(cls, prompt: list[int], branches: int, length: int, gram: int) -> "Drafts":
        rng = random.Random(0)
        return cls([[rng.choice(prompt)] for _ in range(branches)], gram, length)

    def candidates(self, root: int, text: list[int], table, count: int) -> list[list[int]]:
        """Up to `count` distinct continuations of `root`: the context cache's newest first, then the table's."""
        found = list(reversed(self.pool.get(root, {})))
        if table is not None:
            found += [tuple(c[:self.gram]) for c in table.continuations(text)]
        out: list[list[int]] = []
        for chain in found:
            if chain and list(chain) not in out:
                out.append(list(chain))
        return out[:count]

    def _remember(self, gram: list[int]) -> None:
        """Put a (G+1)-gram in the pool as its first token's newest continuation."""
        pool = self.pool.setdefault(gram[0], OrderedDict())
        pool[tuple(gram[1:])] = None
        pool.move_to_end(tuple(gram[1:]))
        if len(pool) > POOL:
            pool.popitem(last=False)

    def update(self, guesses: list[list[int]]) -> None:
        """guesses[b][j]: the model's greedy token after branch b's token j, this step."""
        for branch, after in zip(self.branches, guesses):
            for j in range(self.gram - 1, len(branch)):
                self._remember(branch[j - self.gram + 1:j + 1] + [after[j]])
            branch.append(after[-1])
            if len(branch) > self.length:
                del branch[0]

    def read_text(self, text: list[int]) -> None:
        """Pool the committed text's (G+1)-grams not pooled yet (the prompt at first, then each step's tokens)."""
        for i in range(self.read, len(text) - self.gram):
            self._remember(text[i:i + self.gram + 1])
        self.read = max(self.read, len(text) - self.gram)


def trie(root: int, chains: list[list[int]]) -> tuple[list[int], tuple[int, ...]]:
    """The root and the chains' tokens merged on common prefixes: (tokens, parents), parents first."""
    tokens, parents, children = [root], [-1], [{}]
    for chain in chains:
        node = 0
        for token in chain:
            if token not in children[node]:
                children[node][token] = len(tokens)
                tokens.append(token)
                parents.append(node)
                children.append({})
            node = children[node][token]
    return tokens, tuple(parents)


def step_inputs(tokens: list[int], layout: TreeLayout, branches: list[list[int]]
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The step's (tokens [T], offsets from the root [T], mask [T, T] bool): the trie's nodes as `layout` lays
    them out, then the branches' tokens in order, each seeing the root and its own branch's past. The branch
    rows are built as Python lists: a few dozen rows, where per-element tensor ops would cost more."""
    nodes = layout.size
    rows = nodes + sum(len(b) for b in branches)
    below: list[list[bool]] = []
    branch_offsets: list[int] = []  # each branch token's distance from the root
    start = nodes
    for branch in branches:
        for j in range(len(branch)):
            row = [False] * rows
            row[0] = True  # the root: the text the branch continues
            row[start:start + j + 1] = [True] * (j + 1)  # the branch's own past
            below.append(row)
            branch_offsets.append(j + 1)
        start += len(branch)
    mask = torch.cat([torch.cat([layout.mask, torch.zeros(nodes, rows - nodes, dtype=torch.bool)], 1),
                      torch.tensor(below, dtype=torch.bool).reshape(rows - nodes, rows)])
    offsets = torch.cat([layout.offsets, torch.tensor(branch_offsets, dtype=torch.long)])  # [T]
    return torch.tensor(tokens + sum(branches, [])), offsets, mask


class SelfDrafter(Drafter):
    """The root's candidates from the context cache (and the corpus table) as a trie, and the drafting branches as
    extra rows of the same forward; `nodes`, the most rows of a step, sizes the cache (Decoder.step_rows)."""

    def __init__(self, decoder, cache: KVCache, branches: int = 2, branch_length: int = 4, gram: int = 3,
                 candidates: int = 4, nodes: int = 0):
        super().__init__(decoder, cache)
        self.shape, self.candidates = (branches, branch_length, gram), candidates
        self.drafts, self.text = None, []

    def prompt_read(self, ids: torch.Tensor, hidden: torch.Tensor, states: torch.Tensor | None) -> None:
        branches, length, gram = self.shape
        self.drafts, self.text = Drafts.start(ids.tolist(), branches, length, gram), ids.tolist()

    def propose(self, root: int) -> Proposal:
        self.text.append(root)
        self.drafts.read_text(self.text)
        tokens, parents = trie(root, self.drafts.candidates(root, self.text, self.decoder.draft.ngrams, self.candidates))
        layout = shape_layout(parents, (-1,) + (0,) * (len(parents) - 1))  # ranks: unused by acceptance here
        inputs, offsets, mask = step_inputs(tokens, layout, self.drafts.branches)
        return Proposal(inputs[:len(tokens)], layout, self.model.embed_ids(inputs), offsets, mask,
                        extra_readout=lambda hidden: hidden[len(tokens):])  # the branches' rows

    def accept(self, proposal: Proposal, verified: Verified) -> None:
        guesses = greedy_tokens(verified.logits[proposal.layout.nodes:]).tolist()  # [rows of the branches]
        split, start = [], 0
        for branch in self.drafts.branches:
            split.append(guesses[start:start + len(branch)])
            start += len(branch)
        self.drafts.update(split)
        self.text += verified.accepted
