"""The corpus n-gram table of a component: what most often followed each short run of tokens in the
base model's own text (Self-Draft's corpus cache), stored as `ngrams.safetensors`.

For each n in 1..max_n, three tensors (ids as uint16 when every id fits, else int32):

    keys_{n}           [M, n]     the n-gram
    continuations_{n}  [M, B, L]  its most frequent continuations of L tokens, most frequent first
    counts_{n}         [M]        uint8: how many of the B continuations are real (the rest is padding)

A continuation that ran into the end of its text is padded with its last token (a wrong guess costs
a verified row, never a wrong token).
"""

from dataclasses import dataclass

import torch

Key = tuple[int, ...]


@dataclass
class NgramTable:
    max_n: int
    branches: int  # B: continuations kept per n-gram
    length: int  # L: tokens per continuation
    entries: dict[Key, list[list[int]]]  # n-gram -> continuations, most frequent first

    def continuations(self, tokens: list[int]) -> list[list[int]]:
        """The continuations of the longest suffix of `tokens` (max_n down to 1) the table knows; [] if none."""
        for n in range(min(self.max_n, len(tokens)), 0, -1):
            found = self.entries.get(tuple(tokens[-n:]))
            if found:
                return found
        return []

    def to_tensors(self) -> dict[str, torch.Tensor]:
        largest = max((t for key, found in self.entries.items() for t in [*key, *sum(found, [])]), default=0)
        ids = torch.uint16 if largest < 65536 else torch.int32
        out: dict[str, torch.Tensor] = {}
        for n in range(1, self.max_n + 1):
            keys = sorted(k for k in self.entries if len(k) == n)
            conts = torch.zeros(len(keys), self.branches, self.length, dtype=torch.int64)  # [M, B, L]
            counts = torch.zeros(len(keys), dtype=torch.uint8)
            for row, key in enumerate(keys):
                found = self.entries[key]
                counts[row] = len(found)
                for b, cont in enumerate(found):
                    conts[row, b] = torch.tensor(cont)
            out[f"keys_{n}"] = torch.tensor(keys, dtype=torch.int64).reshape(len(keys), n).to(ids)
            out[f"continuations_{n}"] = conts.to(ids)
            out[f"counts_{n}"] = counts
        return out

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor]) -> "NgramTable":
        ns = sorted(int(name.split("_")[1]) for name in tensors if name.startswith("keys_"))
        if not ns or ns != list(range(1, len(ns) + 1)):
            raise ValueError(f"an n-gram table needs keys_1 .. keys_N, found {sorted(tensors)}")
        entries: dict[Key, list[list[int]]] = {}
        branches = length = 0
        for n in ns:
            keys = tensors[f"keys_{n}"].to(torch.int64).tolist()
            conts = tensors[f"continuations_{n}"].to(torch.int64)
            branches, length = conts.shape[1], conts.shape[2]
            counts = tensors[f"counts_{n}"].tolist()
            for key, cont, count in zip(keys, conts.tolist(), counts):
                entries[tuple(key)] = cont[:count]
        return cls(len(ns), branches, length, entries)
