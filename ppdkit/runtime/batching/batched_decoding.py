"""Decoding many sequences at once with continuous batching, each one token for token its `ar` decoding: greedy, or
sampled at a temperature with a seed per request (each answer then `ar`'s with that seed).

Self-distillation (data_pipeline/regenerate.py) asks the base model for hundreds of thousands of answers. One
sequence at a time, every step reads all the weights for a single row; here up to `slots` sequences share each
step, so the weights are read once for all of them. A finished sequence's slot takes the next request at once
(continuous batching): answers end at very different lengths (an end token after 20 tokens, or the cap after
256), and fixed batches would keep stepping for their longest member while the others wait finished.

The cache is one preallocated KVCache cut into `slots` segments of `segment` positions. A request is prefilled
alone, exactly as `ar` prefills (runtime/drafters/drafter.py read_prompt), and its keys/values are copied into its
segment. A segment keeps what it holds after its answer ends: a request that begins with those tokens (a conversation's
next turn, its prompt the previous one's plus the answer) takes that segment and reads only the rest of its prompt. Its
keys/values are the ones a prefill of the whole prompt writes, bit for bit: ar's prefill and a batched step both give
every position what reading it one token at a time gives (runtime/forward/llama.native_blocks). Then each step
feeds one token of every active sequence through the native kernels with a window per row (the row's key/value
goes to its own segment; it attends to that segment only), so a row's arithmetic is that of its sequence decoded
alone: the kernels' rows never depend on each other, and attention sums the keys a row sees in their order
(runtime/kernels/decoder_layers.cpp). Every answer equals `Decoder.generate(method="ar")`, whatever its batch
neighbours (tests/test_batch.py checks this on many prompts). Sampled, each sequence draws from its own row with its own
generator, seeded by its request as `Decoder.generate(seed=...)` seeds one: its answer is the one `ar` samples alone
with that seed, whoever shares its steps (self-distillation data drawn at a temperature, reproducible).
"""

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ..acceptance import Sampling, greedy_tokens, pick
from ..forward.kv_cache import KVCache
from ..forward.linear import SKINNY_MAX_ROWS
from ..forward.llama import LeanLlama


@dataclass(frozen=True)
class Request:
    key: Any  # the caller's handle, returned with the answer
    ids: list[int]  # the prompt's token ids
    max_new_tokens: int
    seed: int = 0  # its draws' generator (sampled decoding only)
    temperature: float | None = None  # its own, in place of the call's (prompts drawn hotter than their answers)


@dataclass
class _Sequence:
    request: Request
    start: int  # the first cache slot of its segment
    length: int  # tokens in its segment (the prompt, then every token fed back)
    sampling: Sampling
    tokens: list[int] = field(default_factory=list)  # generated so far
    generator: torch.Generator | None = None  # its own draws (sampled decoding)

    def finished(self, eos: set[int]) -> bool:
        return self.tokens[-1] in eos or len(self.tokens) >= self.request.max_new_tokens


def check_batching(model: LeanLlama, slots: int) -> None:
    """A clear error before any work where the model cannot decode `slots` sequences per step."""
    if model.native is None:
        raise ValueError("batched decoding runs on the native CPU kernels, which this model does not use (another "
                         "device, a model with biases, or no C++ compiler): decode one sequence at a time instead")
    if not 1 <= slots <= SKINNY_MAX_ROWS:
        raise ValueError(f"slots must be between 1 and {SKINNY_MAX_ROWS} (the native kernels' rows), not {slots}")


