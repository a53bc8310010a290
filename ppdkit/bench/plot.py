"""A bench report (bench/decoding.py) as a picture: tokens/s and tokens per step by method, side by side.

Used by `ppdkit bench --plot`, the evaluate stage (logged to the run next to bench.json) and
docs/tools/results_page.py. Headless (Agg), so it draws on a cluster worker as on a laptop.
"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .decoding import describe_machine  # noqa: E402

SIZE_INCHES, DPI = (12, 5), 100  # 1200 x 500 px: two panels of about a dozen methods, readable on a code host
REFERENCE = "tab:gray"  # the baselines (hf-greedy, ar): what the drafts are measured against
DRAFTED = "tab:blue"
DIVERGED = "tab:red"  # a method whose output differed from greedy on some prompt: its speed is not a lossless one


def _label(row: dict) -> str:
    return f"{row['method']} ({row['ran']})" if "ran" in row else row["method"]


def _ratios(row: dict) -> str:
    """What is written on a tokens/s bar: its ratio to ar (our plain decoding) and to transformers' greedy."""
    parts = [f"{row['speedup_vs_ar']:.2f}x ar"] if "speedup_vs_ar" in row else []
    parts.append(f"{row['speedup_vs_hf_greedy']:.2f}x greedy")
    if row["identical_to_greedy"] < 1:
        parts.append(f"identical {row['identical_to_greedy']:.0%}")
    return ", ".join(parts)


def title(report: dict) -> str:
    """Model, prompts, and (for reports that carry them) the date and machine."""
    model = report["model"].rstrip("/").rsplit("/", 1)[-1] if "://" not in report["model"] else report["model"]
    prompts = report["results"][0]["prompts"] if report["results"] else 0
    head = (f"{model} on {Path(report['prompts_source']).name}: {prompts} prompts, "
            f"{report['max_new_tokens']} new tokens, best of {report.get('repeats', 1)}, "
            f"weights {report.get('dtype', 'float32')}")
    if "machine" not in report:
        return head
    return f"{head}\n{report['date'][:10]}, {describe_machine(report['machine'])}"


def plot_report(report: dict, path: Path, metadata: dict[str, str] | None = None) -> Path:
    """Draw `report` as a PNG at `path` (its folder made when missing); returns `path`. `metadata` goes into the
    PNG's text fields (docs/tools/results_page.py records there which report a picture was drawn from)."""
    rows = report["results"]
    if not rows:
        raise ValueError("the bench report has no results to plot (was it run with no methods?)")
    labels = [_label(r) for r in rows][::-1]  # top to bottom in the report's order
    colours = [REFERENCE if r["method"] in ("hf-greedy", "hf-pld", "ar") else
               DIVERGED if r["identical_to_greedy"] < 1 else DRAFTED for r in rows][::-1]
    fig, (speed, per_step) = plt.subplots(1, 2, figsize=SIZE_INCHES, dpi=DPI, sharey=True,
                                          gridspec_kw={"width_ratios": [3, 2]})
    rates = [r["tokens_per_s"] for r in rows][::-1]
    bars = speed.barh(labels, rates, color=colours)
    for bar, row in zip(bars, rows[::-1]):
        speed.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {row['tokens_per_s']:.1f}  {_ratios(row)}",
                   va="center", fontsize=8, color=DIVERGED if row["identical_to_greedy"] < 1 else "black")
    speed.set_xlim(0, max(rates) * 1.7)  # room for the ratios written after the longest bar
    speed.set(xlabel="tokens/s (higher is better)", title="decoding speed")
    steps = [r["mean_accepted_per_step"] for r in rows][::-1]
    bars = per_step.barh(labels, steps, color=colours)
    per_step.bar_label(bars, fmt=" %.2f", fontsize=8)
    per_step.set_xlim(0, max(steps) * 1.2)
    per_step.set(xlabel="tokens per model step (1 = no drafting)", title="tokens accepted per step")
    for ax in (speed, per_step):
        ax.grid(alpha=0.3, axis="x")
    if any(r["identical_to_greedy"] < 1 for r in rows):
        speed.annotate("red: output differed from its reference on some prompts (identical)", (0, 0), (0, -32),
                       xycoords="axes fraction", textcoords="offset points", fontsize=8, color=DIVERGED, va="top")
    fig.suptitle(title(report), fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, metadata=metadata)
    plt.close(fig)
    return path
