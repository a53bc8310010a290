"""The committed draft's cost curve: MT-Bench tokens per step of the adopted lineage against the positions its
continual runs trained on, a straight line fitted in log2(positions), and what that line asks to reach a target.

Read from the component's history (ppdkit/models/components/<name>/history.json, what `ppdkit adopt` writes) and
the committed training-speed reports; docs/tools/corpus_page.py renders it into docs/corpus.md and draws it into
docs/images/draft-scaling.png. The line is a crude fit of a few points, each run changing more than its data (a
vocabulary grown, another machine): it says how far away a target is if the draft stays what it is, no more.
"""

import math
from dataclasses import dataclass
from pathlib import Path

TARGET = 2.6  # tokens per step the draft is asked for at trees of at most 8 nodes


@dataclass(frozen=True)
class Point:
    positions: int  # continual positions trained by the lineage up to this draft (the first draft's own not counted)
    tokens_per_step: float  # the gate's measure of this draft
    date: str


@dataclass(frozen=True)
class LogFit:
    per_doubling: float  # tokens per step gained each time the positions double
    intercept: float  # tokens per step at log2(positions) = 0

    def at(self, positions: float) -> float:
        return self.intercept + self.per_doubling * math.log2(positions)

    def positions_for(self, tokens_per_step: float) -> float | None:
        """The positions the line reaches `tokens_per_step` at; None where it never rises."""
        if self.per_doubling <= 0:
            return None
        return 2 ** ((tokens_per_step - self.intercept) / self.per_doubling)


def lineage(rows: list[dict]) -> tuple[float | None, list[Point]]:
    """The history's rows -> (the measure of the draft the lineage started from, one point per adopted draft with
    the positions of every adopted run up to it). Rows not adopted trained drafts that were thrown away: their
    positions are not the lineage's. A point's tokens per step is the latest draft's measure less the gains of the
    adopted runs after it, each gain its candidate against the committed draft measured together: where the measure
    itself changed between two runs (fitted tree values, 2026-12-05), every point moves with it, and the line's
    slope stays what training gave."""
    adopted = [row for row in rows if row["adopted"]]
    if not adopted:
        return (rows[0]["committed_tokens_per_step"] if rows else None), []
    level = adopted[-1]["candidate_tokens_per_step"]  # today's measure of the committed draft
    gains = [row["candidate_tokens_per_step"] - row["committed_tokens_per_step"] for row in adopted]
    points, seen = [], 0
    for i, row in enumerate(adopted):
        seen += row["trained_positions"]
        points.append(Point(seen, level - sum(gains[i + 1:]), row["date"]))
    return level - sum(gains), points


def log_fit(points: list[Point]) -> LogFit | None:
    """Least squares of tokens per step on log2(positions); None for fewer than 2 points or one position."""
    if len(points) < 2:
        return None
    xs = [math.log2(p.positions) for p in points]
    ys = [p.tokens_per_step for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mx) ** 2 for x in xs)
    if spread == 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / spread
    return LogFit(slope, my - slope * mx)


def section(rows: list[dict], rates: dict[str, float], image: str | None) -> str:
    """The page's section: the fit, the positions the target asks, and the hours that is at each measured rate
    (label -> positions per second)."""
    start, points = lineage(rows)
    fit = log_fit(points)
    head = "## The cost curve: tokens per step against positions trained\n\n"
    if fit is None:
        return head + "Fewer than two drafts adopted yet: no curve."
    last = points[-1]
    need = fit.positions_for(TARGET)
    text = (f"The adopted drafts ({len(points)}, from {start:.3f} tokens per step before any continual run, on "
            "the latest measure: each run's gain over the draft it started from, summed) lie on a "
            f"line of **{fit.per_doubling:+.3f} tokens per step each time the positions trained double** "
            f"(least squares in log2 of positions; every run also changed more than its data, so this is a crude "
            f"guide). The latest, {last.tokens_per_step:.3f} after {last.positions / 1e6:.2f}M positions, ")
    if need is None:
        return head + text + "is no better than the line's start: more of the same data is not the way."
    text += (f"would reach {TARGET} at about **{need / 1e6:,.0f}M positions** on that line, "
             f"{math.log2(need / last.positions):.1f} more doublings:")
    hours = "".join(f"\n- {label}: {need / rate / 3600:,.0f} hours at {rate:,.0f} positions/s" for label, rate in
                    rates.items())
    picture = f"\n\n![tokens per step against positions trained]({image})" if image else ""
    return head + text + hours + ("\n\nSo more of the same data is a long road for this draft (one decoder layer); "
                                  "a larger draft or a better training objective has to carry the rest." + picture)


def draw(rows: list[dict], path: Path, metadata: dict[str, str] | None = None) -> None:
    """The curve as a PNG (with `metadata` among its text chunks): the adopted drafts, the fitted line out to the
    target, the starting draft's level."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start, points = lineage(rows)
    fit = log_fit(points)
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    ax.plot([p.positions for p in points], [p.tokens_per_step for p in points], "o", label="adopted drafts")
    if fit is not None:
        end = max(fit.positions_for(TARGET) or points[-1].positions, points[-1].positions)
        xs = [points[0].positions * (end / points[0].positions) ** (i / 50) for i in range(51)]
        ax.plot(xs, [fit.at(x) for x in xs], "--", label=f"fit: {fit.per_doubling:+.3f} per doubling")
    if start is not None:
        ax.axhline(start, color="grey", lw=0.8, label="before continual training")
    ax.axhline(TARGET, color="red", lw=0.8, label=f"target {TARGET}")
    ax.set_xscale("log")
    ax.set_xlabel("positions trained by continual runs")
    ax.set_ylabel("MT-Bench tokens per step")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, metadata={"Software": None, **(metadata or {})})
    plt.close(fig)
