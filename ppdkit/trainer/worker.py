"""One Ray Train worker = one DeepSpeed rank training a method's drafts (trainer/training_methods.py) against the
teacher cache.

Everything arrives through `config` (no module globals), so the function runs the same in a Ray Train
worker, a plain process, or a test. Rank 0 evaluates, logs to the tracker, keeps the best checkpoint
and writes the component artifact.
"""

import importlib
import json
import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ppdkit.data_pipeline.worker_log import log_to_file
from ppdkit.data_pipeline.worker_memory import bound_kernel_caches, release_freed_memory
from ppdkit.models.device_plan import current_device_plan
from ppdkit.models.paths import write_json_atomic

from .config import WeightTrainingConfig, train_config
from .training_methods import warmed

log = logging.getLogger(__name__)
PROGRESS_FILE = "progress.json"  # rank 0's latest step, for the driver's bar (trainer/launch.py)
PLACEMENT_FILE = "placement.json"  # each attempt's ranks and the nodes they ran on, for the driver's log
RELEASE_MEMORY_EVERY = 10  # steps between handing the allocator's freed pages back (data_pipeline/worker_memory.py)


def _setup_deepspeed_accelerator() -> None:
    plan = current_device_plan()
    os.environ.setdefault("DS_ACCELERATOR", plan.deepspeed_accelerator)
    if plan.skip_shm_comm_build:
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


