"""Training PPD's prompt tokens (ept) and their custom decoding head (ept-head): what trainer/worker.py runs
for those methods (trainer/training_methods.py)."""

import random
from collections.abc import Callable

import torch

from ppdkit.models.prompt_draft import PromptDrafts
from ppdkit.models.decoding_head import ResidualHead
from ppdkit.models.prompt_tokens import PromptTokens, init_from_token_embeddings

from .prompt_batch import collate
from .evaluate import evaluate
from .losses import prompt_token_loss
from .training_methods import cosine
from .student import student_logprobs
from .training_run import TrainingRun

HYPERPARAMETERS = ("num_prompt_tokens", "num_epts", "mask", "aggregation", "loss", "alpha", "groups_per_sequence",
                   "lr", "epochs", "seed")


class PromptRun(TrainingRun):
    def __init__(self, method, cfg, base, train_sequences, init=None):
        super().__init__(method, cfg, base)
        self.distances = cfg.num_prompt_tokens  # token distances evaluated
        init = init_from_token_embeddings(base.model.get_input_embeddings(), cfg.num_prompt_tokens, cfg.num_epts,
                                          cfg.init_token_ids, cfg.seed)  # [k, n, H]
        prompt = PromptTokens(cfg.num_prompt_tokens, cfg.num_epts, init.shape[-1], cfg.aggregation, init=init)
        self.module = PromptDrafts(prompt, ResidualHead(init.shape[-1]) if method.trains_head else None)

    def param_groups(self, total_steps: int) -> tuple[list[dict], list[Callable[[int], float]]]:
        """AdamW parameter groups and, per group, the lr factor of a step (for LambdaLR)."""
        groups = [{"params": list(self.module.prompt.parameters())}]
        factors: list[Callable[[int], float]] = [lambda s: cosine(s, total_steps)]
        if self.module.head is not None:
            start, scale = self.cfg.head_start_step, self.cfg.head_lr_scale
            groups.append({"params": list(self.module.head.parameters())})
            factors = [lambda s: cosine(s, total_steps) * (scale if start and s >= start else 1.0),
                       lambda s: cosine(s, total_steps) * scale if s >= start else 0.0]
        return groups, factors

    def head_active(self, step: int) -> bool:
        """Whether the head takes part in step `step` (0-based); before, it is left out, so it gets no gradient."""
        return self.method.trains_head and step >= self.cfg.head_start_step

    def loss(self, engine, sequences, rng: random.Random, step: int) -> tuple[torch.Tensor, int]:
        """(the loss of one micro-batch, its supervised positions), insertion points drawn from `rng`."""
        cfg = self.cfg
        batch = collate(sequences, cfg.num_prompt_tokens, cfg.num_epts, cfg.groups_per_sequence, cfg.mask,
                        rng).to(self.base.model.device)
        emb, weights, head = engine(self.head_active(step))
        logp = student_logprobs(self.base.model, emb, weights, cfg.num_prompt_tokens, cfg.num_epts, batch, head)
        return prompt_token_loss(logp, batch, cfg.loss, cfg.alpha), batch.supervised

    def evaluate(self, engine, holdout, step: int) -> dict[str, float]:
        cfg = self.cfg
        emb, weights, head = engine(self.head_active(step))
        return evaluate(self.base.model, emb.detach(), None if weights is None else weights.detach(),
                        cfg.num_prompt_tokens, cfg.num_epts, cfg.mask, holdout, cfg.groups_per_sequence,
                        cfg.micro_batch, head=None if head is None else tuple(t.detach() for t in head))

    def lr_metrics(self, lrs: list[float]) -> dict[str, float]:
        return {"train.lr": lrs[0], **({"train.head_lr": lrs[1]} if self.method.trains_head else {})}

    def export_tensors(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The component's weights from the module's state dict."""
        tensors = {"prompt_embeddings": state["prompt.embeddings"]}  # [k, n, H]
        if "prompt.ept_weights" in state:
            tensors["ept_weights"] = state["prompt.ept_weights"]  # [k, n]
        if self.method.trains_head:
            tensors["head_weight"], tensors["head_bias"] = state["head.weight"], state["head.bias"]  # [H, H], [H]
        return tensors

    def hyperparameters(self) -> dict:
        hyper = {key: getattr(self.cfg, key) for key in HYPERPARAMETERS}
        if self.method.trains_head:
            hyper.update(head_start_step=self.cfg.head_start_step, head_lr_scale=self.cfg.head_lr_scale)
        return hyper
