from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from ppdkit.models.config import Section

from .training_methods import TRAINING_METHODS

# A step of this many input tokens already costs far more on a CPU than the at most
# num_prompt_tokens + 1 <= 17 tokens it can accept, and building it takes ~1 s (O(size^2)):
# larger trees only burn calibration time.
MAX_TREE_SIZE = 1024


ONLINE_HEADS = ("eagle3", "feature", "medusa")  # head kinds train.online trains: the base's states and targets only


class TrainConfig(Section):
    execution_only = frozenset({"num_workers", "cpus_per_worker", "log_every"})

    method: Literal[tuple(TRAINING_METHODS)] = Field(
        "ept", description="; ".join(f"{m.name}: {m.summary}" for m in TRAINING_METHODS.values()))
    # the prompt tokens (PPD thesis ch. 4)
    num_prompt_tokens: int = Field(3, ge=1, le=16, description="k: token distances guessed per forward")
    num_epts: int = Field(1, ge=1, le=256, description="n: ensemble prompt tokens per prompt token")
    mask: Literal["ensemble", "decoder", "encoder"] = Field(
        "ensemble", description="attention among the EPTs (PPD thesis 4.4.3). ensemble: an EPT sees the EPTs of its "
                                "own index at its distance and before; decoder: every EPT before it; encoder: every "
                                "EPT of its prompt token and the earlier ones")
    aggregation: Literal["mean", "learned"] = Field(
        "mean", description="how a prompt token's n EPTs make one guess: the mean of their logits, or learned "
                            "weights (PPD thesis 4.4.4)")
    init_token_ids: list[Annotated[int, Field(ge=0)]] | None = Field(
        None, description="k*n token ids to copy embeddings from (default: seeded draw)")
    # the custom decoding head (method ept-head)
    head_start_step: int = Field(0, ge=0, description="ept-head: the step the head joins at (0: 1-stage; later: "
                                                      "2-stage, the prompt tokens alone before it)")
    head_lr_scale: float = Field(1.0, gt=0.0, le=1.0, description="ept-head: lr factor of both parts once the head "
                                                                  "trains in 2-stage, of the head in 1-stage")
    # draft heads over the base model's features (methods feature-head and medusa)
    head_depth: int = Field(4, ge=1, le=16, description="feature-head, medusa: token distances guessed per step; "
                                                        "eagle3: the training-time test's steps")
    draft_vocab: int = Field(4096, ge=16, description="feature-head, medusa, eagle3: the most frequent training "
                                                      "tokens the drafts guess among")
    head_inner: int = Field(1024, ge=1, description="feature-head: width of the head's MLP")
    features_on_disk: bool = Field(False, description="feature-head, medusa, eagle3: write the frozen base's hidden "
                                   "states of each training sequence to a file beside the teacher cache the first "
                                   "time it is computed, and read them there at every later visit, by any worker or "
                                   "later run on that cache (2 x hidden x layers bytes a position: 3,456 for "
                                   "SmolLM2's EAGLE-3, about 17 GB for the large set). Computing them is about half "
                                   "of an EAGLE-3 step on 2 CPU cores, and an EAGLE-3 worker keeps only 2 GB of "
                                   "them in memory")
    online: bool = Field(False, description="eagle3, feature-head, medusa: no teacher cache: the frozen base computes each sequence's "
                         "targets (its own LM head's top teacher.top_k on its final state, in teacher.compute_dtype) "
                         "and the hidden states the draft reads in the training step, one forward a sequence, kept "
                         "in memory up to 2 GB a worker (SpecForge's online mode); the teacher stage is skipped")
    feature_weight: float = Field(1.0, ge=0.0, description="feature-head: weight of the feature regression loss")
    early_layer: int = Field(4, ge=1, description="early-head: the decoder layers before the head (ProPD's n)")
    # the skip-map search (method layer-skip, D&V paper 3.3)
    search_trials: int = Field(40, ge=1, description="layer-skip: skip maps timed (Optuna's TPE on Ray Tune)")
    search_prompts: int = Field(8, ge=1, description="layer-skip: development prompts, the data stage's held-out "
                                                    "first user turns")
    search_new_tokens: int = Field(32, ge=1, description="layer-skip: tokens decoded per prompt in a trial")
    # the aggressive-skip fine-tune (method skip-finetune, D&V paper appendix F)
    skip_from: str | None = Field(None, description="skip-finetune: the layer-skip component whose sub-layer ranking "
                                                    "it starts from (a directory or models:/NAME@ALIAS)")
    skip_ratio: float = Field(0.5, gt=0.0, lt=1.0, description="skip-finetune: the share of all sub-layers skipped, "
                                                                "from the top of the ranking")
    # where the weights start
    init_from: str | None = Field(None, description="start from this trained component's weights (its directory or "
                                  "models:/NAME@ALIAS; the same method, base model and shapes) and draft vocabulary, "
                                  "not a fresh draw: more epochs, or new data; the lr schedule starts anew. A larger "
                                  "draft_vocab grows the component's by this run's most frequent other tokens")
    # the objective
    loss: Literal["kd", "ce"] = Field("kd", description="kd: decayed KL to the teacher; ce: hard labels (ablation)")
    alpha: float = Field(0.8, gt=0.0, le=1.0, description="decay per token distance")
    groups_per_sequence: int = Field(16, ge=1, description="insertion points supervised per sequence per forward")
    # the optimisation (AdamW, cosine, no warm-up: section 6.1.2)
    # AdamW moves every weight by about lr per step whatever the gradient's scale, and prompt tokens
    # start as copies of token embeddings whose elements are far below 1: an lr above 1 throws every
    # element past its whole range in one step, so it is a typo (the paper's is 0.01), not a setting.
    lr: float = Field(0.01, gt=0.0, le=1.0, description="AdamW learning rate")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW decoupled weight decay; negative would grow the weights")
    epochs: int = Field(1, ge=1, description="passes over the training sequences, insertion points redrawn each; "
                                             "max_steps stops sooner")
    max_steps: int | None = Field(None, ge=1, description="stop after this many optimizer steps")
    train_positions: int | None = Field(None, ge=1, description="train on a seeded random subset of the cache's "
                                        "sequences holding about this many supervised positions, nested for "
                                        "growing values (data-scaling studies); null: all")
    micro_batch: int = Field(4, ge=1, description="sequences per worker per micro-step")
    grad_accum: int = Field(1, ge=1, description="micro-steps per optimizer step (DeepSpeed gradient accumulation)")
    zero_stage: int = Field(0, ge=0, le=2, description="DeepSpeed ZeRO stage")
    precision: Literal["fp32", "bf16", "bf16-autocast", "auto"] = Field(
        "fp32", description="DeepSpeed training precision (bf16: its bf16 mode); bf16-autocast (eagle3): weights and "
                            "optimizer in float32, the draft's training forward and backward in bfloat16 under "
                            "torch.autocast (2.8x faster per step on an AMD EPYC with AVX512-BF16, 1.5x slower on an "
                            "Intel Xeon without AMX); auto (eagle3): bf16-autocast or fp32, whichever each worker "
                            "times faster at its start")
    # the cluster
    num_workers: int = Field(2, ge=1, description="Ray Train workers (one DeepSpeed rank each)")
    cpus_per_worker: int = Field(1, ge=1, description="CPUs (and torch threads) per Ray Train worker")
    max_failures: int = Field(1, ge=0, description="worker-group restarts Ray Train attempts, resuming from a checkpoint")
    # bookkeeping
    log_every: int = Field(5, ge=1, description="optimizer steps between logged train.* metrics and log lines")
    eval_every: int = Field(25, ge=1, description="optimizer steps between held-out evaluations (every checkpoint "
                                                  "is evaluated too)")
    eval_sequences: int = Field(64, ge=1, description="held-out sequences scored at each evaluation")
    checkpoint_every: int = Field(25, ge=1, description="optimizer steps between checkpoints; the one with the best "
                                                        "held-out top-1 accuracy is exported")
    seed: int = Field(0, description="seed of the initial weights, the data order, the insertion points and the "
                                     "layer-skip search")

    @model_validator(mode="after")
    def _head_settings_need_a_head(self) -> "TrainConfig":
        method, defaults = TRAINING_METHODS[self.method], type(self).model_fields
        for keys, applies, owners in ((("head_start_step", "head_lr_scale"), method.trains_head, "ept-head"),
                                      (("head_depth",), method.head_kind in ("feature", "medusa", "eagle3"),
                                       "feature-head, medusa and eagle3"),
                                      (("head_inner",), method.head_kind in ("feature", "medusa"),
                                       "feature-head and medusa"),
                                      (("features_on_disk",), method.reads_features, "feature-head, medusa and eagle3"),
                                      (("draft_vocab",), method.head_kind is not None or method.builds_on_search,
                                       "feature-head, medusa, early-head and skip-finetune"),
                                      (("feature_weight",), method.head_kind == "feature", "feature-head"),
                                      (("early_layer",), method.head_kind == "early", "early-head"),
                                      (("search_trials", "search_prompts", "search_new_tokens"), method.searches,
                                       "layer-skip"),
                                      (("skip_from", "skip_ratio"), method.builds_on_search, "skip-finetune")):
            set_here = [k for k in keys if getattr(self, k) != defaults[k].default]
            if set_here and not applies:
                raise ValueError(f"{', '.join(set_here)} only apply to {owners}, not {self.method}")
        if self.online and (method.head_kind not in ONLINE_HEADS or self.features_on_disk):
            raise ValueError("train.online trains the drafts over the base's hidden states (eagle3, feature-head, "
                             "medusa) and keeps none on disk: use it with one of those methods and "
                             "train.features_on_disk false")
        if self.init_from is not None and method.searches:
            raise ValueError(f"train.init_from: {self.method} trains no weights to start from; it searches (drop "
                             "train.init_from)")
        if self.precision in ("bf16-autocast", "auto") and self.method != "eagle3":
            raise ValueError(f"train.precision {self.precision} is eagle3's (its draft layer); for {self.method} use "
                             "fp32 or bf16")
        if method.builds_on_search and not self.skip_from:
            raise ValueError(f"train.method {self.method} starts from a layer-skip search: set train.skip_from to the "
                             "component of a `train.method: layer-skip` run (its directory, or models:/NAME@ALIAS)")
        if self.max_steps is not None and self.head_start_step >= self.max_steps:
            raise ValueError(f"head_start_step={self.head_start_step} is not before max_steps={self.max_steps}: "
                             "the head would never train")
        return self

    @field_validator("init_token_ids")
    @classmethod
    def _one_id_per_ept(cls, ids: list[int] | None, info: ValidationInfo) -> list[int] | None:
        # num_prompt_tokens and num_epts are declared first, so they are in info.data when valid
        k, n = info.data.get("num_prompt_tokens"), info.data.get("num_epts")
        if ids is not None and k is not None and n is not None and len(ids) != k * n:
            raise ValueError(f"needs num_prompt_tokens * num_epts = {k} * {n} = {k * n} token ids, not {len(ids)}; "
                             "or null for a seeded draw")
        return ids


