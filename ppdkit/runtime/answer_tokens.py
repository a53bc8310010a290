"""An answer as the decode loop emits it, step by step, and what `generate` returns of it: the bookkeeping one
answer decoded alone (Decoder.generate) and one answer among many sharing each step (batching/batch_engine.py) share."""

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class GenerateResult:
    tokens: list[int]  # new tokens only
    text: str
    steps: int
    accepted_per_step: list[int] = field(default_factory=list)  # tokens emitted by each step
    tree_size: int = 0
    seconds: float = 0.0
    tree_sizes: list[int] = field(default_factory=list)  # with dynamic_size: the tree size of every step
    pruned_rows: list[int] = field(default_factory=list)  # with early pruning: the tree nodes each step dropped
    rows_per_step: list[int] = field(default_factory=list)  # the inputs each step after the prompt fed the model
    method: str = ""  # the method that decoded (auto's choice, for auto)
    # each step's seconds after the prompt's, by part: "draft" (proposing its tree; "draft.PART" where the drafter
    # times its parts), "verify" (the forward over its rows and the acceptance) and "accept" (the drafter taking the
    # verified path back: the draft's cache, its n-gram chains)
    step_seconds: list[dict[str, float]] = field(default_factory=list)
    prompt_seconds: float = 0.0  # reading the prompt and choosing the first token

    @property
    def mean_accepted_per_step(self) -> float:
        return sum(self.accepted_per_step) / max(len(self.accepted_per_step), 1)

    def step_totals(self) -> list[float]:
        """Each step's seconds after the prompt's: its drafting, its verification, and its drafter's accept."""
        return [step["draft"] + step["verify"] + step["accept"] for step in self.step_seconds]


@dataclass
class AnswerTokens:
    """The tokens of one answer so far: `add` is the loop's emit (runtime/loop.py steps). It ends at an end token or
    at max_new_tokens; `stream` is given each step's new tokens, and `should_stop`, asked after every step, may end the
    answer early."""

    max_new_tokens: int
    eos: set[int]
    stream: Callable[[list[int]], None] | None = None
    should_stop: Callable[[], bool] | None = None
    tokens: list[int] = field(default_factory=list)
    per_step: list[int] = field(default_factory=list)
    rows_fed: list[int] = field(default_factory=list)
    step_seconds: list[dict[str, float]] = field(default_factory=list)
    prompt_seconds: float = 0.0

    def add(self, tokens: list[int], rows: int | None = None, seconds: dict[str, float] | None = None) -> bool:
        """Append one step's tokens (`rows`: the inputs the step fed the model, None for the prompt's step;
        `seconds`: its time by part) -> True when the answer is over (an end token, the token budget, or
        should_stop)."""
        self.per_step.append(len(tokens))
        if rows is not None:
            self.rows_fed.append(rows)
        if seconds is not None and rows is None:
            self.prompt_seconds = seconds["prompt"]
        elif seconds is not None:
            self.step_seconds.append(dict(seconds))
        for i, t in enumerate(tokens):
            self.tokens.append(t)
            if t in self.eos or len(self.tokens) >= self.max_new_tokens:
                if self.stream:
                    self.stream(tokens[:i + 1])  # the step's tokens up to the last one kept
                return True
        if self.stream:
            self.stream(tokens)
        return self.should_stop is not None and self.should_stop()

    def result(self, tokenizer, method: str, tree_size: int, seconds: float, tree_sizes: list[int] | None = None,
               pruned_rows: list[int] | None = None) -> GenerateResult:
        out = self.tokens[:self.max_new_tokens]
        return GenerateResult(out, tokenizer.decode(out, skip_special_tokens=True), len(self.per_step), self.per_step,
                              tree_size, seconds, tree_sizes or [], pruned_rows or [], self.rows_fed, method,
                              self.step_seconds, self.prompt_seconds)
