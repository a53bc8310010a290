"""One verification forward for the steps of several answers that share a KV cache (continuous batching,
runtime/batching/batch_engine.py): each answer brings its drafter's proposal (the root alone, a chain, a tree, PPD's
prompt tokens), all their rows go through the base model together, and each answer keeps what `verify` would have kept.

Every answer's keys/values live in a segment of the shared cache (kv_cache.CacheSegment). A row sees its own
segment's committed slots and, within its step, the rows its tree mask allows (LeanLlama.forward_windows: a window
of slots per row and a bias over it), and the native kernels give every row the arithmetic of its answer's step
decoded alone: their rows never depend on each other, and a row's attention sums the keys it sees in their order
wherever they sit. The LM head reads every answer's rows in one call (its weights read once for all), in blocks of
at most the kernels' rows, as the forward is. So each answer is token for token `verify`'s, whoever shares its steps
(tests/test_batch_engine.py checks it on many prompts and methods).
"""

from dataclasses import dataclass

import torch

from ..acceptance import Sampling, choose, pick
from ..drafters.drafter import Proposal, Verified
from ..forward.kv_cache import CacheSegment, KVCache
from ..forward.linear import SKINNY_MAX_ROWS
from ..forward.llama import LeanLlama


@dataclass
class Step:
    """One answer's part of a shared step: its cache segment, its proposal, and how it picks tokens."""

    segment: CacheSegment
    proposal: Proposal
    sampling: Sampling
    generator: torch.Generator | None = None

    @property
    def mask(self) -> torch.Tensor:  # [T, T] bool: which of the step's rows each row sees
        p = self.proposal
        return p.layout.mask if p.mask is None else p.mask

    @property
    def offsets(self) -> torch.Tensor:  # [T] positions after the segment's last committed one
        p = self.proposal
        return p.layout.offsets if p.offsets is None else p.offsets


def verify_steps(model: LeanLlama, cache: KVCache, steps: list[Step], capture: tuple[int, ...] = ()) -> list[Verified]:
    """Verify every step's proposal in forwards of at most SKINNY_MAX_ROWS rows (whole steps each) -> each step's
    Verified, as `verify` gives it; the kept paths' keys/values are committed in each segment."""
    for step in steps:
        step.segment.reserve(step.proposal.rows)
    hidden, states = [], []
    for block in _blocks(steps):
        h, s = _forward(model, cache, block, capture)
        hidden += _split(h, block)
        states += _split(s, block) if s is not None else [None] * len(block)
    reads = [_read(step, h) for step, h in zip(steps, hidden)]
    logits = _split(_logits(model, torch.cat(reads)), steps, [len(r) for r in reads])  # one head read for all
    return [_keep(step, h, lg, s) for step, h, lg, s in zip(steps, hidden, logits, states)]


def _blocks(steps: list[Step]) -> list[list[Step]]:
    """The steps in consecutive groups of at most SKINNY_MAX_ROWS rows (a step larger than that alone)."""
    blocks, rows = [[]], 0
    for step in steps:
        if blocks[-1] and rows + step.proposal.rows > SKINNY_MAX_ROWS:
            blocks.append([])
            rows = 0
        blocks[-1].append(step)
        rows += step.proposal.rows
    return blocks


def _forward(model: LeanLlama, cache: KVCache, block: list[Step], capture: tuple[int, ...]
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The block's rows through the base model -> final hidden states [T, H], and the captured states [T, len H]."""
    x = torch.cat([model.embed_ids(s.proposal.tokens) if s.proposal.inputs is None
                   else s.proposal.inputs.to(model.dtype) for s in block])  # [T, H]
    positions = torch.cat([s.segment.length + s.offsets for s in block])  # [T]
    window = torch.cat([_window(s) for s in block])  # [T, 3]
    bias = _bias(block, model.group, model.dtype) if any(s.proposal.rows > 1 for s in block) else None

    if capture:  # in the same call (runtime/forward/layer_states.py)
        return model.forward_windows_states(x, positions, cache, window, bias, capture)
    return model.final_norm(model.forward_windows(x, positions, cache, window, bias, 0, len(model.layers))), None


def _window(step: Step) -> torch.Tensor:
    """[T, 3]: each row sees its segment's committed slots and its step's rows, and writes at its own slot."""
    first, end, rows = step.segment.start, step.segment.start + step.segment.length, step.proposal.rows
    written = end + torch.arange(rows)
    return torch.stack([torch.full((rows,), first), torch.full((rows,), end + rows - 1), written], dim=1)


def _bias(block: list[Step], group: int, dtype: torch.dtype) -> torch.Tensor:
    """[g T, S]: 0 where a row may look (its committed slots, its tree's allowed rows), -inf elsewhere; column j is
    slot first + j of the row's window. Laid out as attention_bias lays out a single step's."""
    width = max(s.segment.length + s.proposal.rows for s in block)
    rows = sum(s.proposal.rows for s in block)
    bias = torch.full((rows, width), float("-inf"), dtype=dtype)
    r = 0
    for step in block:
        t, length = step.proposal.rows, step.segment.length
        bias[r:r + t, :length] = 0
        bias[r:r + t, length:length + t].masked_fill_(step.mask, 0)
        r += t
    return bias.repeat(group, 1)


def _split(x: torch.Tensor, steps: list[Step], sizes: list[int] | None = None) -> list[torch.Tensor]:
    return list(x.split(sizes if sizes is not None else [s.proposal.rows for s in steps]))


def _read(step: Step, hidden: torch.Tensor) -> torch.Tensor:
    """The rows whose logits the step reads: its nodes', then its drafter's extra readout (PPD's prompt tokens)."""
    p = step.proposal
    if p.rows == 1:
        return hidden
    extra = p.extra_readout(hidden) if p.extra_readout is not None else None
    return hidden[:p.layout.nodes] if extra is None else torch.cat([hidden[:p.layout.nodes], extra])


def _logits(model: LeanLlama, rows: torch.Tensor) -> torch.Tensor:
    """The LM head on rows [R, H] in blocks the few-rows kernels take, so each row's logits are those of its step
    alone."""
    return torch.cat([model.logits(rows[i:i + SKINNY_MAX_ROWS]) for i in range(0, len(rows), SKINNY_MAX_ROWS)])


def _keep(step: Step, hidden: torch.Tensor, logits: torch.Tensor, states: torch.Tensor | None) -> Verified:
    """The step's choice and commit, as `verify` makes them (`_one_token`'s for the root alone)."""
    p, segment = step.proposal, step.segment
    if p.rows == 1:
        segment.commit(None, 1)
        return Verified(p.layout.paths[0], pick(logits[0], step.sampling, step.generator), [], hidden, logits, states)
    final, next_token = choose(p.tokens, logits[:p.layout.nodes], p.layout.links, step.sampling, step.generator)
    path = p.layout.paths[final]
    segment.commit(path, p.rows)
    return Verified(path, next_token, p.tokens[path[1:]].tolist(), hidden, logits, states)
