"""One Ray Train worker = one DeepSpeed rank training a method's drafts (trainer/training_methods.py) against the
teacher cache.

Everything arrives through `config` (no module globals), so the function runs the same in a Ray Train
worker, a plain process, or a test. Rank 0 evaluates, logs to the tracker, keeps the best checkpoint
and writes the component artifact.
"""

import importlib
import logging
import os
import random
import time
from pathlib import Path

import torch

from ppdkit.data_pipeline.worker_log import log_to_file
from ppdkit.data_pipeline.worker_memory import bound_kernel_caches, release_freed_memory
from ppdkit.models.paths import write_json_atomic

log = logging.getLogger(__name__)
PROGRESS_FILE = "progress.json"  # rank 0's latest step, for the driver's bar (trainer/launch.py)
RELEASE_MEMORY_EVERY = 10  # steps between handing the allocator's freed pages back (data_pipeline/worker_memory.py)


def _setup_deepspeed_cpu() -> None:
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    # The shared-memory comm op is JIT-compiled on first use (35 s) and only speeds up CPU allreduce
    # of large tensors; prompt tokens are a few KB.
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None


def deepspeed_config(cfg) -> dict:
    return {
        "train_micro_batch_size_per_gpu": cfg.micro_batch,
        "gradient_accumulation_steps": cfg.grad_accum,
        "zero_optimization": {"stage": cfg.zero_stage},
        "bf16": {"enabled": cfg.precision == "bf16"},
        "steps_per_print": 10**9,
    }


def _distributed():
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), dist.barrier
    return 0, 1, lambda: None


def _mean_across_ranks(value: float, world: int) -> float:
    if world == 1:
        return value
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return t.item() / world


def subset_of_positions(sequences: list, positions: int, seed: int) -> list:
    """The sequences of a seeded shuffle up to the first whose positions reach `positions` (all, if they hold
    fewer), in cache order. A prefix of one shuffle: a smaller subset is inside every larger one, so a data-scaling
    table compares more data with the same data plus more."""
    order = list(range(len(sequences)))
    random.Random(f"subset-{seed}").shuffle(order)
    kept, total = [], 0
    for i in order:
        if total >= positions:
            break
        kept.append(i)
        total += len(sequences[i].positions)
    return [sequences[i] for i in sorted(kept)]


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    order = list(range(n))
    random.Random(f"order-{seed}-{epoch}").shuffle(order)
    return order


def micro_batch_rows(order: list[int], step_in_epoch: int, micro: int, cfg, rank: int, world: int) -> list[int]:
    """The rows rank `rank` reads at micro-step `micro` of a step (wrapping round a small dataset)."""
    per_step = cfg.micro_batch * cfg.grad_accum * world
    start = step_in_epoch * per_step + (micro * world + rank) * cfg.micro_batch
    return [order[(start + j) % len(order)] for j in range(cfg.micro_batch)]


