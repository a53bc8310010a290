"""The corpus n-gram cache: counted from the assistant text of the teacher cache or, for train.online, the data
stage's rows (with self-distillation or a corpus, the base model's own answers), the text the decoder will meet again.

Measured on SmolLM2-135M's greedy answers (128 tokens): as the only drafter, a chain copied from the
context gives 1.40 (MT-Bench, 40 prompts) / 1.92 (HumanEval) tokens per step, the table's top
continuation alone 1.18 / 1.17, both together (context, then 3 from the table) 1.68 / 2.28. Beside the
prompt tokens' tree (ppd-lookup, 10 prompts) the table adds less, 1.61 -> 1.66 / 2.33 -> 2.47, as the
prompt tokens already guess the common continuations; its 9 more rows per step then cost more time
than they save on a 2-core CPU, so the decoder uses it only when asked (`lookup_chains`).
"""

from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from ppdkit.models.ngram_table import Key, NgramTable

from .templating import supervised_positions


def assistant_texts(sequences: Iterable) -> Iterator[list[int]]:
    """Each run of consecutive assistant tokens of the sequences (a teacher cache's, or the data stage's rows as
    data_stage_sequences reads them: input_ids [T] and positions [P], the positions with a target)."""
    for seq in sequences:
        ids = seq.input_ids.tolist()
        targets = (seq.positions + 1).tolist()  # entry at t is the distribution of token t + 1
        run: list[int] = []
        for i, t in enumerate(targets):
            if run and t != targets[i - 1] + 1:
                yield run
                run = []
            run.append(ids[t])
        if run:
            yield run


@dataclass
class RowSequence:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [P] the positions whose next token is the assistant's


def data_stage_sequences(data_dir: Path, split: str = "train") -> Iterator[RowSequence]:
    """The data stage's rows of a split as sequences (what train.online reads where there is no teacher cache)."""
    from datasets import load_from_disk

    for row in load_from_disk(str(Path(data_dir) / split)):
        yield RowSequence(torch.tensor(row["input_ids"]), torch.tensor(supervised_positions(row["loss_mask"]),
                                                                       dtype=torch.long))


def build_ngram_table(texts: Iterable[list[int]], max_n: int = 3, branches: int = 3, length: int = 3,
                      min_count: int = 2) -> NgramTable:
    """Count, for every n-gram (n <= max_n) seen at least `min_count` times, the `length` tokens after
    it; keep its `branches` most frequent continuations (ties: first seen first)."""
    counts: dict[Key, Counter] = defaultdict(Counter)
    for text in texts:
        for end in range(1, len(text)):  # the n-gram ends at text[end - 1], its continuation starts at end
            cont = text[end:end + length]
            cont = tuple(cont + cont[-1:] * (length - len(cont)))
            for n in range(1, min(max_n, end) + 1):
                counts[tuple(text[end - n:end])][cont] += 1
    entries = {key: [list(cont) for cont, _ in found.most_common(branches)]
               for key, found in counts.items() if sum(found.values()) >= min_count}
    return NgramTable(max_n, branches, length, entries)
