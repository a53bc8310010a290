"""The training methods, in one registry: `train.method` names one. A method says what it trains (a module
whose forward() hands out every trainable tensor), how its parameter groups move over the steps, what its
component carries, and which decoding methods (runtime/methods.py) use that component: the evaluate stage
benchmarks those, and the register stage tags the version with their figures.

ept       PPD's prompt tokens with ensemble prompt tokens (papers/000 ch. 4).
ept-head  the same plus PPD's custom decoding head for the prompt tokens' hidden states (papers/000 4.4.2,
          models/heads.py). 1-stage: both from step 0 (train.head_start_step=0). 2-stage: the prompt tokens
          alone until head_start_step, then both at lr * head_lr_scale.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the spec reads this registry: importing it needs no torch
    import torch

    from ppdkit.models.drafts import PromptDrafts


def cosine(step: int, total: int) -> float:
    """The lr factor of a cosine decay without warm-up (section 6.1.2), as CosineAnnealingLR gives it."""
    return 0.5 * (1.0 + math.cos(math.pi * min(step, total) / total))


@dataclass(frozen=True)
class TrainingMethod:
    name: str
    summary: str
    trains_head: bool
    decoding_methods: tuple[str, ...]  # runtime/methods.py names that use this method's component

    def build(self, cfg, init: "torch.Tensor") -> "PromptDrafts":
        """The trainable module, from the prompt tokens' initial embeddings init [k, n, H]."""
        from ppdkit.models.drafts import PromptDrafts
        from ppdkit.models.heads import ResidualHead
        from ppdkit.models.prompt_tokens import PromptTokens

        prompt = PromptTokens(cfg.num_prompt_tokens, cfg.num_epts, init.shape[-1], cfg.aggregation, init=init)
        return PromptDrafts(prompt, ResidualHead(init.shape[-1]) if self.trains_head else None)

    def param_groups(self, module: "PromptDrafts", cfg, total_steps: int) -> tuple[list[dict], list[Callable]]:
        """AdamW parameter groups and, per group, the lr factor of a step (for LambdaLR)."""
        groups = [{"params": list(module.prompt.parameters())}]
        factors: list[Callable[[int], float]] = [lambda s: cosine(s, total_steps)]
        if module.head is not None:
            start, scale = cfg.head_start_step, cfg.head_lr_scale
            groups.append({"params": list(module.head.parameters())})
            factors = [lambda s: cosine(s, total_steps) * (scale if start and s >= start else 1.0),
                       lambda s: cosine(s, total_steps) * scale if s >= start else 0.0]
        return groups, factors

    def head_active(self, cfg, step: int) -> bool:
        """Whether the head takes part in step `step` (0-based); before, it is left out, so it gets no gradient."""
        return self.trains_head and step >= cfg.head_start_step

    def export_tensors(self, state: dict[str, "torch.Tensor"]) -> dict[str, "torch.Tensor"]:
        """The component's weights from the module's state dict."""
        tensors = {"prompt_embeddings": state["prompt.embeddings"]}  # [k, n, H]
        if "prompt.ept_weights" in state:
            tensors["ept_weights"] = state["prompt.ept_weights"]  # [k, n]
        if self.trains_head:
            tensors["head_weight"], tensors["head_bias"] = state["head.weight"], state["head.bias"]  # [H, H], [H]
        return tensors


TRAINING_METHODS: dict[str, TrainingMethod] = {m.name: m for m in (
    TrainingMethod("ept", "PPD's prompt tokens (papers/000 ch. 4)", False, ("ppd", "ppd-lookup")),
    TrainingMethod("ept-head", "prompt tokens and a custom decoding head (papers/000 4.4.2)", True,
                   ("ppd", "ppd-head", "ppd-lookup")),
)}
