"""The GPU lane: in a session lent a GPU, more of the corpus and a trained EAGLE-3 draft in minutes.

Run on the device machine by infra/gpu/lane.sh (docs/gpu-lane.md says how the base model and the wheels
get there). Two stages, each with its own time budget, each reported whatever the other did:
1. corpus: the base model writes Magpie conversations of the eight kinds with its own seed (`--seed`, not the CPU
   job's 0, so its prompts are new ones), through transformers' generate in large batches, into a corpus of its
   own, a shard of `--rows-per-shard` conversations at a time, each of the kind furthest below its share;
2. train: the committed draft trained further on the committed corpus and the new shards, online (the base computes
   the targets and states on the GPU, one padded forward per micro-batch: OnlineTeacher.prefetch), with a plain
   PyTorch loop: the device image has no Ray, DeepSpeed, MLflow or
   bitsandbytes, and one call cannot carry Ray's 79 MB wheel. Each step's gradients are averaged over the ranks
   through torch.distributed with the device plan's backend (nccl on a GPU), as DDP would: one rank here, so it
   proves nccl under a real training step, not scaling. Held-out top-1 at distances 1-4 before and after. The
   draft goes to OUT/component (float16), for `ppdkit adopt`.
`--total-minutes` bounds both: training stops early enough to evaluate and write within it whatever the corpus
stage took (its deadline is checked between shards, so its last shard may run over).
What comes back fits the device tool's limits (at most 8 files of at most 16 MiB, 64 MiB in all): the new corpus
packed in parts (OUT/corpus.tar.part-00, ...; `ppdkit corpus merge OUT` here), the component's two files and
OUT/lane.json. The corpus stage stops short of what five parts hold (~40M tokens, far more than a lane's minutes
write)
"""

import argparse
import json
import logging
import os
import random
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.distributed as dist

from ppdkit.bench.serving_backends import free_port
from ppdkit.data_pipeline.corpus import MANIFEST, committed_corpus, open_corpus, pack_corpus, read_rows
from ppdkit.data_pipeline.corpus_grow import CorpusConfig, grow_corpus, who_writes
from ppdkit.data_pipeline.holdout import CONTINUAL_HOLDOUT, CONTINUAL_HOLDOUT_SEED, split_holdout_by_id
from ppdkit.data_pipeline.prompt_kinds import KINDS
from ppdkit.models.artifact import read_component, write_component
from ppdkit.models.device_plan import current_device_plan
from ppdkit.models.loading import load_base_model

log = logging.getLogger("ppdkit.gpu_lane")
COMPONENT = Path(__file__).resolve().parents[1] / "models" / "components" / "smollm2-135m-eagle3"
PART_BYTES = 15 * 2**20  # a packed corpus's part: under the device tool's 16 MiB a file
MAX_PARTS = 5  # 8 files back: the parts, the component's weights and component.json, lane.json
ROW_BYTES = 700  # a corpus row at most on disk (512 tokens at ~1.3 bytes): what bounds the shards the parts hold
FINISH_SECONDS = 60  # kept from --total-minutes for the held-out evaluation after training and writing the draft


def machine(device: str) -> dict:
    """Where the lane ran, as a bench report records it (docs/tools/figure_blocks.py describes it)."""
    writer = who_writes(device)
    return {**({"gpu": writer["gpu"]} if "gpu" in writer else {}), "cpu": writer["cpu"], "isa": writer["cpu_units"],
            "logical_cores": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__}


def corpus_stage(out: Path, base: str, device: str, minutes: float, seed: int, batch: int, rows: int) -> dict:
    cfg = CorpusConfig(base_model=base, seed=seed, generate_batch=batch, rows_per_shard=rows,
                       mix={f"magpie-{kind}": 1.0 for kind in KINDS})
    report = grow_corpus(out / "corpus", cfg, max_shards=MAX_PARTS * PART_BYTES // (rows * ROW_BYTES),
                         hours=minutes / 60, device=device)
    (out / "corpus" / ".grow.lock").unlink(missing_ok=True)
    return report.summary()