def train_loop_per_worker(config: dict) -> None:
    bound_kernel_caches()  # first: before any oneDNN kernel is made
    _setup_deepspeed_cpu()
    import deepspeed

    from ppdkit.data_pipeline.teacher_cache import TeacherCache
    from ppdkit.models.config import BaseModelConfig
    from ppdkit.models.loading import load_base_model

    from .checkpoint import keep_as_best, latest_checkpoint, load_checkpoint, prune, restore_best, save_checkpoint
    from .config import TrainConfig
    from .export import export_component
    from .training_methods import TRAINING_METHODS
    from .warm_start import starting_component

    cfg = TrainConfig(**config["train"])
    base_cfg = BaseModelConfig(**config["base_model"])
    out = Path(config["output"])
    torch.set_num_threads(cfg.cpus_per_worker)
    torch.manual_seed(cfg.seed)
    rank, world, barrier = _distributed()
    log_to_file(out / f"worker-{rank}.log")
    # best effort: a tracking server that stops answering costs the metrics from then on, not the training
    tracker = config["tracker"].open(best_effort=True) if rank == 0 else None

    method = TRAINING_METHODS[cfg.method]
    if config.get("online"):  # train.online: the base computes targets and features in the training step
        base, teacher, train_seqs, holdout = _online_sequences(config["online"], base_cfg, cfg)
    else:
        teacher = TeacherCache(Path(config["teacher_dir"]))
        # heads over the frozen base's features train on the teacher's own forward: features computed here (a cache
        # without teacher.features) come from the base in the dtype the teacher computed in, as kept ones did
        dtype = teacher.float_dtype if method.reads_features else base_cfg.dtype
        base = load_base_model(base_cfg.name, base_cfg.quantization, dtype, for_training=True)
        teacher.check_base(base.fingerprint)
        # kept features (teacher.features) are memory-mapped, read only by the methods that train on them
        train_seqs = [s for s in teacher.sequences("train", teacher.has_features) if len(s.positions) > 1]
        holdout = [s for s in teacher.sequences("holdout", teacher.has_features)
                   if len(s.positions) > 1][: cfg.eval_sequences]
    if not train_seqs:
        raise ValueError(f"{getattr(teacher, 'dir', 'the data stage')} has no training sequence with targets")
    if cfg.train_positions is not None:
        train_seqs = subset_of_positions(train_seqs, cfg.train_positions, cfg.seed)
        log.info("training on %d sequences, %d supervised positions (train.train_positions=%d)", len(train_seqs),
                 sum(len(s.positions) for s in train_seqs), cfg.train_positions)
    init = starting_component(cfg, base.fingerprint)  # train.init_from's component, or None: a fresh draw
    run = method.start(cfg, base, train_seqs, init, teacher=teacher)  # trainer/prompt_run.py, head_run.py, ...
    steps_per_epoch = max(1, len(train_seqs) // (cfg.micro_batch * cfg.grad_accum * world))
    total_steps = min(cfg.max_steps or 10**12, steps_per_epoch * cfg.epochs)
    groups, lr_factors = run.param_groups(total_steps)  # cosine, no warm-up (6.1.2)
    optimizer = torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factors)
    engine, _, _, _ = deepspeed.initialize(model=run.module, optimizer=optimizer, lr_scheduler=scheduler,
                                           config=deepspeed_config(cfg))

    ckpt_root = out / "checkpoints"
    step, history, evals, best = 0, [], [], {"acc_top1_mean": -1.0, "step": None}
    trained = 0  # supervised positions of every rank so far: the "tokens trained on" of the D&V paper's table 9
    resume = latest_checkpoint(ckpt_root)
    if resume is not None:
        meta = load_checkpoint(resume, engine, rank)
        step, history, evals, best = meta["step"], meta["history"], meta["evals"], meta["best"]
        trained = meta.get("trained_positions", 0)
        if rank == 0:
            restore_best(ckpt_root, out / "best", best["step"])
        log.info("rank %d: resumed from %s at step %d", rank, resume.name, step)

    if holdout and step == 0:  # where the drafts start: the untrained figures every later evaluation improves on
        if rank == 0:
            evals.append({"step": 0, **run.evaluate(engine, holdout, 0)})
            tracker.log_metrics({f"eval.{key}": v for key, v in evals[-1].items() if key != "step"}, step=0)
        barrier()
    window_positions, window_start = 0, time.time()
    session_start, session_first_step = time.time(), step  # the ETA: this attempt's steps, not a resumed run's
    while step < total_steps:
        epoch, in_epoch = divmod(step, steps_per_epoch)
        order = epoch_order(len(train_seqs), cfg.seed, epoch)
        step_loss, supervised = 0.0, 0
        for micro in range(cfg.grad_accum):
            rows = micro_batch_rows(order, in_epoch, micro, cfg, rank, world)
            rng = random.Random(f"insert-{cfg.seed}-{epoch}-{in_epoch}-{micro}-{rank}")  # redrawn every epoch
            loss, positions = run.loss(engine, [train_seqs[r] for r in rows], rng, step)
            engine.backward(loss)
            engine.step()
            step_loss += loss.item() / cfg.grad_accum
            supervised += positions
        step += 1
        if step % RELEASE_MEMORY_EVERY == 0:
            release_freed_memory()
        fault = config.get("fault")
        if fault and rank == 0 and step == fault["at_step"] and not Path(fault["marker"]).exists():
            Path(fault["marker"]).write_text(str(step))
            os._exit(1)  # a worker dying mid-run (tests): Ray Train restarts the group, which resumes
        step_loss = _mean_across_ranks(step_loss, world)
        window_positions += supervised * world
        trained += supervised * world
        history.append([step, step_loss])
        if rank == 0:  # every step: the driver's bar moves with the training, not with log_every
            write_json_atomic(out / PROGRESS_FILE, {"step": step, "total": total_steps, "loss": step_loss})
        if rank == 0 and (step % cfg.log_every == 0 or step == total_steps):
            rate = window_positions / max(time.time() - window_start, 1e-9)
            eta = (total_steps - step) * (time.time() - session_start) / (step - session_first_step)
            tracker.log_metrics({"train.loss": step_loss, **run.lr_metrics(engine.get_lr()),
                                 "train.positions_per_second": rate, "train.epoch": epoch,
                                 "train.positions_trained": trained, "train.eta_s": eta}, step=step)
            log.info("step %d/%d loss %.4f  %.0f supervised positions/s  ETA %.0f s", step, total_steps, step_loss,
                     rate, eta)
            window_positions, window_start = 0, time.time()
        evaluated = None
        checkpointing = step % cfg.checkpoint_every == 0 or step == total_steps
        # every checkpoint is evaluated too: the kept one is chosen by held-out accuracy
        if holdout and (step % cfg.eval_every == 0 or checkpointing):
            if rank == 0:
                evaluated = run.evaluate(engine, holdout, step)
                evals.append({"step": step, **evaluated})
                tracker.log_metrics({f"eval.{key}": v for key, v in evaluated.items()}, step=step)
            barrier()
        if checkpointing:
            improved = rank == 0 and evaluated is not None and evaluated["acc_top1_mean"] > best["acc_top1_mean"]
            if improved:
                best = {"acc_top1_mean": evaluated["acc_top1_mean"], "step": step}
            directory = save_checkpoint(ckpt_root, step, engine, rank,
                                        {"history": history, "evals": evals, "best": best,
                                         "trained_positions": trained}, barrier)
            if rank == 0:
                if improved or best["step"] is None:
                    keep_as_best(directory, out / "best")
                prune(ckpt_root)
    peak = _peak_rss_mb(world)
    if rank == 0:
        started_from = None if init is None else {key: init.run.get(key) for key in ("mlflow_run_id", "step")}
        if init is not None and evals and evals[0]["step"] == 0 and evals[0]["acc_top1_mean"] >= best["acc_top1_mean"]:
            log.warning("no checkpoint of this run beat the component it started from (held-out top-1 %.4f at step 0, "
                        "best %.4f): the exported one is the best checkpoint; keep using %s", evals[0]["acc_top1_mean"],
                        best["acc_top1_mean"], cfg.init_from)
        export_component(out, base, cfg, run, config, history, evals, best, started_from,
                         extra={"peak_worker_rss_mb": peak, "trained_positions": trained})
    barrier()