class CalibrateConfig(Section):
    execution_only = frozenset({"micro_batch"})

    sizes: list[Annotated[int, Field(ge=2, le=MAX_TREE_SIZE)]] = Field(
        [8, 12, 16, 24, 32, 48, 64], min_length=1,
        description="tree sizes to build, in input tokens per step; each holds the root and one prompt token's EPTs")
    max_rank: int = Field(10, ge=1, le=64, description="guesses per distance considered")
    sequences: int = Field(64, ge=1, description="held-out sequences measured")
    groups_per_sequence: int = Field(16, ge=1, description="insertion points measured per held-out sequence")
    micro_batch: int = Field(4, ge=1, description="sequences per measuring forward")
    # the corpus n-gram table (data_pipeline/ngram_cache.py) the component carries for ppd-lookup
    ngram_branches: int = Field(3, ge=0, le=16, description="continuations kept per n-gram; 0: no table")
    ngram_max_n: int = Field(3, ge=1, le=8, description="longest n-gram counted")
    ngram_min_count: int = Field(2, ge=1, description="n-grams seen fewer times are dropped")

    def check_epts(self, num_epts: int) -> None:
        """Every tree size must hold a tree for prompt tokens of `num_epts` EPTs (runtime/tree.py
        best_tree_for_size needs the root plus one prompt token's EPTs); raises ValueError naming the keys."""
        small = sorted({s for s in self.sizes if s < 1 + num_epts})
        if small:
            raise ValueError(f"calibrate.sizes {small} cannot hold a tree with train.num_epts={num_epts}: a tree "
                             f"needs the root token and one prompt token's {num_epts} EPT(s), so every size must be "
                             f">= {1 + num_epts}; drop those sizes or lower train.num_epts")
