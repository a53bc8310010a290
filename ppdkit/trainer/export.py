"""End of training (rank 0): the component artifact from the best checkpoint, figures and plots.

The component is written to a temporary directory and renamed into place, and result.json (which the
driver reads as "training finished") is renamed into place last.
"""

import json
import shutil
from pathlib import Path

from ppdkit.models.artifact import write_component
from ppdkit.models.paths import write_json_atomic
from ppdkit.models.state_io import load_state

from .checkpoint import replace_dir
from .plots import plot_accuracy_by_distance, plot_loss


def export_component(out: Path, base, cfg, method_run, config: dict, history: list, evals: list, best: dict,
                     started_from: dict | None = None, extra: dict | None = None) -> dict:
    """`method_run`: the method's run (trainer/prompt_run.py, head_run.py), which names the tensors and hyperparameters;
    `started_from`: the run and step of the component train.init_from named, recorded as the new one's origin."""
    chosen = out / "best"
    tensors = method_run.export_tensors(load_state(chosen / "rank-0")["module"])
    meta = json.loads((chosen / "meta.json").read_text())
    hyper = method_run.hyperparameters()
    run = {"mlflow_run_id": config["tracker"].run_id, "step": meta["step"], "steps": history[-1][0] if history else 0,
           **({"started_from": started_from} if started_from else {})}
    tmp = out / "component.tmp"
    shutil.rmtree(tmp, ignore_errors=True)  # an export a crash interrupted
    write_component(tmp, cfg.method, hyper, base.name, base.fingerprint, run, tensors)
    component = out / "component"
    replace_dir(tmp, component)
    best_eval = next((e for e in evals if e["step"] == meta["step"]), evals[-1] if evals else {})
    result = {"steps": history[-1][0] if history else 0, "final_loss": history[-1][1] if history else None,
              "first_loss": history[0][1] if history else None, "best_step": meta["step"],
              "best": {k: v for k, v in best_eval.items() if k != "step"}, "component": str(component),
              "history": history, "evals": evals, **(extra or {})}
    plots = out / "plots"
    plots.mkdir(exist_ok=True)
    plot_loss(history, plots / "loss.png")
    if best_eval:
        plot_accuracy_by_distance(best_eval, method_run.distances, plots / "accuracy_by_distance.png")
    write_json_atomic(out / "result.json", result)
    return result
