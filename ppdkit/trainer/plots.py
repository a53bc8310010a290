"""Training plots for the MLflow run (PNG, headless)."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_loss(history: list[list[float]], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 3.5))
    if history:
        steps, losses = zip(*history)
        ax.plot(steps, losses, lw=1.2)
    ax.set(xlabel="optimizer step", ylabel="decayed loss", title="training loss")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_accuracy_by_distance(evaluated: dict, k: int, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 3.5))
    distances = list(range(1, k + 1))
    tops = sorted(int(key[7:-3]) for key in evaluated if key.startswith("acc_top") and key.endswith("_d1"))
    width = 0.75 / len(tops)
    for j, top in enumerate(tops):
        values = [evaluated[f"acc_top{top}_d{d}"] for d in distances]
        ax.bar([d + (j - (len(tops) - 1) / 2) * width for d in distances], values, width, label=f"top-{top}")
    ax.set(xlabel="token distance", ylabel="held-out accuracy", ylim=(0, 1), xticks=distances,
           title="guess accuracy of the base model's greedy token")
    ax.legend()
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_search(ms_per_token: list[float], ar_ms_per_token: float, path: Path) -> None:
    """Each layer-skip trial's time per token, the best so far, and plain decoding's for scale."""
    fig, ax = plt.subplots(figsize=(6, 3.5))
    trials = range(1, len(ms_per_token) + 1)
    best = [min(ms_per_token[:i]) for i in trials]
    ax.scatter(trials, ms_per_token, s=12, alpha=0.6, label="trial")
    ax.plot(trials, best, lw=1.5, label="best so far")
    ax.axhline(ar_ms_per_token, color="grey", ls="--", lw=1, label="ar (no draft)")
    ax.set(xlabel="trial", ylabel="ms per verified token", title="layer-skip search")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_skip_map(skip: tuple[int, ...], path: Path) -> None:
    """The draft's sub-layers: a row for attention and one for MLP, a column per layer, dark where skipped."""
    import numpy as np

    grid = np.array([[s & 1 for s in skip], [(s >> 1) & 1 for s in skip]])  # [2, L]: SKIP_ATTENTION, SKIP_MLP
    fig, ax = plt.subplots(figsize=(max(4.0, 0.25 * len(skip) + 1.5), 1.8))
    ax.imshow(grid, cmap="Greys", vmin=0, vmax=1.4, aspect="equal")
    ax.set_xticks(range(0, len(skip), max(1, len(skip) // 15)))
    ax.set_yticks([0, 1], ["attention", "MLP"])
    ax.set_xlabel("decoder layer")
    ax.set_title(f"skipped by the draft (dark): {int(grid[0].sum())} attention, {int(grid[1].sum())} MLP")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
