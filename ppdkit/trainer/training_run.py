"""What the training worker (trainer/worker.py) drives for every method that trains weights: a TrainingRun.

A method's run is built from the job's train section, the frozen base model and the training sequences
(TrainingMethod.start, trainer/training_methods.py); the worker hands `module` to DeepSpeed with `param_groups`, steps on
`loss`, scores the held-out sequences with `evaluate`, logs `lr_metrics`, and writes the component from
`export_tensors` and `hyperparameters`. Most methods train one group of parameters on the cosine schedule
(the defaults below); PPD's prompt tokens with a head train two.
"""

import random
from abc import ABC, abstractmethod
from collections.abc import Callable

import torch

from .training_methods import cosine


class TrainingRun(ABC):
    module: torch.nn.Module  # what DeepSpeed trains
    distances: int  # token distances the held-out evaluation scores

    def __init__(self, method, cfg, base):
        self.method, self.cfg, self.base = method, cfg, base

    def param_groups(self, total_steps: int) -> tuple[list[dict], list[Callable[[int], float]]]:
        """AdamW parameter groups and, per group, the lr factor of a step (for LambdaLR): one group, cosine."""
        return [{"params": list(self.module.parameters())}], [lambda s: cosine(s, total_steps)]

    def lr_metrics(self, lrs: list[float]) -> dict[str, float]:
        """The logged learning rates of a step, one per group."""
        return {"train.lr": lrs[0]}

    @abstractmethod
    def loss(self, engine, sequences, rng: random.Random, step: int) -> tuple[torch.Tensor, int]:
        """A batch's loss and the positions it scored."""

    @abstractmethod
    def evaluate(self, engine, holdout, step: int) -> dict[str, float]:
        """Held-out metrics (eval.* keys)."""

    @abstractmethod
    def export_tensors(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The component's tensors from the module's state dict."""

    @abstractmethod
    def hyperparameters(self) -> dict:
        """What the component records of how it was trained (and what a decoder needs to load it)."""