def _collective_device(dist) -> torch.device:
    """Where a collective's tensor must live: nccl reduces GPU tensors only (this rank's GPU), gloo CPU ones."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def _mean_across_ranks(value: float, world: int) -> float:
    if world == 1:
        return value
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64, device=_collective_device(dist))
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


@dataclass(frozen=True)
class Ranks:
    rank: int
    world: int
    barrier: Callable[[], None]  # every rank waits here (a no-op in a single process)


@dataclass
class Progress:
    """What a checkpoint keeps of the run besides the weights, and what the export reports."""
    step: int = 0
    history: list = field(default_factory=list)  # [step, mean loss across ranks]
    evals: list = field(default_factory=list)  # {"step": s, **held-out figures}
    best: dict = field(default_factory=lambda: {"acc_top1_mean": -1.0, "step": None})
    trained: int = 0  # supervised positions of every rank so far: the "tokens trained on" of the D&V paper's table 9

    def meta(self) -> dict:
        return {"history": self.history, "evals": self.evals, "best": self.best, "trained_positions": self.trained}

    @classmethod
    def from_meta(cls, meta: dict) -> "Progress":
        return cls(meta["step"], meta["history"], meta["evals"], meta["best"], meta.get("trained_positions", 0))


@dataclass
class Training:
    """One worker's run: its config, its rank, the method's run and DeepSpeed engine, the data, the bookkeeping."""
    cfg: WeightTrainingConfig
    config: dict  # the driver's train_loop_config (trainer/launch.py)
    ranks: Ranks
    out: Path
    tracker: Any  # rank 0's tracker, None on the others
    base: Any
    run: Any  # the method's TrainingRun (trainer/training_run.py)
    engine: Any
    train_seqs: list
    holdout: list
    total_steps: int
    steps_per_epoch: int
    progress: Progress = field(default_factory=Progress)

    @property
    def checkpoints(self) -> Path:
        return self.out / "checkpoints"


def train_loop_per_worker(config: dict) -> None:
    bound_kernel_caches()  # first: before any oneDNN kernel is made
    _setup_deepspeed_accelerator()
    from .training_methods import TRAINING_METHODS
    from .warm_start import starting_component

    cfg = train_config(config["train"])
    out = Path(config["output"])
    torch.set_num_threads(cfg.cpus_per_worker)
    torch.manual_seed(cfg.seed)
    ranks = Ranks(*_distributed())
    log_to_file(out / f"worker-{ranks.rank}.log")
    # best effort: a tracking server that stops answering costs the metrics from then on, not the training
    tracker = config["tracker"].open(best_effort=True) if ranks.rank == 0 else None
    base, teacher, train_seqs, holdout = _training_data(config, cfg)
    init = starting_component(cfg, base.fingerprint)  # train.init_from's component, or None: a fresh draw
    run = TRAINING_METHODS[cfg.method].start(cfg, base, train_seqs, init, teacher=teacher)  # prompt_run.py, ...
    engine, total_steps, steps_per_epoch = _engine(cfg, run, len(train_seqs), ranks.world)
    t = Training(cfg, config, ranks, out, tracker, base, run, engine, train_seqs, holdout, total_steps, steps_per_epoch)
    _resume(t)
    _record_placement(t)
    _evaluate_the_start(t)
    window = _Window(t.progress.step)
    started, trained_before = time.time(), t.progress.trained
    while t.progress.step < t.total_steps:
        epoch = t.progress.step // t.steps_per_epoch
        step_loss, supervised = _optimizer_step(t)
        window.add(supervised * ranks.world)
        _record_step(t, step_loss, supervised, epoch, window)
        _evaluate_and_checkpoint(t)
    # this attempt's steps alone (a resumed run's earlier steps took another attempt's time), evaluations included
    _export(t, init, (t.progress.trained - trained_before) / max(time.time() - started, 1e-9))


def _training_data(config: dict, cfg: WeightTrainingConfig) -> tuple[Any, Any, list, list]:
    """(the frozen base, the teacher: its cache or train.online's OnlineTeacher, the training sequences (the subset
    train.train_positions asks for), the held-out ones)."""
    from ppdkit.data_pipeline.teacher_cache import TeacherCache
    from ppdkit.models.config import BaseModelConfig
    from ppdkit.models.loading import load_base_model

    from .training_methods import TRAINING_METHODS

    base_cfg = BaseModelConfig(**config["base_model"])
    if config.get("online"):  # train.online: the base computes targets and features in the training step
        base, teacher, train_seqs, holdout = _online_sequences(config["online"], base_cfg, cfg)
    else:
        teacher = TeacherCache(Path(config["teacher_dir"]))
        # heads over the frozen base's features train on the teacher's own forward: features computed here (a cache
        # without teacher.features) come from the base in the dtype the teacher computed in, as kept ones did
        dtype = teacher.float_dtype if TRAINING_METHODS[cfg.method].reads_features else base_cfg.dtype
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
    return base, teacher, train_seqs, holdout


def _engine(cfg: WeightTrainingConfig, run, sequences: int, world: int) -> tuple[Any, int, int]:
    """(the DeepSpeed engine of the run's module, its optimizer on the method's schedule (cosine: 6.1.2) after
    train.warmup_steps of linear warm-up, the steps of the run, the steps of an epoch)."""
    import deepspeed

    steps_per_epoch = max(1, sequences // (cfg.micro_batch * cfg.grad_accum * world))
    total_steps = min(cfg.max_steps or 10**12, steps_per_epoch * cfg.epochs)
    groups, lr_factors = run.param_groups(total_steps)
    optimizer = torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, [warmed(f, cfg.warmup_steps) for f in lr_factors])
    engine, _, _, _ = deepspeed.initialize(model=run.module, optimizer=optimizer, lr_scheduler=scheduler,
                                           config=deepspeed_config(cfg))
    return engine, total_steps, steps_per_epoch


def _resume(t: Training) -> None:
    """Continue from the latest checkpoint of an earlier attempt (Ray Train restarted the group), if any."""
    from .checkpoint import latest_checkpoint, load_checkpoint, restore_best

    resume = latest_checkpoint(t.checkpoints)
    if resume is None:
        return
    t.progress = Progress.from_meta(load_checkpoint(resume, t.engine, t.ranks.rank))
    if t.ranks.rank == 0:
        restore_best(t.checkpoints, t.out / "best", t.progress.best["step"])
    log.info("rank %d: resumed from %s at step %d", t.ranks.rank, resume.name, t.progress.step)


def _record_placement(t: Training) -> None:
    """Rank 0 appends this attempt (Ray Train restarts the whole group after a lost worker or node) to
    OUT/placement.json: the step it starts from, the node of every rank and what an all-reduce costs between them."""
    import ray

    from ppdkit.data_pipeline.ray_placement import this_node

    node = this_node() if ray.is_initialized() else {"node": "local", "head": True}  # a plain process: no Ray
    nodes, allreduce = [node], None
    if t.ranks.world > 1:
        import torch.distributed as dist

        nodes = [None] * t.ranks.world
        dist.all_gather_object(nodes, node)
        allreduce = _allreduce_cost(t)
    if t.ranks.rank != 0:
        return
    path = t.out / PLACEMENT_FILE
    attempts = json.loads(path.read_text()) if path.is_file() else []
    attempts.append({"from_step": t.progress.step, "ranks": nodes, "allreduce": allreduce})
    write_json_atomic(path, attempts)


def _allreduce_cost(t: Training, repeats: int = 5) -> dict:
    """What one all-reduce of the trainable parameters' gradients costs between these ranks (gloo on a CPU, nccl on
    GPUs): the traffic a step adds when the ranks are on different nodes, timed where they are."""
    import torch.distributed as dist

    trainable = [p for p in t.engine.module.parameters() if p.requires_grad]
    numel = sum(p.numel() for p in trainable)
    # where the gradients are: nccl all-reduces GPU tensors only, and returns before a GPU has finished
    grads = torch.zeros(numel, dtype=torch.float32, device=trainable[0].device)  # [N]
    dist.all_reduce(grads)  # the first one connects
    seconds = []
    for _ in range(repeats):
        t.ranks.barrier()
        started = time.perf_counter()
        dist.all_reduce(grads)
        if grads.is_cuda:
            torch.cuda.synchronize(grads.device)
        seconds.append(time.perf_counter() - started)
    return {"bytes": 4 * numel, "median_ms": round(1000 * sorted(seconds)[repeats // 2], 3)}


def _evaluate_the_start(t: Training) -> None:
    """Where the drafts start: the untrained figures every later evaluation improves on."""
    if not t.holdout or t.progress.step != 0:
        return
    if t.ranks.rank == 0:
        t.progress.evals.append({"step": 0, **t.run.evaluate(t.engine, t.holdout, 0)})
        t.tracker.log_metrics({f"eval.{key}": v for key, v in t.progress.evals[-1].items() if key != "step"}, step=0)
    t.ranks.barrier()


def _optimizer_step(t: Training) -> tuple[float, int]:
    """One optimizer step of grad_accum micro-steps on this rank's rows: (its mean loss, its supervised positions)."""
    from .online_teacher import prefetch

    cfg, rank, world = t.cfg, t.ranks.rank, t.ranks.world
    epoch, in_epoch = divmod(t.progress.step, t.steps_per_epoch)
    order = epoch_order(len(t.train_seqs), cfg.seed, epoch)
    step_loss, supervised = 0.0, 0
    for micro in range(cfg.grad_accum):
        rows = micro_batch_rows(order, in_epoch, micro, cfg, rank, world)
        rng = random.Random(f"insert-{cfg.seed}-{epoch}-{in_epoch}-{micro}-{rank}")  # redrawn every epoch
        batch = [t.train_seqs[r] for r in rows]
        prefetch(batch)  # train.online on a GPU: one base forward for the micro-batch
        loss, positions = t.run.loss(t.engine, batch, rng, t.progress.step)
        t.engine.backward(loss)
        t.engine.step()
        step_loss += loss.item() / cfg.grad_accum
        supervised += positions
    t.progress.step += 1
    if t.progress.step % RELEASE_MEMORY_EVERY == 0:
        release_freed_memory()
    return step_loss, supervised


