"""Parallel prompt decoding: guesses from prompt tokens, verified in the same forward.

One step feeds the tree of the current state: the root (the token decoded last), the guess nodes, and
prompt-token slots behind every node. From one forward:
- the acceptance rule (runtime/acceptance.py) keeps a path of guesses: for greedy decoding, each
  guess that equals the base model's greedy token at its parent (exact match);
- the token after the deepest kept node, chosen by the base model there, is the next root;
- that node's prompt tokens give the next step's guesses, and their count its state.
The KV cache keeps the root and the kept guesses, in order; everything else is dropped in place.
With exact matching every emitted token is the base model's greedy token for exactly the emitted
prefix: lossless.
"""

from dataclasses import dataclass, replace

import torch

from ppdkit.models.decoding_head import apply_residual_head
from ppdkit.models.prompt_tokens import aggregate_epts, ept_mask

from ..acceptance import Sampling, pick
from ..decoding_methods import LOOKUP_LENGTHS
from ..forward.kv_cache import KVCache
from ..forward.llama import LeanLlama
from ..trees.pruning import EarlyHead
from ..trees.tree_layout import TreeLayout
from ..trees.tree_sizer import TreeSizer
from .drafter import Drafter, Proposal, Verified, verify
from .lookup import ContextIndex, draft_chains


