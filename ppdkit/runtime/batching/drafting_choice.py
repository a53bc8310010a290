"""Whether grown trees draft at all, chosen by what each choice measured: a batch's (batch_engine.py) and a lone
answer's (runtime/trees/grown_tree.py's GrownDrafter, so that a draft that costs more than it keeps runs plain steps).

Alone, an answer's tree pays for its rows and its drafting time, when it pays at all: on a CPU where a few rows cost
twice one row (the gguf path), a step of 2 tokens is slower than 2 plain ones. Among many answers the
forward's weight read is shared and a row of guesses costs as much as another answer's row, and each answer's
drafting runs one after another: past a few answers the root alone, `ar` inside the batch, yields more. Where that
turns depends on the CPU, the draft and the text, so it is measured, not modelled: tokens per second of whole steps (a
step's drafting, then the forward that verifies what it drafted), a running figure per number of answers and choice.
An untried choice is tried, and one step in PROBE takes the other one, so the figures follow the text and the load.
"""

PROBE = 16  # steps between two that take the choice the figures do not favour


class DraftingChoice:
    """`weighs_one`: one answer's steps are weighed too (a lone answer's own choice); else one answer always drafts,
    leaving the choice to its drafter. `plain_probe`: the steps between two plain ones while drafting is favoured (a
    plain step's cost, one row's forward, barely moves with the text; what drafting keeps does)."""

    def __init__(self, rate: float = 0.2, weighs_one: bool = False, plain_probe: int = PROBE):
        self.rate = rate  # weight of a step in the running figures
        self.weighs_one, self.plain_probe = weighs_one, plain_probe
        self.figures: dict[tuple[int, bool], tuple[float, float]] = {}  # (answers, drafting) -> (tokens, seconds)
        self.seen: dict[tuple[int, bool], int] = {}  # (answers, drafting) -> steps observed
        self.steps = 0

    def choose(self, answers: int) -> bool:
        """Draft (True) or verify each answer's root alone, for a step of `answers` answers."""
        self.steps += 1
        if answers == 1 and not self.weighs_one:
            return True
        known = {drafting: self.figures.get((answers, drafting)) for drafting in (True, False)}
        untried = [drafting for drafting, figure in known.items() if figure is None]
        if untried:
            return untried[0]
        (drafted, drafted_seconds), (plain, plain_seconds) = known[True], known[False]
        best = drafted * plain_seconds >= plain * drafted_seconds  # tokens per second, compared without a division
        return (not best) if self.steps % (self.plain_probe if best else PROBE) == 0 else best

    def observe(self, answers: int, drafting: bool, tokens: int, seconds: float) -> None:
        """A step of `answers` answers under `drafting` made `tokens` tokens in `seconds` (its drafting and forward).
        The first steps of a choice weigh alike (the n-th 1/n), later ones `rate`: a first step that drafted badly
        does not stand for drafting until many more are seen."""
        key = (answers, drafting)
        old = self.figures.get(key, (0.0, 0.0))
        self.seen[key] = self.seen.get(key, 0) + 1
        r = max(self.rate, 1 / self.seen[key])
        self.figures[key] = ((1 - r) * old[0] + r * tokens, (1 - r) * old[1] + r * seconds)
