"""What the draft's A/B tools share (draft_layers.py, draft_objective.py, ppd_recipe.py): arms that all start from
the committed EAGLE-3 draft (or the same seeded draw of prompt tokens) and train on the same batches of the committed
corpus, online, each on its own AdamW at the same lr
schedule. Every step's batch is computed once by the frozen base for all arms (train.online's targets and states,
outside the arms' seconds); the held-out top-1 and top-5 at distances 1-4 of every arm are written every
--eval-every steps, with each arm's training seconds. Where the arms are decodable, each one's component can be
written at the end and measured as `ppdkit adopt` measures a candidate (its tree values fitted on held-out corpus
prompts, then tokens per step on the gate's measure: gate_measures)."""

import argparse
import json
import logging
import random
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import torch

from ppdkit.bench.decoding import machine_info
from ppdkit.data_pipeline.corpus import committed_corpus
from ppdkit.jobs.gpu_lane import COMPONENT, _sequences
from ppdkit.models.artifact import read_component, write_component
from ppdkit.models.loading import load_base_model
from ppdkit.trainer.config import TrainConfig
from ppdkit.trainer.online_teacher import OnlineTeacher
from ppdkit.trainer.training_methods import TRAINING_METHODS, cosine
from ppdkit.trainer.warm_start import starting_component

log = logging.getLogger("draft_ab")


def ab_arguments(description: str, out: Path, steps: int) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--batch", type=int, default=8, help="sequences a step (the recipe's 2 workers x 4)")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--depth", type=int, default=4, help="the training-time test's steps (train.head_depth)")
    p.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16-autocast"],
                   help="train.precision of every arm (auto times both at the start, which a busy CPU can mislead)")
    p.add_argument("--eval-every", type=int, default=60)
    p.add_argument("--eval-sequences", type=int, default=96)
    p.add_argument("--out", type=Path, default=out)
    return p


def top(metrics: dict, k: int, depth: int) -> list[float]:
    return [round(metrics[f"acc_top{k}_d{d}"], 4) for d in range(1, depth + 1)]


