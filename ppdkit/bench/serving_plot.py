"""A serving-load report (bench/serving_load.py) as a picture: total tokens/s against concurrent clients, one line
per server. Headless (Agg), in bench/plot.py's style: a hollow red marker where some answer of that level differed
from the same server's answer at 1 client."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .decoding import describe_machine  # noqa: E402

SIZE_INCHES, DPI = (8, 5), 100
DIVERGED = "tab:red"
LINES = ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:olive", "tab:cyan", "tab:pink")


def title(report: dict) -> str:
    source = report["source"].rstrip("/").rsplit("/", 1)[-1] if "://" not in report["source"] else report["source"]
    return (f"{source} ({report['method']}) and its peers: {report['prompts']} {Path(report['prompts_source']).name} "
            f"prompts, {report['max_tokens']} tokens, greedy\n{report['date'][:10]}, "
            f"{describe_machine(report['machine'])}")


def plot_serving(report: dict, path: Path) -> Path:
    """Draw `report` as a PNG at `path` (its folder made when missing); returns `path`."""
    ran = [s for s in report["servers"] if s["status"] == "ran"]
    if not ran:
        raise ValueError("no server ran in this report: nothing to plot (see its skipped and failed servers)")
    fig, ax = plt.subplots(figsize=SIZE_INCHES, dpi=DPI)
    for colour, server in zip(LINES * 2, ran):
        clients = [r["clients"] for r in server["levels"]]
        rates = [r["tokens_per_s"] for r in server["levels"]]
        ax.plot(clients, rates, marker="o", label=server["name"], color=colour)
        for r in server["levels"]:
            if r["identical"] < r["requests"]:
                ax.plot(r["clients"], r["tokens_per_s"], marker="o", markersize=12, markerfacecolor="none",
                        markeredgecolor=DIVERGED, linestyle="none")
        ax.annotate(f" {rates[-1]:.0f}", (clients[-1], rates[-1]), fontsize=8, color=colour, va="center")
    ax.set_xscale("log", base=2)
    ax.set_xticks(report["clients"], [str(c) for c in report["clients"]])
    ax.set_ylim(bottom=0)
    ax.margins(x=0.1)  # room for the last figure written beside each line
    ax.set(xlabel="concurrent clients", ylabel="total tokens/s (higher is better)")
    ax.grid(alpha=0.3)
    ax.legend()
    skipped = [s["name"] for s in report["servers"] if s["status"] != "ran"]
    notes = ([f"not run: {', '.join(skipped)}"] if skipped else []) + (
        ["red ring: some answers differed from that server's at 1 client"]
        if any(r["identical"] < r["requests"] for s in ran for r in s["levels"]) else [])
    if notes:
        ax.annotate("; ".join(notes), (0, 0), (0, -36), xycoords="axes fraction", textcoords="offset points",
                    fontsize=8, va="top")
    fig.suptitle(title(report), fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path
