"""Benchmark prompts kept out of training data, by word n-gram overlap.

MT-Bench and HumanEval measure the draft; a draft trained on their prompts (or on near-copies of them that
ShareGPT users pasted, or that the model happens to write itself) would measure its memory instead. A text is
contaminated when it shares one 13-word sequence with a benchmark prompt (the test GPT-3's authors used), or
holds at least half of a benchmark prompt's 5-word sequences (a near-duplicate with a few words changed). Words
are lower-cased runs of letters and digits, so spacing, punctuation and case do not hide a copy.
"""

import re
from collections import defaultdict
from dataclasses import dataclass, field

BENCHMARKS = ("mt-bench", "humaneval")
EXACT_WORDS = 13
NEAR_WORDS = 5
NEAR_SHARE = 0.5
_WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def ngrams(tokens: list[str], n: int) -> set[tuple[str, ...]]:
    """The n-word sequences of `tokens`; a text shorter than n is one sequence of all its words."""
    if len(tokens) <= n:
        return {tuple(tokens)} if tokens else set()
    return {tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)}


@dataclass
class BenchmarkIndex:
    exact: dict[tuple[str, ...], str] = field(default_factory=dict)  # 13-gram -> a benchmark item it is in
    near: dict[tuple[str, ...], list[str]] = field(default_factory=lambda: defaultdict(list))  # 5-gram -> items
    near_sizes: dict[str, int] = field(default_factory=dict)  # item -> how many 5-grams it has

    def add(self, item: str, text: str) -> None:
        tokens = words(text)
        for gram in ngrams(tokens, EXACT_WORDS):
            self.exact.setdefault(gram, item)
        grams = ngrams(tokens, NEAR_WORDS)
        self.near_sizes[item] = len(grams)
        for gram in grams:
            self.near[gram].append(item)

    def match(self, text: str) -> str | None:
        """The benchmark item `text` copies or nearly copies, or None."""
        tokens = words(text)
        for gram in ngrams(tokens, EXACT_WORDS):
            if gram in self.exact:
                return self.exact[gram]
        shared: dict[str, int] = defaultdict(int)
        for gram in ngrams(tokens, NEAR_WORDS):
            for item in self.near.get(gram, ()):
                shared[item] += 1
        return next((item for item, n in shared.items() if n >= NEAR_SHARE * self.near_sizes[item]), None)


def benchmark_index(sources: tuple[str, ...] = BENCHMARKS) -> BenchmarkIndex:
    """Every prompt of the benchmarks ppdkit measures with (every MT-Bench turn, each HumanEval prompt)."""
    from .readers import iter_rows

    index = BenchmarkIndex()
    for source in sources:
        for where, row in iter_rows(source):
            if isinstance(row, dict):
                for k, text in enumerate(row.get("turns") or [row.get("prompt", "")]):
                    index.add(f"{source}:{row.get('question_id', row.get('task_id', where))}:{k}", str(text))
    return index


def prompt_text(messages) -> str:
    """What a conversation asks: its user and system turns (answers are the base model's own)."""
    return "\n".join(m.get("content", "") for m in messages if m.get("role") != "assistant")