def decode_many(model: LeanLlama, next_request: Callable[[], Request | None], eos: set[int], slots: int,
                segment: int, on_tokens: Callable[[int], None] | None = None,
                temperature: float = 0.0) -> Iterator[tuple[Request, list[int]]]:
    """Yield (request, generated ids) as each answer ends (the end token included, as `ar` gives it), in the
    order they end. `next_request()` gives the next request or None when there is none for now; it is asked
    again whenever a slot is free, so the caller may add work as answers come back (the next turn of a
    conversation). A request needs len(ids) + max_new_tokens <= segment. `on_tokens(n)` is told of every n tokens
    produced (a prompt's first token, then each step's: for progress bars and throughput). `temperature` 0:
    greedy; above: each request's tokens drawn with a generator seeded by its `seed`. A request with a temperature of
    its own decodes at that one."""
    check_batching(model, slots)
    default = Sampling(temperature)
    cache = model.new_cache(slots * segment)
    scratch = model.new_cache(segment)  # one prompt's prefill, copied into its segment
    free = list(range(slots - 1, -1, -1))
    held: list[list[int]] = [[] for _ in range(slots)]  # the ids whose keys/values each segment holds, in order
    active: list[_Sequence] = []
    while True:
        while free:
            request = next_request()
            if request is None:
                break
            slot, reuse = _segment_for(request.ids, free, held)
            free.remove(slot)
            sampling = default if request.temperature is None else Sampling(request.temperature)
            sequence = _prefill(model, cache, scratch, request, slot * segment, segment, sampling, reuse)
            held[slot] = list(request.ids)
            if on_tokens:
                on_tokens(1)
            if sequence.finished(eos):
                free.append(slot)
                yield request, sequence.tokens
            else:
                active.append(sequence)
        if not active:
            return
        _step(model, cache, active)
        if on_tokens:
            on_tokens(len(active))
        still = []
        for sequence in active:
            if sequence.finished(eos):
                slot = sequence.start // segment
                held[slot] += sequence.tokens[:-1]  # every token but the last was fed back
                free.append(slot)
                yield sequence.request, sequence.tokens
            else:
                still.append(sequence)
        active = still


def _segment_for(ids: list[int], free: list[int], held: list[list[int]]) -> tuple[int, int]:
    """The free segment whose held ids share the longest prefix with the prompt `ids` (the last one freed among
    equals), and how many of its positions the prompt reuses: all but the last at most, whose hidden state gives the
    first token."""
    best, reuse = free[-1], 0
    for slot in reversed(free):
        common = _common_prefix(held[slot], ids)
        if common > reuse:
            best, reuse = slot, common
    return best, min(reuse, len(ids) - 1)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _prefill(model: LeanLlama, cache: KVCache, scratch: KVCache, request: Request, start: int,
             segment: int, sampling: Sampling, reuse: int = 0) -> _Sequence:
    """Read the prompt as `ar` does (a fresh cache, causal), keep its keys/values in the segment at `start`; its
    first `reuse` positions are already there (the segment's earlier ids) and only the rest is read."""
    n = len(request.ids)
    if n < 1 or n + request.max_new_tokens > segment:
        raise ValueError(f"request {request.key!r}: {n} prompt tokens and {request.max_new_tokens} new ones do not "
                         f"fit a segment of {segment} positions")
    scratch.k[..., :reuse] = cache.k[..., start:start + reuse]
    scratch.v[:, :, :reuse] = cache.v[:, :, start:start + reuse]
    scratch.rollback(reuse)
    rest = torch.tensor(request.ids[reuse:])  # all of them where nothing is reused: read_prompt, as `ar` reads it
    hidden = model.forward(model.embed_ids(rest), torch.arange(reuse, n), scratch, None)  # [P - reuse, H]
    cache.k[..., start + reuse:start + n] = scratch.k[..., reuse:n]
    cache.v[:, :, start + reuse:start + n] = scratch.v[:, :, reuse:n]
    generator = None if sampling.greedy else torch.Generator(model.device).manual_seed(request.seed)
    first = pick(model.logits(hidden[-1]), sampling, generator)  # as ar picks its first token
    return _Sequence(request, start, n, sampling, [first], generator)


def _step(model: LeanLlama, cache: KVCache, active: list[_Sequence]) -> None:
    """Feed every active sequence's last token; append each one's next token (greedy, or drawn from its row with
    its own generator at its own temperature)."""
    tokens = torch.tensor([s.tokens[-1] for s in active])  # [B]
    positions = torch.tensor([s.length for s in active])  # [B]
    window = torch.tensor([[s.start, s.start + s.length, s.start + s.length] for s in active])  # [B, 3]
    hidden = model.forward_sequences(model.embed_ids(tokens), positions, cache, window)  # [B, H]
    logits = model.logits(hidden)  # [B, V]
    if all(s.sampling.greedy for s in active):
        nexts = greedy_tokens(logits).tolist()  # [B]: the first maximum, as ar's pick
    else:
        nexts = [pick(row, s.sampling, s.generator) for row, s in zip(logits, active)]
    for sequence, token in zip(active, nexts):
        sequence.length += 1
        sequence.tokens.append(token)
