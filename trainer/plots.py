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
