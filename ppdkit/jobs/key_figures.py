"""What a run shows at a glance, from the stages' figures: its key figures, and a registered version's tags.

The evaluate stage logs every method's figures (`evaluate.ppd_tokens_per_s`, ...). Comparing runs in the runs
table needs a few short, stable names, one row per run: the decoding method that ran fastest among those the
run's component serves (`decode_method`), its tokens per step, tokens/s and speed against ar (`x_ar`: the
bundled runtime's plain decoding, so the ratio is what the draft adds), and `identical`: the lowest share of
prompts decoded exactly as greedy over every method of ours measured (1.0: all lossless on every prompt).
registry/runs_view.py lists these names as the columns of the experiment's saved view.
"""

from typing import Any

from ppdkit.runtime.decoding_methods import COMPONENT_FREE


def figure_prefix(method: str) -> str:
    """How the evaluate stage names a method's figures: ppd-head -> ppd_head_tokens_per_s, ppd_head_speedup ..."""
    return method.replace("-", "_")


def key_figures(decoding_methods: tuple[str, ...], evaluate: dict[str, Any]) -> tuple[dict[str, float], dict[str, str]]:
    """(metrics, tags) from the evaluate stage's figures (`decoding_methods`: those the training method's
    component serves, trainer/training_methods.py). A figure that was not measured is left out, never guessed."""
    key = {m: figure_prefix(m) for m in (*COMPONENT_FREE, *decoding_methods)}
    measured = [m for m in key if f"{key[m]}_tokens_per_s" in evaluate]
    metrics: dict[str, float] = {}
    if measured:
        metrics["identical"] = min(float(evaluate[f"{key[m]}_identical_to_greedy"]) for m in measured)
    own = [m for m in decoding_methods if m in measured]
    if not own:
        return metrics, {}
    best = max(own, key=lambda m: evaluate[f"{key[m]}_tokens_per_s"])
    metrics["tokens_per_step"] = float(evaluate[f"{key[best]}_accepted_per_step"])
    metrics["tokens_per_s"] = float(evaluate[f"{key[best]}_tokens_per_s"])
    if "ar_tokens_per_s" in evaluate:
        metrics["x_ar"] = evaluate[f"{key[best]}_tokens_per_s"] / evaluate["ar_tokens_per_s"]
    # 4 significant digits: the table cuts 2.47502092... to its column width (evaluate.* keep every digit)
    return {k: float(f"{v:.4g}") for k, v in metrics.items()}, {"decode_method": best}


def registry_tags(method_name: str, base_model: str, fingerprint: str, train: dict, calibrate: dict,
                  evaluate: dict) -> dict[str, Any]:
    """A registered version's tags: what it is, and the figures of the decoding methods its training method
    serves (trainer/training_methods.py), each only where the evaluate stage measured it."""
    from ppdkit.trainer.training_methods import TRAINING_METHODS

    size = evaluate["tree_size"]
    taus = {k: v for k, v in calibrate.items() if k.startswith("tau_size")}
    tags = {"method": method_name, "base_model": base_model, "fingerprint": fingerprint,
            **{k.removeprefix("best_"): v for k, v in train.items() if k.startswith("best_acc_top1_d")}}
    if taus:  # a method with calibrated trees
        tags.update(tree_size=size, tau=calibrate.get(f"tau_size{size}", max(taus.values())))
    keys = [figure_prefix(m) for m in (*COMPONENT_FREE, *TRAINING_METHODS[method_name].decoding_methods)]
    measured = [key for key in keys if f"{key}_speedup" in evaluate]
    for key in measured:
        tags[f"{key}_speedup"] = evaluate[f"{key}_speedup"]
        tags[f"{key}_accepted_per_step"] = evaluate[f"{key}_accepted_per_step"]
    if measured:
        tags["identical_to_greedy"] = min(evaluate[f"{key}_identical_to_greedy"] for key in measured)
    # what the UI shows: 4 significant digits, and nothing for a figure that was not measured
    return {k: f"{v:.4g}" if isinstance(v, float) else v for k, v in tags.items() if v is not None}