def _online_sequences(online: dict, base_cfg, cfg):
    """(base, OnlineTeacher, training sequences, held-out sequences) of the data stage's rows: targets and features
    computed by the base, in the dtype the teacher stage would have used, when a batch first reads them."""
    from ppdkit.models.loading import load_base_model
    from ppdkit.runtime.precision import resolve_dtype

    from .online_teacher import ONLINE_KEEP_BYTES, OnlineTeacher

    dtype = resolve_dtype(online["compute_dtype"])  # on the worker: its own CPU decides what auto means
    base = load_base_model(base_cfg.name, base_cfg.quantization, dtype, for_training=True)
    teacher = OnlineTeacher(base.model, online["top_k"], ONLINE_KEEP_BYTES)
    train = teacher.split(online["data_dir"], "train")
    holdout = teacher.split(online["data_dir"], "holdout")[: cfg.eval_sequences]
    log.info("train.online: targets (top-%d) and features from %s (%s, on %s) in the training step", online["top_k"],
             base_cfg.name, dtype, teacher.engine)
    return base, teacher, train, holdout


def _peak_rss_mb(world: int) -> float:
    """The largest peak resident memory of any rank, in MB (ru_maxrss is in KB on Linux)."""
    import resource

    mine = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if world == 1:
        return mine
    import torch.distributed as dist

    t = torch.tensor([mine], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()
