"""A preallocated KV cache that tree decoding writes into and then prunes in place (PPD thesis 4.5.4).

A forward writes the keys and values of its T new tokens at [length, length + T); `commit(keep)`
then moves the kept ones (the accepted path of a tree, or all T for plain decoding) down to
[length, length + len(keep)) with one indexed copy per tensor, and advances the length. Nothing is
reallocated during generation.

Keys are stored transposed, [layers, Hkv, D, capacity]: a query's scores are then one pass over contiguous
rows of keys, vectorized across keys (runtime/kernels/decoder_layers.cpp), with no transpose per step.
"""

import torch

VECTOR = 16  # floats in a cache line, and in an AVX-512 register


def cache_width(capacity: int) -> int:
    """The slots to allocate for at least `capacity` on the native layers: a whole number of cache lines (a key
    row's vector loads then never straddle two lines) and an odd one, so that the 64 rows of a head's transposed
    keys fall in different sets of the L1 cache (a width of a multiple of 1024 floats put all 64 in one set and
    read them from L2)."""
    lines = -(-capacity // VECTOR)
    return VECTOR * (lines if lines % 2 else lines + 1)


class KVCache:
    def __init__(self, layers: int, kv_heads: int, head_dim: int, capacity: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu", zeroed: bool = True):
        """zeroed=False leaves the slots unfilled: for a cache whose slots are each read only once written (the batch
        engine's shared one, gigabytes whose pages then stay untouched until an answer writes them)."""
        new = torch.zeros if zeroed else torch.empty
        self.k = new(layers, kv_heads, head_dim, capacity, dtype=dtype, device=device)  # [Lyr, Hkv, D, S]
        self.v = new(layers, kv_heads, capacity, head_dim, dtype=dtype, device=device)  # [Lyr, Hkv, S, D]
        self.length = 0  # committed tokens
        self.capacity = capacity

    def reserve(self, new_tokens: int) -> None:
        if self.length + new_tokens > self.capacity:
            raise ValueError(f"KV cache full: {self.length} + {new_tokens} tokens > capacity {self.capacity}; "
                             "pass a larger max_length")

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v [Hkv, T, D] after the committed tokens; return all keys/values [Hkv, length + T, D].

        Non-finite entries are stored as 0: a draft row (a prompt token) may hold any values, and the rows
        masked from it give it attention weight exactly 0, but 0 x NaN is NaN. Finite keys and values make
        a masked row's contribution exactly 0 whatever the draft holds, so drafts can never change the
        verified tokens (runtime/kernels/decoder_layers.cpp does the same). Rows the verified path sees are
        finite already and pass unchanged.
        """
        end = self.write_at(layer, self.length, k, v)
        return self.k[layer, :, :, :end].transpose(1, 2), self.v[layer, :, :end]

    def write_at(self, layer: int, slot: int, k: torch.Tensor, v: torch.Tensor) -> int:
        """Store k, v [Hkv, T, D] at slots slot .. slot + T - 1 (finite, as write's); return slot + T."""
        end = slot + k.shape[1]
        self.k[layer, :, :, slot:end] = torch.nan_to_num(k, nan=0.0, posinf=0.0, neginf=0.0).transpose(1, 2)
        self.v[layer, :, slot:end] = torch.nan_to_num(v, nan=0.0, posinf=0.0, neginf=0.0)
        return end

    def commit(self, keep: torch.Tensor | None, written: int) -> None:
        """Keep the new tokens at indices `keep` (into the last `written`; None: all), in that order."""
        if keep is None:
            self.length += written
            return
        src = self.length + keep  # [K]
        n = len(keep)
        if n and not torch.equal(src, torch.arange(self.length, self.length + n, device=src.device)):
            self.k[..., self.length:self.length + n] = self.k[..., src]
            self.v[:, :, self.length:self.length + n] = self.v[:, :, src]
        self.length += n

    def keep_written(self, keep: torch.Tensor, start: int, stop: int) -> None:
        """In layers start .. stop - 1 only, move the new rows at indices `keep` (into those written after the
        committed ones) to the front, in that order: ProPD's pruning ran those layers on rows it then dropped,
        and the later layers write only the kept rows."""
        src = self.length + keep  # [K]
        dst = slice(self.length, self.length + len(keep))
        self.k[start:stop, ..., dst] = self.k[start:stop, ..., src]
        self.v[start:stop, :, dst] = self.v[start:stop, :, src]

    def rollback(self, length: int) -> None:
        self.length = length


class CacheSegment(KVCache):
    """Slots start .. start + width - 1 of a cache that several sequences share, as a KVCache of its own: views of the
    shared tensors, no copy (one answer's keys/values in continuous batching, batching/batch_engine.py). Its commits
    move its own slots; the shared forward (LeanLlama.forward_windows) writes its step's rows after its length."""

    def __init__(self, shared: KVCache, start: int, width: int):  # no allocation: KVCache.__init__ is not called
        if start + width > shared.capacity:
            raise ValueError(f"a segment of {width} slots at {start} does not fit a cache of {shared.capacity}")
        self.k, self.v = shared.k[..., start:start + width], shared.v[:, :, start:start + width]
        self.start, self.length, self.capacity = start, 0, width

    def take(self, prefilled: KVCache) -> None:
        """Hold what `prefilled` (a contiguous cache a prompt was read into) has committed."""
        n = prefilled.length
        self.reserve(n - self.length)
        self.k[..., :n] = prefilled.k[..., :n]
        self.v[:, :, :n] = prefilled.v[:, :, :n]
        self.length = n
