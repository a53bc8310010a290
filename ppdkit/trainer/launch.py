"""Training on a Ray cluster: a Ray Train TorchTrainer whose workers each run one DeepSpeed rank."""

import json
import logging
import threading
from contextlib import contextmanager
from pathlib import Path

from ppdkit.data_pipeline.ray_placement import Placement, describe, training_strategy
from ppdkit.models.config import BaseModelConfig
from ppdkit.models.device_plan import DevicePlan, current_device_plan

from .config import WeightTrainingConfig
from .local_rank import train_in_this_process
from .worker import PLACEMENT_FILE, PROGRESS_FILE, train_loop_per_worker

log = logging.getLogger(__name__)


def run_training(base: BaseModelConfig, cfg: WeightTrainingConfig, teacher_dir: Path, out_dir: Path, tracker_ref,
                 online: dict | None = None, placement: Placement = "spread") -> dict:
    """Train (resuming from OUT/checkpoints if present); returns OUT/result.json. `online` (train.online): the data
    stage's directory, the teacher's compute_dtype and top_k, in place of the teacher cache in `teacher_dir`.
    `placement` (ray.placement): the ranks on different nodes where there is room, or packed on one.

    train.num_workers 0 is Ray Train's local mode: the one rank runs in this process (trainer/local_rank.py).
    OUT must be storage every node sees: Ray Train's storage_path (OUT/ray) and the checkpoints each rank writes
    (OUT/checkpoints) are there. A rank that dies, alone or with its node, fails the group; Ray Train starts it
    again (train.max_failures times) where there is room, and every rank resumes from the last checkpoint."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    out_dir.mkdir(parents=True, exist_ok=True)
    devices = trainer_devices(current_device_plan(), cfg.cpus_per_worker)
    trainer = TorchTrainer(
        train_loop_per_worker if cfg.num_workers else train_in_this_process,  # 0: Ray Train's local mode
        train_loop_config={"train": cfg.model_dump(), "base_model": base.model_dump(), "teacher_dir": str(teacher_dir),
                           "output": str(out_dir), "tracker": tracker_ref, "online": online},
        torch_config=TorchConfig(**devices["torch_config"]),
        scaling_config=ScalingConfig(num_workers=cfg.num_workers, **devices["scaling_config"],
                                     placement_strategy=training_strategy(placement)),
        run_config=RunConfig(name="train", storage_path=str((out_dir / "ray").resolve()),
                             failure_config=FailureConfig(max_failures=cfg.max_failures)),
    )
    (out_dir / PROGRESS_FILE).unlink(missing_ok=True)
    earlier = len(_attempts(out_dir))
    with _progress_bar(out_dir / PROGRESS_FILE):
        trainer.fit()
    for attempt in _attempts(out_dir)[earlier:]:
        ranks = ", ".join(f"rank {r} on {describe(node)}" for r, node in enumerate(attempt["ranks"]))
        reduce = attempt["allreduce"]  # None with one rank
        cost = f" (an all-reduce of the {reduce['bytes']} gradient bytes: {reduce['median_ms']} ms)" if reduce else ""
        log.info("training from step %d: %s%s", attempt["from_step"], ranks, cost)
    return json.loads((out_dir / "result.json").read_text())


def trainer_devices(plan: DevicePlan, cpus_per_worker: int) -> dict[str, dict]:
    """The device settings of the TorchTrainer, from the driver's plan: TorchConfig's and ScalingConfig's kwargs."""
    return {"torch_config": {"backend": plan.distributed_backend},
            "scaling_config": {"use_gpu": plan.ray_use_gpu,
                               "resources_per_worker": plan.worker_resources(cpus_per_worker)}}


def _attempts(out_dir: Path) -> list[dict]:
    path = out_dir / PLACEMENT_FILE
    return json.loads(path.read_text()) if path.is_file() else []


@contextmanager
def _progress_bar(progress: Path, every: float = 0.5):
    """A bar of the training steps in this (driver) process, from the step rank 0 writes to `progress`."""
    from tqdm import tqdm

    done = threading.Event()

    def follow() -> None:
        bar, finished = None, False
        while not finished:
            finished = done.wait(every)  # one last read once training ended
            try:
                state = json.loads(progress.read_text())
            except (OSError, ValueError):  # not written yet
                continue
            if bar is None:
                # from the first step seen (a resumed run's, or the first logged): its rate counts from there
                bar = tqdm(total=state["total"], initial=state["step"], desc="training", unit="step",
                           dynamic_ncols=True, postfix={"loss": f"{state['loss']:.4f}"})
            if state["step"] != bar.n:  # redrawn on a new step only: a log file gets one line per step, not per poll
                bar.set_postfix(loss=f"{state['loss']:.4f}", refresh=False)
                bar.update(state["step"] - bar.n)
        if bar is not None:
            bar.close()

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
