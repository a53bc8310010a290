"""A prompt's causal attention in blocks of query rows, each block multiplied only against the keys its rows can
see: the masked upper triangle, half of a long prompt's attention, is never computed. (One bias over every key
costs twice the multiplications and a [g T, S] bias, and on a long prompt attention is much of a prefill.)"""
import torch

QUERY_BLOCK = 64  # rows per block: smaller blocks skip more of the triangle, larger ones multiply more
# efficiently; chosen by timing (docs/history.md)


def causal_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, length: int, scale: float,
                     block: int = QUERY_BLOCK) -> torch.Tensor:
    """q [Hkv, g, T, D]: the queries of T new rows at positions length .. length + T - 1, grouped by key/value head;
    keys/values [Hkv, length + T, D] (the cache's committed rows, then the new ones) -> [Hkv, g, T, D].

    Row r sees keys 0 .. length + r. A block's rows are scored against the keys up to its last row, and the keys
    past each row inside the block are masked; a masked key's weight is exactly 0, as with a full-width bias."""
    hkv, g, t, d = q.shape
    out = q.new_empty(hkv, g, t, d)
    for first in range(0, t, block):
        last = min(t, first + block)
        rows, seen = last - first, length + last
        queries = q[:, :, first:last].reshape(hkv, g * rows, d)  # [Hkv, g b, D]
        scores = torch.bmm(queries, keys[:, :seen].transpose(1, 2)).mul_(scale).view(hkv, g, rows, seen)
        later = torch.ones(rows, rows, dtype=torch.bool, device=q.device).triu(1)  # [b, b]: key after the row
        scores[..., length + first:].masked_fill_(later, float("-inf"))
        weights = scores.softmax(-1).view(hkv, g * rows, seen)
        out[:, :, first:last] = torch.bmm(weights, values[:, :seen]).view(hkv, g, rows, d)
    return out
