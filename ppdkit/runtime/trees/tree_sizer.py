"""Dynamic tree size (ProPD paper section 4.2): the tree each step verifies, chosen while decoding from an
online latency model and a running acceptance estimate, instead of one size profiled per machine.

Latency (4.2.1): a step's time is close to linear in the rows it feeds the model, t = b0 + b1 * rows.
Every step's (rows, seconds) updates that row count's smoothed time T(rows) <- (1 - a) T(rows) + a t; the
line is refitted by least squares weighted by exp(-lambda * steps since each row count was last seen), so
the times of the trees in use count most and old figures fade. The profile measured at load seeds it.

Acceptance (4.2.2, in the form our calibrated trees allow): each tree size n comes with its calibrated
tau(n), the tokens a step yields on held-out text. The text being decoded may be easier (code, repeats)
or harder, so a running ratio rho of the guesses accepted to those the calibration expected for the tree
in use scales every size's gain alike: tau'(n) = 1 + rho * (tau(n) - 1).

Every `every` steps the size with the highest tau'(n) / (b0 + b1 * rows(n)) is taken (4.2.3).
"""

import math
from dataclasses import dataclass, field


def weighted_line(xs: list[float], ys: list[float], ws: list[float]) -> tuple[float, float]:
    """(b0, b1) minimising sum_i w_i (y_i - b0 - b1 x_i)^2; a flat line through the weighted mean when the
    x's do not vary."""
    total = sum(ws)
    mx = sum(w * x for w, x in zip(ws, xs)) / total
    my = sum(w * y for w, y in zip(ws, ys)) / total
    sxx = sum(w * (x - mx) ** 2 for w, x in zip(ws, xs))
    if sxx <= 1e-12 * max(total, 1e-12):
        return my, 0.0
    b1 = sum(w * (x - mx) * (y - my) for w, x, y in zip(ws, xs, ys)) / sxx
    return my - b1 * mx, b1


@dataclass
class LatencyModel:
    alpha: float = 0.3  # weight of a new step time in its row count's smoothed time
    decay: float = 0.01  # lambda: per step since a row count was last seen
    times: dict[int, float] = field(default_factory=dict)  # rows -> smoothed seconds
    seen: dict[int, int] = field(default_factory=dict)  # rows -> the step it was last updated at
    clock: int = 0

    def observe(self, rows: int, seconds: float) -> None:
        old = self.times.get(rows)
        self.times[rows] = seconds if old is None else (1 - self.alpha) * old + self.alpha * seconds
        self.seen[rows] = self.clock
        self.clock += 1

    def coefficients(self) -> tuple[float, float]:
        rows = sorted(self.times)
        weights = [math.exp(-self.decay * (self.clock - self.seen[r])) for r in rows]
        return weighted_line([float(r) for r in rows], [self.times[r] for r in rows], weights)

    def predict(self, rows: int) -> float:
        b0, b1 = self.coefficients()
        return b0 + b1 * rows


@dataclass
class TreeSizer:
    taus: dict[int, float]  # tree size -> calibrated tokens per step
    rows: dict[int, int]  # tree size -> rows its (largest) step feeds
    size: int  # the size in use
    every: int = 8  # steps between choices
    rate: float = 0.1  # weight of a step in the running acceptance ratio
    latency: LatencyModel = field(default_factory=LatencyModel)
    ratio: float = 1.0  # rho: accepted guesses / the calibration's expectation
    steps: int = 0
    chosen: list[int] = field(default_factory=list)  # the size of every step, for the stats

    @classmethod
    def from_profile(cls, taus: dict[int, float], rows: dict[int, int], profile: dict | None, size: int,
                     **settings) -> "TreeSizer":
        """Seeded with the load-time profile's measured latencies (when there is one) as old observations."""
        sizer = cls(taus, rows, size, **settings)
        for row in (profile or {}).get("rows", []):
            if int(row["size"]) in rows:
                sizer.latency.observe(rows[int(row["size"])], row["latency_ms"] / 1000)
        return sizer

    def observe(self, rows: int, seconds: float, tokens: float) -> None:
        """One step: the rows it fed, its seconds, and the tokens it yielded (accepted guesses + 1)."""
        self.chosen.append(self.size)
        self.latency.observe(rows, seconds)
        expected = self.taus[self.size] - 1.0
        if expected > 1e-6:
            self.ratio = (1 - self.rate) * self.ratio + self.rate * (tokens - 1) / expected
        self.steps += 1
        if self.steps % self.every == 0:
            self.size = self.best()

    def best(self) -> int:
        """The size with the highest expected tokens per second now."""
        b0, b1 = self.latency.coefficients()

        def speed(size: int) -> float:
            return (1.0 + self.ratio * (self.taus[size] - 1.0)) / max(b0 + b1 * self.rows[size], 1e-9)

        return max(sorted(self.taus), key=speed)
