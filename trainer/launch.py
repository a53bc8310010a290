"""Training on a Ray cluster: a Ray Train TorchTrainer whose workers each run one DeepSpeed rank."""

import json
import logging
from pathlib import Path

import torch

from ppdkit.models.config import BaseModelConfig

from .config import TrainConfig
from .worker import train_loop_per_worker

log = logging.getLogger(__name__)


def run_training(base: BaseModelConfig, cfg: TrainConfig, teacher_dir: Path, out_dir: Path, tracker_ref,
                 fault: dict | None = None) -> dict:
    """Train (resuming from OUT/checkpoints if present); returns OUT/result.json.

    `fault` is for tests: {"at_step": N, "marker": path} makes rank 0 die once at step N.
    """
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    out_dir.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.is_available()
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"train": cfg.model_dump(), "base_model": base.model_dump(), "teacher_dir": str(teacher_dir),
                           "output": str(out_dir), "tracker": tracker_ref, "fault": fault},
        torch_config=TorchConfig(backend="nccl" if gpu else "gloo"),
        scaling_config=ScalingConfig(num_workers=cfg.num_workers, use_gpu=gpu,
                                     resources_per_worker={"CPU": cfg.cpus_per_worker}),
        run_config=RunConfig(name="train", storage_path=str((out_dir / "ray").resolve()),
                             failure_config=FailureConfig(max_failures=cfg.max_failures)),
    )
    trainer.fit()
    return json.loads((out_dir / "result.json").read_text())
