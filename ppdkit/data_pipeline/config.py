from typing import Literal

from pydantic import Field, model_validator

from ppdkit.models.config import Section

PROMPT_TEMPERATURE = 0.8  # teacher.prompt_temperature's default (data.source magpie)


class DataConfig(Section):
    execution_only = frozenset({"shards"})

    source: str = Field("sharegpt", min_length=1,
                        description="sharegpt | mt-bench | humaneval | chitchat | magpie (prompts the base model "
                                    "writes itself, teacher.regenerate answers them) | magpie-KIND (the same, steered "
                                    "to one kind: writing, roleplay, reasoning, math, coding, extraction, stem, "
                                    "humanities) | a corpus folder (corpus.json: ppdkit corpus grow) | path to "
                                    ".json/.jsonl(.gz)")
    limit: int | None = Field(512, ge=1, description="usable conversations to read (null: all; magpie: how many "
                                                     "the model writes)")
    max_length: int = Field(512, ge=8, description="tokens kept per conversation; at most the base model's context")
    holdout: float = Field(0.1, ge=0.0, lt=1.0, description="fraction of conversations held out for evaluation (of a "
                           "corpus: chosen by id, so a row held out once stays held out as the corpus grows)")
    seed: int = Field(0, description="seed of the choice of held-out conversations")
    shards: int = Field(2, ge=1, description="Ray tasks that template and tokenize in parallel")
    check_sequences: int = Field(8, ge=0, description="held-out sequences the base model scores as a data check")

    @model_validator(mode="after")
    def _endless_source_has_a_limit(self) -> "DataConfig":
        from .readers import ENDLESS_SOURCES  # here: readers' import chain is not needed to read a config

        if self.source in ENDLESS_SOURCES and self.limit is None:
            raise ValueError(f"data.source {self.source} has no end (the base model writes its prompts): set "
                             "data.limit to the number of conversations to write")
        return self

    def check_context(self, max_positions: int) -> None:
        """Raise before any work when sequences of max_length would not fit the base model's context (its
        max_position_embeddings, known once its config is read): positions past it were never trained."""
        if self.max_length > max_positions:
            raise ValueError(f"data.max_length={self.max_length} is longer than the base model's context of "
                             f"{max_positions} positions: set data.max_length between 8 and {max_positions}")


class TeacherConfig(Section):
    execution_only = frozenset({"workers", "cpus_per_worker"})

    workers: int = Field(2, ge=1, description="Ray actors, each holding the frozen base model")
    cpus_per_worker: int = Field(1, ge=1, description="CPUs (and torch threads) per actor")
    top_k: int = Field(64, ge=1, description="log-probabilities kept per position, plus the mass outside them; at most "
                                             "the base model's vocabulary size, checked when it loads")
    dtype: Literal["float16", "bfloat16", "float32"] = Field("float16", description="storage of the top-k log-probabilities")
    compute_dtype: Literal["auto", "float32", "bfloat16", "gguf", "q4"] = Field(
        "auto", description="dtype of the teacher's forward and of regeneration (auto: bfloat16 on this CPU's native "
                            "kernels or a GPU, else float32); with base_model.quantization none both run "
                            "on the decoder's runtime where its native kernels do, the model `--dtype` of that name "
                            "verifies with; gguf or q4: on the base model's 4-bit blocks, the model `--dtype gguf` "
                            "verifies with (needs base_model.quantization none and AVX512-VNNI)")
    features: bool = Field(False, description="also keep the final hidden states at every token (float16, 2 H bytes a "
                                              "token), which draft heads train on instead of running the base again")
    rows_per_shard: int = Field(32, ge=1, description="sequences per shard file (the unit of resume and retry)")
    batch_size: int = Field(4, ge=1, description="sequences per teacher forward through transformers (the runtime "
                                                 "reads one at a time)")
    regenerate: bool = Field(False, description="self-distillation: the base model rewrites the assistant turns first")
    # at most runtime/forward/linear.py's SKINNY_MAX_ROWS, the native kernels' rows (tests/test_batch.py checks it)
    generate_batch: int = Field(64, ge=1, le=96, description="sequences decoded together in each regeneration step "
                                "(continuous batching: a finished one's slot takes the next at once)")
    max_new_tokens: int = Field(256, ge=1, description="tokens per regenerated assistant turn")
    temperature: float = Field(0.0, ge=0.0, description="0: greedy regeneration; > 0: sampled")
    prompt_temperature: float = Field(
        PROMPT_TEMPERATURE, gt=0.0,
        description="the temperature the model writes user turns marked write at (data.source magpie): "
                    "1.0 is Magpie's, lower keeps a small model's prompts coherent at some loss of variety")
    seed: int = Field(0, description="seed of sampled regeneration, mixed with each shard's id; on the runtime each "
                                     "answer draws with a generator of its own, seeded by it, its conversation and its "
                                     "turn (another seed: other answers to the same prompts)")

    def check_vocabulary(self, vocab_size: int) -> None:
        """Raise before any teacher work when top_k exceeds the base model's vocabulary (known only once the
        model loads); otherwise torch.topk would fail inside a Ray actor, shard after shard."""
        if self.top_k > vocab_size:
            raise ValueError(f"teacher.top_k={self.top_k} is more than the base model's vocabulary of {vocab_size} "
                             f"tokens: set teacher.top_k between 1 and {vocab_size} (the recipes keep 64)")