def _sequences(teacher, corpora: list[Path], fingerprint: str, tokenizer):
    from ppdkit.data_pipeline.corpus import tokenizer_identity

    rows = []
    for root in corpora:
        corpus = open_corpus(root)
        corpus.check_base_model(fingerprint, tokenizer_identity(tokenizer))
        rows += read_rows(corpus)
    train, holdout = ([{"input_ids": row.input_ids, "loss_mask": row.loss_mask()} for row in split]
                      for split in split_holdout_by_id(rows, CONTINUAL_HOLDOUT, CONTINUAL_HOLDOUT_SEED))
    return ([s for s in teacher.sequences(train, "train") if len(s.positions) > 1],
            [s for s in teacher.sequences(holdout, "holdout") if len(s.positions) > 1])


def join_ranks(device: str) -> dict:
    """This process as rank 0 of 1 in a torch.distributed group on the device plan's backend (nccl on a GPU)."""
    backend = current_device_plan(device).distributed_backend
    if torch.device(device).type == "cuda":
        torch.cuda.set_device(torch.device(device).index or 0)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if backend == "nccl" else None
    return {"backend": backend, "world_size": dist.get_world_size(), **({"nccl": nccl} if nccl else {})}


def average_gradients(parameters) -> None:
    """Each gradient averaged over the ranks in one all-reduce of them all flattened, as DDP's buckets do."""
    grads = [p.grad for p in parameters if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])  # (sum of sizes,)
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def train_stage(out: Path, base: str, device: str, minutes: float, corpora: list[Path], component: Path,
                micro_batch: int, lr: float, eval_sequences: int, deadline: float, warmup_steps: int = 0) -> dict:
    """The committed draft trained further for `minutes` on `corpora` (and no later than `deadline` less the time
    to finish), online; its component in OUT/component."""
    from ppdkit.trainer.config import TrainConfig
    from ppdkit.trainer.training_methods import TRAINING_METHODS, cosine, warmup
    from ppdkit.trainer.online_teacher import OnlineTeacher, prefetch
    from ppdkit.trainer.warm_start import starting_component

    dtype = "bfloat16" if torch.device(device).type == "cuda" else "float32"
    loaded = load_base_model(base, "none", dtype, for_training=True)
    loaded.model.to(device)
    shape = read_component(component).hyperparameters  # the draft's own depth and vocabulary
    cfg = TrainConfig(method="eagle3", online=True, init_from=str(component), head_depth=shape["head_depth"],
                      draft_vocab=shape["draft_vocab"], precision="auto", lr=lr, warmup_steps=warmup_steps,
                      micro_batch=micro_batch, num_workers=1)
    teacher = OnlineTeacher(loaded.model, 64, keep_bytes=4e10 if dtype == "bfloat16" else 2e9)
    train, holdout = _sequences(teacher, corpora, loaded.fingerprint, loaded.tokenizer)
    holdout = holdout[:eval_sequences]
    run = TRAINING_METHODS["eagle3"].start(cfg, loaded, train, starting_component(cfg, loaded.fingerprint),
                                           teacher=teacher)
    run.module.to(device)
    for i in range(0, len(holdout), micro_batch):  # kept: the evaluation after training reads them again
        prefetch(holdout[i:i + micro_batch])
    before = run.evaluate(run.module, holdout, 0)
    try:
        ranks = join_ranks(device)
    except Exception as e:  # training goes on without the collective; the report says why
        log.exception("torch.distributed on %s did not start", device)
        ranks = {"error": f"{type(e).__name__}: {e}"}
    optimizer = torch.optim.AdamW(run.module.parameters(), lr=lr, weight_decay=0.0)
    order, step, positions, started = list(range(len(train))), 0, 0, time.time()
    random.Random(0).shuffle(order)
    budget, planned = min(minutes * 60, deadline - FINISH_SECONDS - started), None
    while time.time() - started < budget:
        rows = [order[(step * micro_batch + j) % len(order)] for j in range(micro_batch)]
        for group in optimizer.param_groups:  # cosine over the steps the budget holds, estimated after the first 20
            group["lr"] = lr * warmup(step, warmup_steps) * (cosine(step, planned) if planned is not None else 1.0)
        batch = [train[r] for r in rows]
        prefetch(batch)  # one base forward for the micro-batch
        loss, supervised = run.loss(run.module, batch, random.Random(step), step)
        loss.backward()
        if dist.is_initialized():
            average_gradients(run.module.parameters())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step, positions = step + 1, positions + supervised
        if step == 20:
            planned = max(21, int(budget / ((time.time() - started) / step)))
        if step % 100 == 0:
            log.info("step %d loss %.4f  %.0f positions/s", step, loss.item(), positions / (time.time() - started))
    seconds = time.time() - started
    if dist.is_initialized():
        dist.destroy_process_group()
    after = run.evaluate(run.module, holdout, step)
    tensors = {k: v.detach().cpu().half() if v.is_floating_point() else v.detach().cpu()
               for k, v in run.export_tensors(run.module.state_dict()).items()}
    write_component(out / "component", "eagle3", run.hyperparameters(), base, loaded.fingerprint,
                    {"gpu_lane": True, "steps": step, "started_from": component.name}, tensors)
    return {"steps": step, "seconds": round(seconds, 1), "positions": positions,
            "positions_per_second": round(positions / max(seconds, 1e-9), 1), "train_sequences": len(train),
            "heldout_sequences": len(holdout), "base_forwards": teacher.forwards, "distributed": ranks,
            "heldout_top1_before": [round(before[f"acc_top1_d{d}"], 4) for d in range(1, 5) if f"acc_top1_d{d}" in before],
            "heldout_top1_after": [round(after[f"acc_top1_d{d}"], 4) for d in range(1, 5) if f"acc_top1_d{d}" in after],
            "device": torch.cuda.get_device_name(device) if torch.device(device).type == "cuda" else "cpu"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="where what comes back is written ($OUT on the device)")
    parser.add_argument("--base", default="smollm2-135m")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--corpus-minutes", type=float, default=4.0)
    parser.add_argument("--train-minutes", type=float, default=4.0)
    parser.add_argument("--total-minutes", type=float, default=9.0, help="both stages end within this (the device "
                        "call's limit less the start and the transfers)")
    parser.add_argument("--seed", type=int, default=1, help="the lane's own seed: other Magpie prompts than the CPU's")
    parser.add_argument("--batch", type=int, default=2048, help="conversations generated together")
    parser.add_argument("--rows-per-shard", type=int, default=2048)
    parser.add_argument("--corpus", default=None, help="the corpus trained on with the new shards (default: "
                                                      "the committed one of --base)")
    parser.add_argument("--component", default=str(COMPONENT), help="the draft training starts from")
    parser.add_argument("--micro-batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--warmup-steps", type=int, default=0, help="steps of linear lr warm-up (train.warmup_steps)")
    parser.add_argument("--eval-sequences", type=int, default=64)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + args.total_minutes * 60
    report = {"kind": "gpu-lane", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join(["python -m ppdkit.jobs.gpu_lane", *(argv if argv is not None else sys.argv[1:])]),
              "machine": machine(args.device), "device": args.device, "stages": {}}
    for name, stage in (("corpus", lambda: corpus_stage(out, args.base, args.device, args.corpus_minutes, args.seed,
                                                        args.batch, args.rows_per_shard)),
                        ("train", lambda: train_stage(out, args.base, args.device, args.train_minutes,
                                                      [Path(args.corpus) if args.corpus else committed_corpus(args.base),
                                                       *([out / "corpus"] if (out / "corpus" / "corpus.json").is_file()
                                                         else [])],
                                                      Path(args.component), args.micro_batch, args.lr,
                                                      args.eval_sequences, deadline, args.warmup_steps))):
        started = time.time()
        try:
            report["stages"][name] = {"ok": True, **stage()}
        except Exception as e:  # the other stage's results still come back
            log.exception("stage %s failed", name)
            report["stages"][name] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        report["stages"][name]["wall_seconds"] = round(time.time() - started, 1)
        (out / "lane.json").write_text(json.dumps(report, indent=2))
    if (out / "corpus" / MANIFEST).is_file():  # trained on above; now packed to travel
        report["corpus_parts"] = [p.name for p in pack_corpus(out / "corpus", out, PART_BYTES)]
        (out / "lane.json").write_text(json.dumps(report, indent=2))
    return 0 if all(s["ok"] for s in report["stages"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
