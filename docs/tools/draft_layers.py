"""Does a second decoder layer help the EAGLE-3 draft? An A/B on the same batches: the committed one-layer draft
trained further, against the same draft with a second layer, on the committed corpus, online.

The second layer is what vLLM stacks after the first in its EAGLE-3 drafts: a plain Llama decoder layer over the
first layer's output h (input width H, not the first layer's 2H), with its own attention over the same positions,
read out by the same norm and LM head; its output is the state the next draft step reads. Its output projections
start at zero, so both arms start as the committed draft (step 0's figures are equal). Every step reads one batch
that the frozen base computes once for both arms (train.online's targets and states), each arm on its own AdamW at
the same lr schedule, and the held-out top-1 at distances 1-4 of both is written every --eval-every steps, with
each arm's training seconds (the base's forward left out). Not a decodable component: the runtime drafts one layer.

    .venv/bin/python docs/tools/draft_layers.py --steps 240      # ~70 minutes on 2 cores
"""

import argparse
import json
import logging
import random
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from torch import nn

from ppdkit.bench.decoding import machine_info
from ppdkit.data_pipeline.corpus import committed_corpus
from ppdkit.jobs.gpu_lane import COMPONENT, _sequences
from ppdkit.models.artifact import read_component
from ppdkit.models.draft_heads import apply_linear
from ppdkit.models.eagle3 import rms_norm
from ppdkit.models.loading import load_base_model
from ppdkit.trainer.config import TrainConfig
from ppdkit.trainer.eagle3_run import Eagle3Run
from ppdkit.trainer.online_teacher import OnlineTeacher
from ppdkit.trainer.training_methods import TRAINING_METHODS, cosine
from ppdkit.trainer.warm_start import starting_component

log = logging.getLogger("draft_layers")
OUT = Path(__file__).resolve().parents[1] / "measurements" / "draft-layers.json"
SECOND = "layer1."  # the second layer's tensor names: SECOND + a Llama decoder layer's


def add_second_layer(run: Eagle3Run, seed: int = 1) -> None:
    """The run's module gains a second layer that starts as the identity (zero output projections)."""
    w = run.module()
    h = w["fc.weight"].shape[0]
    q, kv = w["midlayer.self_attn.q_proj.weight"].shape[0], w["midlayer.self_attn.k_proj.weight"].shape[0]
    inner = w["midlayer.mlp.gate_proj.weight"].shape[0]
    gen = torch.Generator().manual_seed(seed)
    shapes = {"input_layernorm.weight": (h,), "self_attn.q_proj.weight": (q, h), "self_attn.k_proj.weight": (kv, h),
              "self_attn.v_proj.weight": (kv, h), "self_attn.o_proj.weight": (h, q),
              "post_attention_layernorm.weight": (h,), "mlp.gate_proj.weight": (inner, h),
              "mlp.up_proj.weight": (inner, h), "mlp.down_proj.weight": (h, inner)}
    for name, shape in shapes.items():
        if len(shape) == 1:
            value = torch.ones(shape)
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            value = torch.zeros(shape)
        else:
            value = torch.randn(shape, generator=gen) * 0.02
        run.module.weights[(SECOND + name).replace(".", "__")] = nn.Parameter(value.to(run.device))


class TwoLayerRun(Eagle3Run):
    """Eagle3Run's training-time test with the second layer after the first at every step."""

    def _draft_step(self, w, x, hidden, kv, cos, sin, real):
        h0 = super()._draft_step(w, x, hidden, kv, cos, sin, real)  # [B, T, H] the first layer's
        x1 = rms_norm(h0, w[SECOND + "input_layernorm.weight"], self.eps)
        u = h0 + apply_linear(self._attended(w, x1, SECOND, kv[SECOND], cos, sin, real),
                              w[SECOND + "self_attn.o_proj.weight"])
        y = rms_norm(u, w[SECOND + "post_attention_layernorm.weight"], self.eps)
        gate, up = (apply_linear(y, w[SECOND + f"mlp.{m}_proj.weight"]) for m in ("gate", "up"))
        return u + apply_linear(nn.functional.silu(gate) * up, w[SECOND + "mlp.down_proj.weight"])


def top1(metrics: dict, depth: int) -> list[float]:
    return [round(metrics[f"acc_top1_d{d}"], 4) for d in range(1, depth + 1)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=240)
    p.add_argument("--batch", type=int, default=8, help="sequences a step (the recipe's 2 workers x 4)")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--depth", type=int, default=4, help="the training-time test's steps (train.head_depth)")
    p.add_argument("--eval-every", type=int, default=60)
    p.add_argument("--eval-sequences", type=int, default=96)
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    torch.manual_seed(0)
    loaded = load_base_model("smollm2-135m", "none", "float32", for_training=True)
    shape = read_component(COMPONENT).hyperparameters
    cfg = TrainConfig(method="eagle3", online=True, init_from=str(COMPONENT), head_depth=a.depth,
                      draft_vocab=shape["draft_vocab"], precision="auto", lr=a.lr, micro_batch=a.batch, num_workers=1)
    teacher = OnlineTeacher(loaded.model, 64, keep_bytes=3e9)
    train, holdout = _sequences(teacher, [committed_corpus("smollm2-135m")], loaded.fingerprint, loaded.tokenizer)
    holdout = holdout[:a.eval_sequences]
    method, init = TRAINING_METHODS["eagle3"], starting_component(cfg, loaded.fingerprint)
    runs = {"one layer": method.start(cfg, loaded, train, init, teacher=teacher),
            "two layers": method.start(cfg, loaded, train, init, teacher=teacher)}
    runs["two layers"].__class__ = TwoLayerRun
    add_second_layer(runs["two layers"])
    optimizers = {name: torch.optim.AdamW(r.module.parameters(), lr=a.lr, weight_decay=0.0) for name, r in runs.items()}
    seconds, positions = {name: 0.0 for name in runs}, 0
    report = {"what": __doc__.splitlines()[0], "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join(["python docs/tools/draft_layers.py", *(argv if argv is not None else sys.argv[1:])]),
              "machine": machine_info(), "started_from": COMPONENT.name,
              "settings": {k: v for k, v in vars(a).items() if k != "out"}, "evals": []}

    def evaluate(step: int) -> None:
        row = {"step": step, "positions": positions, **{n: top1(r.evaluate(r.module, holdout, step), a.depth)
                                                         for n, r in runs.items()}}
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
            s.topk_ids  # the base's forward, shared by both arms, outside their seconds
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
