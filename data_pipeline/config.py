from typing import Literal

from pydantic import Field

from ppdkit.models.config import Section


class DataConfig(Section):
    execution_only = frozenset({"shards"})

    source: str = Field("sharegpt", description="sharegpt | mt-bench | humaneval | chitchat | path to .json/.jsonl(.gz)")
    limit: int | None = Field(512, ge=1, description="usable conversations to read (null: all)")
    max_length: int = Field(512, ge=8, description="tokens kept per conversation")
    holdout: float = Field(0.1, ge=0.0, lt=1.0, description="fraction of conversations held out for evaluation")
    seed: int = 0
    shards: int = Field(2, ge=1, description="Ray tasks that template and tokenize in parallel")
    check_sequences: int = Field(8, ge=0, description="held-out sequences the base model scores as a data check")


class TeacherConfig(Section):
    execution_only = frozenset({"workers", "cpus_per_worker"})

    workers: int = Field(2, ge=1, description="Ray actors, each holding the frozen base model")
    cpus_per_worker: int = Field(1, ge=1, description="CPUs (and torch threads) per actor")
    top_k: int = Field(64, ge=1, description="log-probabilities kept per position (plus the mass outside them)")
    dtype: Literal["float16", "bfloat16", "float32"] = Field("float16", description="storage of the top-k log-probabilities")
    rows_per_shard: int = Field(32, ge=1, description="sequences per shard file (the unit of resume and retry)")
    batch_size: int = Field(4, ge=1, description="sequences per teacher forward")
    regenerate: bool = Field(False, description="self-distillation: the base model rewrites the assistant turns first")
    generate_batch: int = Field(32, ge=1, description="conversations regenerated together (batched decoding is ~8x "
                                "faster per token than batches of 4 on CPU)")
    max_new_tokens: int = Field(256, ge=1, description="tokens per regenerated assistant turn")
    temperature: float = Field(0.0, ge=0.0, description="0: greedy regeneration; > 0: sampled")
    seed: int = 0
