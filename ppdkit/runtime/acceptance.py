"""Which guesses of a verified tree are kept, and the token that follows them (PPD thesis 4.5.2-4.5.3).

Every rule reads the base model's logits at each tree node [N, V] (the distribution of the token after
that node) and returns the deepest kept node plus the next token, drawn at that node:
- exact: greedy decoding; a guess is kept when it is the greedy token of its parent. Lossless.
- speculative: sampled decoding, standard speculative sampling with the guesses as deterministic
  drafts (a point-mass draft q = 1[x = guess]): at a node the children are tried in rank order, each
  kept with probability p(guess) / (mass left), and a rejected guess's mass is removed from p; when no
  child is kept the token is drawn from what is left. Every emitted token is then distributed exactly
  as the base model's sample: lossless in distribution.
- typical: typical acceptance (Medusa's rule, used by PPD): a guess is kept when
  p(guess) > min(epsilon, delta * exp(-H(p))) at its parent; the deepest such path wins and the next
  token is sampled at its end. Faster at high temperatures, not distribution-preserving.
"""

import functools
from dataclasses import dataclass

import torch

ACCEPTANCE_RULES = ("speculative", "typical")


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0  # 0: greedy
    acceptance: str = "speculative"  # for temperature > 0: speculative | typical
    epsilon: float = 0.09  # typical acceptance: hard probability threshold
    delta: float = 0.3  # typical acceptance: entropy-scaled threshold factor

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 is greedy), not {self.temperature}")
        if self.acceptance not in ACCEPTANCE_RULES:
            raise ValueError(f"unknown acceptance {self.acceptance!r}; use one of {ACCEPTANCE_RULES}")
        if not (0 < self.epsilon <= 1 and 0 < self.delta <= 1):
            raise ValueError(f"typical acceptance needs 0 < epsilon, delta <= 1 (got {self.epsilon}, {self.delta})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class TreeLinks:
    """The shape of a tree's nodes, as lists (walked in Python, a few dozen nodes)."""

    parents: list[int]  # [N], -1 for the root; parents come before children
    depths: list[int]  # [N]
    children: list[list[int]]  # per node, in rank order

    @classmethod
    def of(cls, parents: list[int], depths: list[int], ranks: list[int]) -> "TreeLinks":
        children: list[list[int]] = [[] for _ in parents]
        for node in sorted(range(1, len(parents)), key=lambda c: ranks[c]):
            children[parents[node]].append(node)
        return cls(parents, depths, children)


def next_token_distribution(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """[..., V] logits -> [..., V] probabilities at this temperature (> 0)."""
    return torch.softmax(logits.double() / temperature, dim=-1)  # float64: exact enough to sample from


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """[..., V] logits -> [...] the most likely token of each row, the first one on ties: argmax's choice (both are
    documented so). On a CPU through the native kernels' one-pass row_argmax (6 bfloat16 rows of 49152 in a seventh
    of the time of PyTorch's max: the same token for less of every step); elsewhere, and for a row holding a NaN,
    through max's kernel, which reads bfloat16 logits faster than argmax's (docs/history.md)."""
    native = _native_argmax() if logits.device.type == "cpu" and logits.dtype in _NATIVE_ARGMAX_DTYPES else None
    if native is None or logits.dim() > 2 or logits.stride(-1) != 1:
        return logits.max(-1).indices
    rows = logits.unsqueeze(0) if logits.dim() == 1 else logits  # [N, V]
    tokens = native(rows)  # [N], -1 where a row holds a NaN
    if bool((tokens < 0).any()):
        tokens = torch.where(tokens < 0, rows.max(-1).indices, tokens)
    return tokens[0] if logits.dim() == 1 else tokens


_NATIVE_ARGMAX_DTYPES = (torch.float32, torch.bfloat16)


@functools.cache
def _native_argmax():
    """The native kernels' row_argmax, or None where they do not run (a build without them keeps PyTorch's max)."""
    from .kernels.native import native_kernels  # the kernels build on first use; a GPU-only process never asks

    kernels = native_kernels()
    return None if kernels is None else kernels.row_argmax


def pick(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None = None) -> int:
    """The next token from one position's logits [V]: greedy, or drawn at the temperature."""
    if sampling.greedy:
        return int(greedy_tokens(logits))
    return draw(next_token_distribution(logits, sampling.temperature), generator)


def choose(tokens: torch.Tensor, logits: torch.Tensor, links: TreeLinks, sampling: Sampling,
           generator: torch.Generator | None = None, alive: torch.Tensor | None = None) -> tuple[int, int]:
    """tokens [N] (node 0 the root), logits [N, V] -> (deepest kept node, next token). alive [N] bool: nodes
    pruned before verification (ProPD) are never kept, whatever their rows of `logits` hold."""
    if sampling.greedy:
        return _exact(tokens, logits, links, alive)
    probs = next_token_distribution(logits, sampling.temperature)  # [N, V]
    if sampling.acceptance == "typical":
        return _typical(tokens, probs, links, sampling, generator, alive)
    return _speculative(tokens, probs, links, generator, alive)


def _deepest(kept: list[bool], links: TreeLinks) -> int:
    """The deepest node whose whole path is kept (the first such in node order on ties)."""
    path_ok = [True] + [False] * (len(kept) - 1)
    final = 0
    for node in range(1, len(kept)):
        if kept[node] and path_ok[links.parents[node]]:
            path_ok[node] = True
            if links.depths[node] > links.depths[final]:
                final = node
    return final


def _exact(tokens: torch.Tensor, logits: torch.Tensor, links: TreeLinks,
           alive: torch.Tensor | None) -> tuple[int, int]:
    greedy = greedy_tokens(logits)  # [N]
    parents = torch.tensor(links.parents[1:], dtype=torch.long)  # long even when the tree is the root alone
    hit = tokens[1:] == greedy[parents]
    kept = [True] + (hit if alive is None else hit & alive[1:]).tolist()
    final = _deepest(kept, links)
    return final, int(greedy[final])


def typical_threshold(probs: torch.Tensor, epsilon: float, delta: float) -> torch.Tensor:
    """[..., V] -> [...]: min(epsilon, delta * exp(-H(p))). The most likely token always clears it,
    since exp(-H(p)) <= max p."""
    entropy = -(probs * torch.log(probs.clamp_min(1e-30))).sum(-1)
    return torch.minimum(torch.full_like(entropy, epsilon), delta * torch.exp(-entropy))


def _typical(tokens: torch.Tensor, probs: torch.Tensor, links: TreeLinks, sampling: Sampling,
             generator: torch.Generator | None, alive: torch.Tensor | None) -> tuple[int, int]:
    parents = torch.tensor(links.parents[1:], dtype=torch.long)  # long even when the tree is the root alone
    threshold = typical_threshold(probs, sampling.epsilon, sampling.delta)  # [N]
    p_guess = probs[parents, tokens[1:]]  # [N - 1]: each guess's probability at its parent
    hit = p_guess > threshold[parents]
    kept = [True] + (hit if alive is None else hit & alive[1:]).tolist()
    final = _deepest(kept, links)
    return final, draw(probs[final], generator)


def _speculative(tokens: torch.Tensor, probs: torch.Tensor, links: TreeLinks,
                 generator: torch.Generator | None, alive: torch.Tensor | None) -> tuple[int, int]:
    node = 0
    while True:
        left = probs[node].clone()  # [V] the target distribution, minus the drafts rejected so far
        # pruned children are drafts never made: the pruning read only the context and the tree, not the draws
        for child in (c for c in links.children[node] if alive is None or alive[c]):
            token = int(tokens[child])
            mass = float(left[token])
            if mass > 0 and float(torch.rand((), generator=generator, dtype=torch.float64)) * float(left.sum()) < mass:
                node = child
                break
            left[token] = 0.0
        else:
            return node, draw(left / left.sum(), generator)