class _Window:
    """Supervised positions per second since the last log line, and the ETA from this attempt's own steps (a resumed
    run's earlier steps took another attempt's time)."""

    def __init__(self, first_step: int):
        self.positions, self.start = 0, time.time()
        self.session_start, self.session_first_step = time.time(), first_step

    def add(self, positions: int) -> None:
        self.positions += positions

    def rate_and_eta(self, step: int, total: int) -> tuple[float, float]:
        rate = self.positions / max(time.time() - self.start, 1e-9)
        eta = (total - step) * (time.time() - self.session_start) / (step - self.session_first_step)
        self.positions, self.start = 0, time.time()
        return rate, eta


def _record_step(t: Training, step_loss: float, supervised: int, epoch: int, window: _Window) -> None:
    """The step's loss (averaged across ranks) into the history; rank 0 moves the driver's bar every step and logs
    the train.* metrics every log_every steps."""
    p, world = t.progress, t.ranks.world
    step_loss = _mean_across_ranks(step_loss, world)
    p.trained += supervised * world
    p.history.append([p.step, step_loss])
    if t.ranks.rank != 0:
        return
    write_json_atomic(t.out / PROGRESS_FILE, {"step": p.step, "total": t.total_steps, "loss": step_loss})
    if p.step % t.cfg.log_every == 0 or p.step == t.total_steps:
        rate, eta = window.rate_and_eta(p.step, t.total_steps)
        t.tracker.log_metrics({"train.loss": step_loss, **t.run.lr_metrics(t.engine.get_lr()),
                               "train.positions_per_second": rate, "train.epoch": epoch,
                               "train.positions_trained": p.trained, "train.eta_s": eta}, step=p.step)
        log.info("step %d/%d loss %.4f  %.0f supervised positions/s  ETA %.0f s", p.step, t.total_steps, step_loss,
                 rate, eta)