def run_ab(a: argparse.Namespace, argv: list[str] | None, tool: str, what: str, arms: dict[str, dict],
           prepare: Callable[[str, object], None] | None = None, components: Path | None = None,
           base_cfg: TrainConfig | None = None) -> dict:
    """Train `arms` (name -> the TrainConfig settings it changes) side by side; `prepare(name, run)` may change a
    run once made (a second layer). The report goes to a.out as it grows; with `components`, each arm's draft is
    written to components/<name> at the end. `base_cfg`: what every arm starts from (default: the committed EAGLE-3
    draft, trained online at a.lr); one without train.init_from starts every arm from the same seeded draw."""
    torch.manual_seed(0)
    loaded = load_base_model("smollm2-135m", "none", "float32", for_training=True)
    if base_cfg is None:
        shape = read_component(COMPONENT).hyperparameters
        base_cfg = TrainConfig(method="eagle3", online=True, init_from=str(COMPONENT), head_depth=a.depth,
                               draft_vocab=shape["draft_vocab"], precision=a.precision, lr=a.lr, micro_batch=a.batch,
                               num_workers=1)
    teacher = OnlineTeacher(loaded.model, 64, keep_bytes=3e9)
    train, holdout = _sequences(teacher, [committed_corpus("smollm2-135m")], loaded.fingerprint, loaded.tokenizer)
    holdout = holdout[:a.eval_sequences]
    method, init = TRAINING_METHODS[base_cfg.method], starting_component(base_cfg, loaded.fingerprint)
    started_from = Path(base_cfg.init_from).name if base_cfg.init_from else "a seeded draw"
    runs = {}
    for name, settings in arms.items():
        runs[name] = method.start(base_cfg.model_copy(update=settings), loaded, train, init, teacher=teacher)
        if prepare is not None:
            prepare(name, runs[name])
    optimizers = {name: torch.optim.AdamW(r.module.parameters(), lr=a.lr, weight_decay=0.0) for name, r in runs.items()}
    seconds, positions = {name: 0.0 for name in runs}, 0
    distances = min(r.distances for r in runs.values())  # the token distances every arm is scored at
    report = {"what": what, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join([f"python docs/tools/{tool}", *(argv if argv is not None else sys.argv[1:])]),
              "machine": machine_info(), "method": base_cfg.method, "started_from": started_from, "arms": arms,
              "settings": {k: v for k, v in vars(a).items() if k not in ("out", "components")},
              "train_sequences": len(train), "heldout_sequences": len(holdout), "evals": []}

    def evaluate(step: int) -> None:
        scores = {n: r.evaluate(r.module, holdout, step) for n, r in runs.items()}
        row = {"step": step, "positions": positions, **{n: top(s, 1, distances) for n, s in scores.items()},
               "top5": {n: top(s, 5, distances) for n, s in scores.items()}}
        report["evals"].append(row)
        report["train_seconds"] = {n: round(s, 1) for n, s in seconds.items()}
        log.info("%s", row)
        a.out.write_text(json.dumps(report, indent=1) + "\n")

    evaluate(0)
    order = list(range(len(train)))
    random.Random(0).shuffle(order)
    for step in range(a.steps):
        batch = [train[order[(step * a.batch + j) % len(order)]] for j in range(a.batch)]
        for s in batch:
            s.topk_ids  # the base's forward, shared by all arms, outside their seconds
        for name, r in runs.items():
            for group in optimizers[name].param_groups:
                group["lr"] = a.lr * cosine(step, a.steps)
            started = time.time()
            loss, _ = r.loss(r.module, batch, random.Random(step), step)
            loss.backward()
            optimizers[name].step()
            optimizers[name].zero_grad(set_to_none=True)
            seconds[name] += time.time() - started
        positions += sum(len(s.positions) for s in batch)  # the answer positions the step read
        if (step + 1) % a.eval_every == 0 or step + 1 == a.steps:
            evaluate(step + 1)
    if components is not None:
        for name, r in runs.items():
            tensors = {k: v.detach().to(torch.float16) if v.is_floating_point() else v
                       for k, v in r.export_tensors(r.module.state_dict()).items()}  # as adopt commits a draft
            write_component(arm_directory(components, name), base_cfg.method, r.hyperparameters(), "smollm2-135m",
                            loaded.fingerprint, {"ab": tool, "arm": name, "steps": a.steps,
                                                 "started_from": started_from}, tensors)
    return report


def arm_directory(components: Path, arm: str) -> Path:
    return components / arm.replace(" ", "-")


def gate_measures(report: dict, components: Path) -> dict:
    """Each arm's component in `components` on the adoption gate's measure (ppdkit/jobs/adopt.py's MEASURE, with its
    tree values fitted first, as adopt fits a candidate's) -> the report with `gate`: by arm, tokens per step and the
    share of steps keeping at least 1..5 guesses, and `identical`: the prompts on which every arm gave the same
    tokens (each is `ar`'s greedy output)."""
    from ppdkit.bench.decoding import load_prompts
    from ppdkit.jobs.adopt import MEASURE, measure_component
    from ppdkit.trainer.tree_values_fit import fit_tree_values

    prompts = load_prompts(MEASURE["prompts"], MEASURE["limit"])
    measured = {}
    for name in report["arms"]:
        path = arm_directory(components, name)
        fit_tree_values(path, committed_corpus("smollm2-135m"))
        measured[name] = measure_component(path, prompts, label=name)
    outputs = [m.outputs for m in measured.values()]
    report["gate"] = {"measure": MEASURE, **{n: {"tokens_per_step": round(m.tokens_per_step, 4),
                                                 "kept_share": m.kept_share} for n, m in measured.items()}}
    report["identical"] = sum(all(o[i] == outputs[0][i] for o in outputs) for i in range(len(prompts)))
    return report


def configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
