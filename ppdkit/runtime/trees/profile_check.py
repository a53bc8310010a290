"""Cached timings checked against the live steps: a latency profile (runtime/trees/profile.py) or auto's trial
(runtime/auto.py) measured while something else ran stays cached and misleads every later decode on this machine (on
a 2-core Xeon, one taken beside a test suite and a compile read 85.7 ms for a one-row step that takes 8.9 ms quiet;
every later tree was sized from it, and nothing said so).

The decoder times every step anyway. A machine cannot run faster than it can, so live steps clearly faster than a
cached figure prove the figure was taken on a busier machine: it is measured again. Live steps slower than the figure
prove nothing (something may run beside this decode now, or its contexts are longer than the profile's) and change
nothing, so a busy machine never writes its slowness over a quiet one's figure."""

from collections import deque
from dataclasses import dataclass, field

import numpy as np

FASTER = 1.5  # live steps this many times faster than a cached figure: the figure is stale (noise is ~10-30%)
MIN_STEPS = 16  # steps seen before judging: a few fast steps are no proof
RECENT_STEPS = 256  # the steps judged: the latest, so a long-lived decoder's check costs the same at every answer


def profile_seconds(profile: dict) -> tuple[list[int], list[float]]:
    """A tree profile's forward times by rows: (rows ascending, seconds), one row and each measured size, drafting
    excluded."""
    measured = {1: profile["one_token_ms"] / 1000}
    for row in profile["rows"]:
        measured[int(row["size"])] = (row["latency_ms"] - row["draft_ms"]) / 1000
    rows = sorted(measured)
    return rows, [measured[n] for n in rows]


@dataclass
class StepCheck:
    """Live steps' seconds against what a cached figure predicts for them (`rows`, `seconds`: the figure's measured
    points; a step of other rows is priced between its neighbours). `stale` once at least MIN_STEPS steps were seen
    and the median ratio of the latest RECENT_STEPS says the figure is FASTER times too slow."""

    rows: list[int]
    seconds: list[float]
    ratios: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_STEPS))  # live / predicted, a step each

    @classmethod
    def of_profile(cls, profile: dict) -> "StepCheck":
        return cls(*profile_seconds(profile))

    def predicted(self, rows: int) -> float:
        return float(np.interp(rows, self.rows, self.seconds))

    def observe(self, rows: int, seconds: float) -> None:
        self.ratios.append(seconds / self.predicted(rows))

    def median(self) -> float:
        return float(np.median(self.ratios)) if self.ratios else 1.0

    def stale(self) -> bool:
        return len(self.ratios) >= MIN_STEPS and self.median() * FASTER < 1.0

    def describe(self) -> str:
        """The steps against the figure, for the log."""
        return f"{len(self.ratios)} recent steps ran {1 / self.median():.1f}x faster than that (median)"