def _evaluate_and_checkpoint(t: Training) -> None:
    """Held-out figures every eval_every steps and at every checkpoint (the kept checkpoint is the one with the best
    held-out top-1 accuracy); a checkpoint every checkpoint_every steps and at the last."""
    from .checkpoint import keep_as_best, prune, save_checkpoint

    p, rank, step = t.progress, t.ranks.rank, t.progress.step
    evaluated = None
    checkpointing = step % t.cfg.checkpoint_every == 0 or step == t.total_steps
    if t.holdout and (step % t.cfg.eval_every == 0 or checkpointing):
        if rank == 0:
            evaluated = t.run.evaluate(t.engine, t.holdout, step)
            p.evals.append({"step": step, **evaluated})
            t.tracker.log_metrics({f"eval.{key}": v for key, v in evaluated.items()}, step=step)
        t.ranks.barrier()
    if not checkpointing:
        return
    improved = rank == 0 and evaluated is not None and evaluated["acc_top1_mean"] > p.best["acc_top1_mean"]
    if improved:
        p.best = {"acc_top1_mean": evaluated["acc_top1_mean"], "step": step}
    directory = save_checkpoint(t.checkpoints, step, t.engine, rank, p.meta(), t.ranks.barrier)
    if rank == 0:
        if improved or p.best["step"] is None:
            keep_as_best(directory, t.out / "best")
        prune(t.checkpoints)


def _export(t: Training, init, positions_per_second: float) -> None:
    """Rank 0 writes the component from the best checkpoint, with the run's figures; every rank waits for it."""
    from .export import export_component

    peak = _peak_rss_mb(t.ranks.world)
    if t.ranks.rank == 0:
        p = t.progress
        started_from = None if init is None else {key: init.run.get(key) for key in ("mlflow_run_id", "step")}
        if init is not None and p.evals and p.evals[0]["step"] == 0 and p.evals[0]["acc_top1_mean"] >= p.best[
                "acc_top1_mean"]:
            log.warning("no checkpoint of this run beat the component it started from (held-out top-1 %.4f at step 0, "
                        "best %.4f): the exported one is the best checkpoint; keep using %s",
                        p.evals[0]["acc_top1_mean"], p.best["acc_top1_mean"], t.cfg.init_from)
        export_component(t.out, t.base, t.cfg, t.run, t.config, p.history, p.evals, p.best, started_from,
                         extra={"peak_worker_rss_mb": peak, "trained_positions": p.trained,
                                "positions_per_second": positions_per_second})
    t.ranks.barrier()


def _online_sequences(online: dict, base_cfg, cfg):
    """(base, OnlineTeacher, training sequences, held-out sequences) of the data stage's rows: targets and features
    computed by the base, in the dtype the teacher stage would have used, when a batch first reads them."""
    from ppdkit.models.loading import load_base_model
    from ppdkit.runtime.forward.precision import resolve_dtype

    from .online_teacher import ONLINE_KEEP_BYTES, OnlineTeacher

    dtype = resolve_dtype(online["compute_dtype"])  # on the worker: its own CPU decides what auto means
    base = load_base_model(base_cfg.name, base_cfg.quantization, dtype, for_training=True)
    teacher = OnlineTeacher(base.model, online["top_k"], ONLINE_KEEP_BYTES)
    train = teacher.split(online["data_dir"], "train")
    holdout = teacher.split(online["data_dir"], "holdout")[: cfg.eval_sequences]
    log.info("train.online: targets (top-%d), and the states a draft over them reads, from %s (%s, on %s) in the "
             "training step", online["top_k"], base_cfg.name, dtype, teacher.engine)
    return base, teacher, train, holdout


def _peak_rss_mb(world: int) -> float:
    """The largest peak resident memory of any rank, in MB (ru_maxrss is in KB on Linux)."""
    import resource

    mine = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if world == 1:
        return mine
    import torch.distributed as dist

    t = torch.tensor([mine], dtype=torch.float64, device=_collective_device(dist))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()
