from typing import Literal

from pydantic import Field

from ppdkit.models.config import Section


class TrainConfig(Section):
    execution_only = frozenset({"num_workers", "cpus_per_worker", "log_every"})

    method: str = Field("ept", description="the component to train (see trainer.methods.METHODS)")
    # the prompt tokens (papers/000 ch. 4)
    num_prompt_tokens: int = Field(3, ge=1, le=16, description="k: token distances guessed per forward")
    num_epts: int = Field(1, ge=1, le=256, description="n: ensemble prompt tokens per prompt token")
    mask: Literal["ensemble", "decoder", "encoder"] = "ensemble"
    aggregation: Literal["mean", "learned"] = "mean"
    init_token_ids: list[int] | None = Field(None, description="k*n token ids to copy embeddings from (default: seeded draw)")
    # the objective
    loss: Literal["kd", "ce"] = Field("kd", description="kd: decayed KL to the teacher; ce: hard labels (ablation)")
    alpha: float = Field(0.8, gt=0.0, le=1.0, description="decay per token distance")
    groups_per_sequence: int = Field(16, ge=1, description="insertion points supervised per sequence per forward")
    # the optimisation (AdamW, cosine, no warm-up: section 6.1.2)
    lr: float = Field(0.01, gt=0.0)
    weight_decay: float = 0.0
    epochs: int = Field(1, ge=1)
    max_steps: int | None = Field(None, ge=1, description="stop after this many optimizer steps")
    micro_batch: int = Field(4, ge=1, description="sequences per worker per micro-step")
    grad_accum: int = Field(1, ge=1)
    zero_stage: int = Field(0, ge=0, le=2, description="DeepSpeed ZeRO stage")
    precision: Literal["fp32", "bf16"] = "fp32"
    # the cluster
    num_workers: int = Field(2, ge=1, description="Ray Train workers (one DeepSpeed rank each)")
    cpus_per_worker: int = Field(1, ge=1)
    max_failures: int = Field(1, ge=0, description="worker-group restarts Ray Train attempts, resuming from a checkpoint")
    # bookkeeping
    log_every: int = Field(5, ge=1)
    eval_every: int = Field(25, ge=1)
    eval_sequences: int = Field(64, ge=1, description="held-out sequences scored at each evaluation")
    checkpoint_every: int = Field(25, ge=1)
    seed: int = 0


class CalibrateConfig(Section):
    execution_only = frozenset({"micro_batch"})

    sizes: list[int] = Field([8, 12, 16, 24, 32, 48, 64], description="tree sizes (input tokens per step) to build")
    max_rank: int = Field(10, ge=1, le=64, description="guesses per distance considered")
    sequences: int = Field(64, ge=1, description="held-out sequences measured")
    groups_per_sequence: int = Field(16, ge=1)
    micro_batch: int = Field(4, ge=1)
    # the corpus n-gram table (data_pipeline/ngram_cache.py) the component carries for ppd-lookup
    ngram_branches: int = Field(3, ge=0, le=16, description="continuations kept per n-gram; 0: no table")
    ngram_max_n: int = Field(3, ge=1, le=8, description="longest n-gram counted")
    ngram_min_count: int = Field(2, ge=1, description="n-grams seen fewer times are dropped")
