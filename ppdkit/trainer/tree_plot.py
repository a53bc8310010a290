"""Pictures of calibrated dynamic sparse trees, for the MLflow run (one panel per state)."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ppdkit.runtime.trees.tree import DynamicTree  # noqa: E402


def plot_tree(tree: DynamicTree, path: Path, title: str) -> None:
    """Guess nodes by depth (x) and order (y), edges to parents, each labelled rank/prompt tokens."""
    states = sorted(tree.states)
    fig, axes = plt.subplots(1, len(states), figsize=(4 * len(states), 4), squeeze=False)
    for ax, k in zip(axes[0], states):
        state = tree.states[k]
        rows: dict[int, int] = {}
        ys = []
        for depth in state.depths:
            ys.append(rows.get(depth, 0))
            rows[depth] = ys[-1] + 1
        for node, parent in enumerate(state.parents):
            if parent >= 0:
                ax.plot([state.depths[parent], state.depths[node]], [-ys[parent], -ys[node]], color="0.6", lw=1)
        ax.scatter(state.depths, [-y for y in ys], s=[60 + 40 * p for p in state.prompts],
                   c=state.prompts, cmap="viridis", zorder=3)
        for node in range(len(state.parents)):
            label = "root" if node == 0 else f"r{state.ranks[node]}"
            ax.annotate(f"{label}/{state.prompts[node]}", (state.depths[node], -ys[node]), fontsize=7,
                        xytext=(4, 4), textcoords="offset points")
        ax.set(title=f"state {k}: f={tree.f[k]:.2f}, p={tree.steady[k]:.2f}", xlabel="depth (token distance)",
               yticks=[], xticks=range(max(state.depths) + 1))
    fig.suptitle(f"{title}: tau={tree.tau:.2f} tokens/step (label: guess rank / prompt tokens)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