@dataclass
class PromptTokenSet:
    embeddings: torch.Tensor  # [k * n, H], distance-major
    weights: torch.Tensor | None  # [k, n] learned EPT weights, or None for the mean
    k: int
    n: int
    mask_kind: str
    head: tuple[torch.Tensor, torch.Tensor] | None = None  # a custom decoding head's (weight [H, H], bias [H])

    def draft_states(self, hidden: torch.Tensor, distances: torch.Tensor | slice) -> torch.Tensor:
        """[S * n, H] hidden states of S prompt tokens' EPT slots at `distances` -> [S, H], the states the LM
        head reads for their guesses: EPTs aggregated, then the custom decoding head if there is one."""
        weights = None if self.weights is None else self.weights[distances]  # [S, n]
        per_token = aggregate_epts(hidden, hidden.shape[0] // self.n, self.n, weights)  # [S, H]
        return per_token if self.head is None else apply_residual_head(per_token, *self.head)


def guesses_from(model: LeanLlama, hidden: torch.Tensor, prompts: PromptTokenSet, count: int, ranks: int) -> torch.Tensor:
    """hidden [count * n, H] of one node's prompt slots -> top-`ranks` guesses per distance [count, ranks]."""
    return model.logits(prompts.draft_states(hidden, slice(0, count))).topk(ranks, dim=-1).indices


def read_with_prompt_tokens(model: LeanLlama, cache: KVCache, ids: torch.Tensor, prompts: PromptTokenSet,
                            ranks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Read the prompt [P] as `ar` reads it, then all k prompt tokens behind its last token in a step of their own:
    (its last position's logits [V], the prompt tokens' guesses [k, ranks]); the prompt's cache entries committed,
    the prompt tokens' dropped. One forward of both would be a step of P + k n rows, which past the rows the native
    kernels hold row-invariant gave the prompt's cache other bits than `ar`'s (greedy output parted from `ar`'s on
    Q4_1 blocks and in bfloat16)."""
    p, kn = len(ids), prompts.k * prompts.n
    hidden = model.forward(model.embed_ids(ids), cache.length + torch.arange(p), cache, None)  # causal, as ar's
    cache.commit(None, p)
    logits = model.logits(hidden[-1])
    mask = torch.cat([torch.ones(kn, cache.length, dtype=torch.bool), ept_mask(prompts.k, prompts.n,
                                                                                prompts.mask_kind)], dim=1)
    positions = cache.length - 1 + torch.arange(prompts.k).repeat_interleave(prompts.n) + 1  # [k n]
    hidden = model.forward(prompts.embeddings.to(model.dtype), positions, cache, mask)
    cache.commit(torch.arange(0), kn)  # none of the prompt tokens' rows stay
    return logits, guesses_from(model, hidden, prompts, prompts.k, ranks)


def prefill(model: LeanLlama, cache: KVCache, ids: torch.Tensor, prompts: PromptTokenSet, ranks: int,
            sampling: Sampling = Sampling(), generator: torch.Generator | None = None) -> tuple[int, torch.Tensor]:
    """read_with_prompt_tokens, its first token picked: (first token, guesses [k, ranks])."""
    logits, guesses = read_with_prompt_tokens(model, cache, ids, prompts, ranks)
    return pick(logits, sampling, generator), guesses


@dataclass
class StepResult:
    accepted: list[int]  # verified guess tokens, in order
    next_token: int  # the base model's token after them, greedy or sampled (the next root)
    guesses: torch.Tensor  # [state, ranks] for the next step
    state: int
    pruned: int = 0  # rows early pruning dropped


def ppd_proposal(model: LeanLlama, prompts: PromptTokenSet, tree: TreeLayout, root: int, guesses: torch.Tensor,
                 chain: list[int] = ()) -> Proposal:
    """The tree of a state: its guess nodes filled from `guesses` [k, ranks], `chain` in its lookup nodes
    (tree.lookup of them, chain after chain), and every node's prompt-token slots behind the nodes."""
    if len(chain) != tree.lookup:
        raise ValueError(f"the tree has {tree.lookup} lookup nodes, {len(chain)} tokens were given")
    guessed = tree.nodes - tree.lookup
    node_tokens = torch.empty(tree.nodes, dtype=torch.long)
    node_tokens[0] = root
    node_tokens[1:guessed] = guesses[tree.depths[1:guessed] - 1, tree.ranks[1:guessed]]
    node_tokens[guessed:] = torch.tensor(list(chain), dtype=torch.long)
    x = torch.cat([model.embed_ids(node_tokens), prompts.embeddings.to(model.dtype)[tree.slot_embedding]])
    # the slots' aggregated states ride in the nodes' LM-head call: it reads its 28M weights once for all rows
    return Proposal(node_tokens, tree, x, extra_readout=lambda hidden: prompts.draft_states(
        hidden[tree.nodes:], tree.slot_distances))


def next_guesses(tree: TreeLayout, verified: Verified, ranks: int) -> tuple[torch.Tensor, int]:
    """The kept node's prompt tokens' guesses [count, ranks] and their count (the next state)."""
    return verified.logits[tree.guess_rows[verified.final]].topk(ranks, dim=-1).indices, tree.prompts[verified.final]


def ppd_step(model: LeanLlama, cache: KVCache, prompts: PromptTokenSet, tree: TreeLayout, root: int,
             guesses: torch.Tensor, ranks: int, sampling: Sampling = Sampling(),
             generator: torch.Generator | None = None, chain: list[int] = (),
             early: EarlyHead | None = None) -> StepResult:
    """One verify-and-guess forward (the step PpdDrafter's proposals take in the decode loop); `early` prunes the
    tree after its layer (runtime/trees/pruning.py)."""
    verified = verify(model, cache, ppd_proposal(model, prompts, tree, root, guesses, chain), sampling, generator,
                      early=early)
    new_guesses, state = next_guesses(tree, verified, ranks)
    return StepResult(verified.accepted, verified.next_token, new_guesses, state, verified.pruned)


class PpdDrafter(Drafter):
    """The prompt tokens' trees by state (the decoder's one size, or `sizer`'s choice each step). `lookup` adds the
    context's (and table's) chains under each root; `head` reads the guesses through the component's custom
    decoding head, otherwise the base LM head alone; `prune` drops nodes (and their prompt tokens) after the early
    head's layer (runtime/trees/pruning.py)."""

    def __init__(self, decoder, cache: KVCache, sizer: TreeSizer | None = None, lookup: bool = False,
                 head: bool = False, prune: bool = False, corpus: bool = False):
        super().__init__(decoder, cache)
        self.parts = decoder.draft  # a PromptTokenParts (runtime/drafters/draft_parts.py)
        self.prompts = self.parts.prompts if head else replace(self.parts.prompts, head=None)
        self.sizer, self.lookup, self.early = sizer, lookup, self.parts.early_head if prune else None
        self.guesses, self.state, self.context, self.level = None, self.prompts.k, None, 0  # level: LOOKUP_LENGTHS
        # ppd-corpus: the corpus's n-gram tables, and this answer's queries of them (CorpusNgrams.draft's `known`)
        self.corpus = self.parts.corpus.table if corpus else None
        self.known: dict = {}

    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        logits, self.guesses = read_with_prompt_tokens(self.model, self.cache, ids, self.prompts, self.parts.ranks)
        if self.lookup:
            self.context = ContextIndex(ids.tolist())
        return logits

    def propose(self, root: int) -> Proposal:
        parts, size = self.parts, None if self.sizer is None else self.sizer.size
        layout, chain = (parts.layouts if size is None else parts.size_layouts[size])[self.state], []
        if self.context is not None:
            self.context.extend([root])
            length = LOOKUP_LENGTHS[self.level]
            chains = draft_chains(self.context, parts.ngrams, 1 if self.level else parts.lookup_chains, length)
            if self.corpus is not None:  # the corpus's chain first, where it reaches the chains' length; one more
                # chain at the first level, one chain in all at the longer ones (the rows step_rows allows)
                first, _ = self.corpus.draft(self.context.tokens, length, self.known)
                chains = (([first] if len(first) == length else []) + [c for c in chains if c != first])[
                    :1 if self.level else parts.lookup_chains + 1]
            if chains:
                layout = parts.lookup_layout(self.state, len(chains), length, size)
                chain = [t for c in chains for t in c]
        return ppd_proposal(self.model, self.prompts, layout, root, self.guesses, chain)

    def accept(self, proposal: Proposal, verified: Verified) -> None:
        layout = proposal.layout
        if self.sizer is not None:
            self.sizer.observe(layout.size, sum(verified.seconds.values()), len(verified.accepted) + 1)
        self.guesses, self.state = next_guesses(layout, verified, self.parts.ranks)
        whole_chain = layout.lookup > 0 and self.state == 0 and len(verified.accepted) == LOOKUP_LENGTHS[self.level]
        self.level = min(self.level + 1, len(LOOKUP_LENGTHS) - 1) if whole_chain else 0
        if self.context is not None:
            self.context.extend(verified.accepted)
