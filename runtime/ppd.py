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

from dataclasses import dataclass

import torch

from ppdkit.models.prompt_tokens import aggregate_epts, ept_mask

from .acceptance import Sampling, choose, pick
from .kv_cache import KVCache
from .llama import LeanLlama
from .tree_layout import TreeLayout


@dataclass
class PromptTokenSet:
    embeddings: torch.Tensor  # [k * n, H], distance-major
    weights: torch.Tensor | None  # [k, n] learned EPT weights, or None for the mean
    k: int
    n: int
    mask_kind: str


def guesses_from(model: LeanLlama, hidden: torch.Tensor, prompts: PromptTokenSet, count: int, ranks: int) -> torch.Tensor:
    """hidden [count * n, H] of one node's prompt slots -> top-`ranks` guesses per distance [count, ranks]."""
    weights = None if prompts.weights is None else prompts.weights[:count]
    per_token = aggregate_epts(hidden, count, prompts.n, weights)  # [count, H]
    return model.logits(per_token).topk(ranks, dim=-1).indices


def prefill(model: LeanLlama, cache: KVCache, ids: torch.Tensor, prompts: PromptTokenSet, ranks: int,
            sampling: Sampling = Sampling(), generator: torch.Generator | None = None) -> tuple[int, torch.Tensor]:
    """Read the prompt [P] with all k prompt tokens behind its last token: (first token, guesses [k, ranks])."""
    p, kn = len(ids), prompts.k * prompts.n
    mask = torch.zeros(p + kn, p + kn, dtype=torch.bool)
    mask[:p, :p] = torch.ones(p, p, dtype=torch.bool).tril()
    mask[p:, :p] = True
    mask[p:, p:] = ept_mask(prompts.k, prompts.n, prompts.mask_kind)
    mask = torch.cat([torch.ones(p + kn, cache.length, dtype=torch.bool), mask], dim=1)
    positions = torch.cat([torch.arange(p), p - 1 + torch.arange(prompts.k).repeat_interleave(prompts.n) + 1])
    x = torch.cat([model.embed_ids(ids), prompts.embeddings.to(model.dtype)])
    hidden = model.forward(x, cache.length + positions, cache, mask)
    first = pick(model.logits(hidden[p - 1]), sampling, generator)
    guesses = guesses_from(model, hidden[p:], prompts, prompts.k, ranks)
    cache.commit(torch.arange(p), p + kn)
    return first, guesses


@dataclass
class StepResult:
    accepted: list[int]  # verified guess tokens, in order
    next_token: int  # the base model's token after them, greedy or sampled (the next root)
    guesses: torch.Tensor  # [state, ranks] for the next step
    state: int


def ppd_step(model: LeanLlama, cache: KVCache, prompts: PromptTokenSet, tree: TreeLayout, root: int,
             guesses: torch.Tensor, ranks: int, sampling: Sampling = Sampling(),
             generator: torch.Generator | None = None, chain: list[int] = ()) -> StepResult:
    """One verify-and-guess forward; `chain` fills the tree's lookup nodes (tree.lookup of them, chain after chain)."""
    if len(chain) != tree.lookup:
        raise ValueError(f"the tree has {tree.lookup} lookup nodes, {len(chain)} tokens were given")
    guessed = tree.nodes - tree.lookup
    node_tokens = torch.empty(tree.nodes, dtype=torch.long)
    node_tokens[0] = root
    node_tokens[1:guessed] = guesses[tree.depths[1:guessed] - 1, tree.ranks[1:guessed]]
    node_tokens[guessed:] = torch.tensor(list(chain), dtype=torch.long)
    x = torch.cat([model.embed_ids(node_tokens), prompts.embeddings.to(model.dtype)[tree.slot_embedding]])
    mask = torch.cat([torch.ones(tree.size, cache.length, dtype=torch.bool), tree.mask], dim=1)
    positions = cache.length + tree.offsets
    hidden = model.forward(x, positions, cache, mask)  # [T, H]
    # One LM-head call for the nodes and every node's prompt tokens (EPTs aggregated first): the head
    # reads its 28M weights once however many rows it gets.
    weights = None if prompts.weights is None else prompts.weights[tree.slot_distances]  # [sum c, n]
    slots = aggregate_epts(hidden[tree.nodes:], len(tree.slot_distances), prompts.n, weights)  # [sum c, H]
    logits = model.logits(torch.cat([hidden[:tree.nodes], slots]))  # [N + sum c, V]
    final, next_token = choose(node_tokens, logits[:tree.nodes], tree.links, sampling, generator)
    path = tree.paths[final]
    new_guesses = logits[tree.guess_rows[final]].topk(ranks, dim=-1).indices  # [count, ranks]
    cache.commit(path, tree.size)
    return StepResult(node_tokens[path[1:]].tolist(), next_token, new_guesses, tree.prompts[final])
