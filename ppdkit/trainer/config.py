"""The train section: one class per family of training methods (trainer/training_methods.py), each holding only the
keys its methods read, so a key another method reads fails at load instead of being silently ignored. The job spec
holds `TrainSection`, the union of those classes told apart by `method` (speculators' and SpecForge's pattern).

    TrainConfig                 every method: method, the cluster, seed
    ├── LayerSkipConfig         layer-skip: the skip-map search (no weights trained)
    └── WeightTrainingConfig    every method that trains weights: the optimisation, evaluation, checkpoints
        ├── PromptTokenConfig   ept: the prompt tokens        └── PromptHeadConfig  ept-head: and the decoding head
        ├── DraftHeadConfig     heads over the base's hidden states
        │   ├── FeatureHeadConfig  feature-head   ├── MedusaConfig  medusa   └── Eagle3Config  eagle3
        ├── EarlyHeadConfig     early-head
        └── SkipFinetuneConfig  skip-finetune
"""

from typing import Annotated, Any, Literal, Union, get_args

from pydantic import ConfigDict, Field, TypeAdapter, ValidationInfo, field_validator, model_validator

from ppdkit.models.config import Section
from ppdkit.runtime.decoding_methods import METHODS as DECODING_METHODS, Need

from .training_methods import TRAINING_METHODS

# A step of this many input tokens already costs far more on a CPU than the at most
# num_prompt_tokens + 1 <= 17 tokens it can accept, and building it takes ~1 s (O(size^2)):
# larger trees only burn calibration time.
MAX_TREE_SIZE = 1024

# what an eagle3 draft with train.parallel_draft serves too: the decoding methods that need its prompt tokens
PARALLEL_METHODS = tuple(m.name for m in DECODING_METHODS.values() if Need.EAGLE3_PROMPT_TOKENS in m.needs)
DEFAULT_METHOD = "ept"  # a train section without `method` trains PPD's prompt tokens
AUTOCAST_PRECISIONS = ("bf16-autocast", "auto")  # eagle3's alone: they time and autocast its draft layer


def _summary(method: str) -> str:
    return f"{method}: {TRAINING_METHODS[method].summary}"


# Keys more than one family reads, declared once so their bounds and descriptions agree everywhere.
Loss = Annotated[Literal["kd", "ce"], Field(description="kd: decayed KL to the teacher; ce: hard labels (ablation)")]
Alpha = Annotated[float, Field(gt=0.0, le=1.0, description="decay per token distance")]
GroupsPerSequence = Annotated[int, Field(ge=1, description="insertion points supervised per sequence per forward")]
DraftVocab = Annotated[int, Field(ge=16, description="the most frequent training tokens the drafts guess among")]
Online = Annotated[bool, Field(description="no teacher cache: the frozen base computes each sequence's targets (its "
                               "own LM head's top teacher.top_k on its final state, in teacher.compute_dtype) and the "
                               "hidden states a draft over them reads in the training step, one forward a sequence, "
                               "kept in memory up to 2 GB a worker (SpecForge's online mode); the teacher stage is "
                               "skipped; the base is the model the decoder verifies with (base_model.quantization none)")]


class TrainConfig(Section):
    """The keys every training method takes.

    `TrainConfig(method=..., **keys)` gives that method's own class, as the spec's train section is read (a method's
    class is built like any pydantic model)."""
    execution_only = frozenset({"num_workers", "cpus_per_worker", "log_every"})

    method: Literal[tuple(TRAINING_METHODS)] = Field(
        DEFAULT_METHOD, description="; ".join(_summary(m) for m in TRAINING_METHODS))
    # the cluster
    num_workers: int = Field(2, ge=0, description="Ray Train workers (one DeepSpeed rank each); 0: Ray Train's "
                             "local mode, one rank in the driver's own process (no worker start-up: small runs, "
                             "debugging); layer-skip: with cpus_per_worker, the CPUs a trial is timed on")
    cpus_per_worker: int = Field(1, ge=1, description="CPUs (and torch threads) per Ray Train worker")
    max_failures: int = Field(1, ge=0, description="worker-group restarts Ray Train attempts, resuming from a "
                                                   "checkpoint (layer-skip: a failed trial's retries)")
    seed: int = Field(0, description="seed of the initial weights, the data order, the insertion points and the "
                                     "layer-skip search")

    def decoding_methods(self) -> tuple[str, ...]:
        """The decoding methods this run's component serves (runtime/decoding_methods.py): its method's."""
        return TRAINING_METHODS[self.method].decoding_methods

    def __new__(cls, /, **keys: Any) -> "TrainConfig":
        if cls is TrainConfig:  # the base itself is no method's: dispatch on `method`
            return train_config(keys)
        return super().__new__(cls)


class LayerSkipConfig(TrainConfig):
    """The skip-map search (D&V paper 3.3): no weights, so no optimisation keys."""
    method: Literal["layer-skip"] = Field("layer-skip", description=_summary("layer-skip"))
    search_trials: int = Field(40, ge=1, description="skip maps timed (Optuna's TPE on Ray Tune)")
    search_prompts: int = Field(8, ge=1, description="development prompts, the data stage's held-out first user turns")
    search_new_tokens: int = Field(32, ge=1, description="tokens decoded per prompt in a trial")

    @field_validator("num_workers")
    @classmethod
    def _cpus_to_time_on(cls, value: int) -> int:
        if value < 1:
            raise ValueError("layer-skip times each trial on num_workers * cpus_per_worker CPUs of the cluster: set "
                             "train.num_workers to 1 or more (0, local mode, is for the methods that train weights)")
        return value


class WeightTrainingConfig(TrainConfig):
    """What every method that trains weights on Ray Train workers (trainer/worker.py) reads."""
    # where the weights start
    init_from: str | None = Field(None, description="start from this trained component's weights (its directory or "
                                  "models:/NAME@ALIAS; the same method, base model and shapes) and draft vocabulary, "
                                  "not a fresh draw: more epochs, or new data; the lr schedule starts anew. A larger "
                                  "draft_vocab grows the component's by this run's most frequent other tokens")
    # the optimisation (AdamW, cosine, no warm-up by default: section 6.1.2)
    # AdamW moves every weight by about lr per step whatever the gradient's scale, and prompt tokens
    # start as copies of token embeddings whose elements are far below 1: an lr above 1 throws every
    # element past its whole range in one step, so it is a typo (the paper's is 0.01), not a setting.
    lr: float = Field(0.01, gt=0.0, le=1.0, description="AdamW learning rate")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW decoupled weight decay; negative would grow the weights")
    warmup_steps: int = Field(0, ge=0, description="optimizer steps over which the lr rises linearly to train.lr "
                              "before the method's schedule (0: none, the paper's). A run from a trained component "
                              "starts a fresh AdamW state at full lr otherwise")
    epochs: int = Field(1, ge=1, description="passes over the training sequences, insertion points redrawn each; "
                                             "max_steps stops sooner")
    max_steps: int | None = Field(None, ge=1, description="stop after this many optimizer steps")
    train_positions: int | None = Field(None, ge=1, description="train on a seeded random subset of the cache's "
                                        "sequences holding about this many supervised positions, nested for "
                                        "growing values (data-scaling studies); null: all")
    micro_batch: int = Field(4, ge=1, description="sequences per worker per micro-step")
    grad_accum: int = Field(1, ge=1, description="micro-steps per optimizer step (DeepSpeed gradient accumulation)")
    zero_stage: int = Field(0, ge=0, le=2, description="DeepSpeed ZeRO stage")
    precision: Literal["fp32", "bf16"] = Field("fp32", description="DeepSpeed training precision (bf16: its bf16 mode)")
    # bookkeeping
    log_every: int = Field(5, ge=1, description="optimizer steps between logged train.* metrics and log lines")
    eval_every: int = Field(25, ge=1, description="optimizer steps between held-out evaluations (every checkpoint "
                                                  "is evaluated too)")
    eval_sequences: int = Field(64, ge=1, description="held-out sequences scored at each evaluation")
    checkpoint_every: int = Field(25, ge=1, description="optimizer steps between checkpoints; the one with the best "
                                                        "held-out top-1 accuracy is exported")

    @field_validator("precision", mode="before")
    @classmethod
    def _autocast_is_eagle3s(cls, precision: Any, info: ValidationInfo) -> Any:
        # says what to use instead where pydantic would only list the allowed values (Eagle3Config widens them)
        if precision in AUTOCAST_PRECISIONS and precision not in get_args(cls.model_fields["precision"].annotation):
            raise ValueError(f"train.precision {precision} is eagle3's (its draft layer); for "
                             f"{info.data.get('method')} use fp32 or bf16")
        return precision


class PromptTokenConfig(WeightTrainingConfig):
    """PPD's prompt tokens (PPD thesis ch. 4)."""
    method: Literal["ept"] = Field("ept", description=_summary("ept"))
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
    loss: Loss = "kd"
    alpha: Alpha = 0.8
    groups_per_sequence: GroupsPerSequence = 16
    online: Online = False

    @field_validator("init_token_ids")
    @classmethod
    def _one_id_per_ept(cls, ids: list[int] | None, info: ValidationInfo) -> list[int] | None:
        # num_prompt_tokens and num_epts are declared first, so they are in info.data when valid
        k, n = info.data.get("num_prompt_tokens"), info.data.get("num_epts")
        if ids is not None and k is not None and n is not None and len(ids) != k * n:
            raise ValueError(f"needs num_prompt_tokens * num_epts = {k} * {n} = {k * n} token ids, not {len(ids)}; "
                             "or null for a seeded draw")
        return ids


class PromptHeadConfig(PromptTokenConfig):
    """The prompt tokens plus PPD's custom decoding head (PPD thesis 4.4.2)."""
    method: Literal["ept-head"] = Field("ept-head", description=_summary("ept-head"))
    head_start_step: int = Field(0, ge=0, description="the step the head joins at (0: 1-stage; later: 2-stage, the "
                                                      "prompt tokens alone before it)")
    head_lr_scale: float = Field(1.0, gt=0.0, le=1.0, description="lr factor of both parts once the head trains in "
                                                                  "2-stage, of the head in 1-stage")

    @model_validator(mode="after")
    def _head_joins_before_the_end(self) -> "PromptHeadConfig":
        if self.max_steps is not None and self.head_start_step >= self.max_steps:
            raise ValueError(f"head_start_step={self.head_start_step} is not before max_steps={self.max_steps}: "
                             "the head would never train")
        return self


class DraftHeadConfig(WeightTrainingConfig):
    """Drafts over the frozen base model's hidden states (feature-head, medusa, eagle3)."""
    head_depth: int = Field(4, ge=1, le=16, description="feature-head, medusa: token distances guessed per step; "
                                                        "eagle3: the training-time test's steps")
    draft_vocab: DraftVocab = 4096
    features_on_disk: bool = Field(False, description="write the frozen base's hidden states of each training "
                                   "sequence to a file beside the teacher cache the first time it is computed, and "
                                   "read them there at every later visit, by any worker or later run on that cache "
                                   "(2 x hidden x layers bytes a position: 3,456 for SmolLM2's EAGLE-3, about 17 GB "
                                   "for the large set). Computing them is about half of an EAGLE-3 step on 2 CPU "
                                   "cores, and an EAGLE-3 worker keeps only 2 GB of them in memory")
    online: Online = False
    loss: Loss = "kd"
    alpha: Alpha = 0.8

    @model_validator(mode="after")
    def _online_keeps_nothing_on_disk(self) -> "DraftHeadConfig":
        if self.online and self.features_on_disk:
            raise ValueError("train.online computes the base's hidden states in the training step and keeps none on "
                             "disk: set train.features_on_disk false")
        return self


class HeadConfig(DraftHeadConfig):
    """Draft heads over the base's last hidden state, trained on paths from insertion points (models/draft_heads.py)."""
    groups_per_sequence: GroupsPerSequence = 16


class FeatureHeadConfig(HeadConfig):
    """ppdkit's draft head: an MLP over the last hidden state and the path's tokens, with feature regression."""
    method: Literal["feature-head"] = Field("feature-head", description=_summary("feature-head"))
    head_inner: int = Field(1024, ge=1, description="width of the head's MLP")
    feature_weight: float = Field(1.0, ge=0.0, description="weight of the feature regression loss")


class MedusaConfig(HeadConfig):
    """Medusa-1's heads, one residual block per distance: no keys of their own."""
    method: Literal["medusa"] = Field("medusa", description=_summary("medusa"))


class Eagle3Config(DraftHeadConfig):
    """EAGLE-3's draft layer, trained on whole sequences with the training-time test."""
    method: Literal["eagle3"] = Field("eagle3", description=_summary("eagle3"))
    precision: Literal["fp32", "bf16", *AUTOCAST_PRECISIONS] = Field(
        "fp32", description="DeepSpeed training precision (bf16: its bf16 mode); bf16-autocast: weights and optimizer "
                            "in float32, the draft's training forward and backward in bfloat16 under torch.autocast "
                            "(much faster on a CPU with AVX512-BF16 and on a GPU, slower on a CPU without AMX whose "
                            "bfloat16 dot product issues slower than its float32 FMAs); auto: bf16-autocast or fp32, "
                            "whichever each worker times faster at its start")
    top1_share: float = Field(0.0, ge=0.0, le=1.0, description="the share of each step's target moved onto the "
                              "teacher's most likely token: (1 - share) x its distribution + share x its top-1. Greedy "
                              "decoding keeps a guess only where it is the base's top-1; 0 learns the distribution "
                              "alone (EAGLE-3's loss)")
    parallel_draft: bool = Field(False, description="prompt tokens for the draft (PPD thesis 6.4; P-EAGLE): steps "
                                 "1 .. head_depth - 1 of the training-time test read a trained pair (an embedding and "
                                 "a hidden state) per step in place of the previous step's guess and state, so the "
                                 "decoder guesses every depth in one draft forward (decoding methods eagle3-ppd*)")
    freeze_draft: bool = Field(False, description="with parallel_draft: train the prompt tokens alone, the draft "
                               "layer as train.init_from left it (its sequential eagle3* methods unchanged)")
    prompt_lr_scale: float = Field(10.0, gt=0.0, description="with parallel_draft: the prompt tokens' lr is "
                                   "train.lr times this (they start from a small random draw, the draft from a "
                                   "trained one)")

    @field_validator("loss")
    @classmethod
    def _learns_distributions(cls, loss: str) -> str:
        if loss != "kd":
            raise ValueError("train.method eagle3 learns the teacher's distributions (train.loss kd); the hard-label "
                             "ablation (ce) is the feature head's and Medusa's")
        return loss

    def decoding_methods(self) -> tuple[str, ...]:
        """eagle3's, and with prompt tokens for the draft the methods that draft with them."""
        return super().decoding_methods() + (PARALLEL_METHODS if self.parallel_draft else ())

    @model_validator(mode="after")
    def _parallel_needs_depths(self) -> "Eagle3Config":
        if self.parallel_draft and self.head_depth < 2:
            raise ValueError("train.parallel_draft trains prompt tokens for depths 2 .. head_depth: set "
                             "train.head_depth to 2 or more")
        if self.freeze_draft and not (self.parallel_draft and self.init_from):
            raise ValueError("train.freeze_draft trains only the draft's prompt tokens: it needs "
                             "train.parallel_draft true and train.init_from (the trained draft they serve)")
        return self


class EarlyHeadConfig(WeightTrainingConfig):
    """ProPD's early prediction head (ProPD paper 4.1): always KD, one token distance."""
    method: Literal["early-head"] = Field("early-head", description=_summary("early-head"))
    early_layer: int = Field(4, ge=1, description="the decoder layers before the head (ProPD's n)")
    draft_vocab: DraftVocab = 4096
    groups_per_sequence: GroupsPerSequence = 16


class SkipFinetuneConfig(WeightTrainingConfig):
    """The aggressive skip (D&V paper appendix F): every position with a teacher entry, one token distance."""
    method: Literal["skip-finetune"] = Field("skip-finetune", description=_summary("skip-finetune"))
    skip_from: str | None = Field(None, description="the layer-skip component whose sub-layer ranking it starts from "
                                                    "(a directory or models:/NAME@ALIAS); required")
    skip_ratio: float = Field(0.5, gt=0.0, lt=1.0, description="the share of all sub-layers skipped, from the top of "
                                                                "the ranking")
    draft_vocab: DraftVocab = 4096
    loss: Loss = "kd"

    @model_validator(mode="after")
    def _starts_from_a_search(self) -> "SkipFinetuneConfig":
        if not self.skip_from:
            raise ValueError(f"train.method {self.method} starts from a layer-skip search: set train.skip_from to the "
                             "component of a `train.method: layer-skip` run (its directory, or models:/NAME@ALIAS)")
        return self


METHOD_CLASSES: tuple[type[TrainConfig], ...] = (PromptTokenConfig, PromptHeadConfig, FeatureHeadConfig, MedusaConfig,
                                                 Eagle3Config, EarlyHeadConfig, LayerSkipConfig, SkipFinetuneConfig)
# The spec's train section: the class whose `method` the section names.
TrainSection = Annotated[Union[METHOD_CLASSES], Field(discriminator="method")]
CLASS_OF_METHOD: dict[str, type[TrainConfig]] = {
    get_args(cls.model_fields["method"].annotation)[0]: cls for cls in METHOD_CLASSES}
if set(CLASS_OF_METHOD) != set(TRAINING_METHODS):  # a method added to the registry needs its keys here
    raise TypeError(f"trainer/config.py has train classes for {sorted(CLASS_OF_METHOD)}, the registry names "
                    f"{sorted(TRAINING_METHODS)}")
_SECTION = TypeAdapter(TrainSection, config=ConfigDict(title="train"))  # the error's title


def with_default_method(keys: dict) -> dict:
    """The train section's keys with `method` the default where they name none (the union needs its tag)."""
    return keys if "method" in keys else {"method": DEFAULT_METHOD, **keys}


def train_config(keys: dict) -> TrainConfig:
    """The train section `keys` describe, as its method's class; pydantic's ValidationError where they do not fit."""
    return _SECTION.validate_python(with_default_method(keys))


def methods_taking(key: str) -> list[str]:
    """The training methods whose train section has `key`."""
    return [method for method, cls in CLASS_OF_METHOD.items() if key in cls.model_fields]


def trains_online(cfg: TrainConfig) -> bool:
    """train.online: the base computes the targets in the training step (the prompt tokens and the drafts over the
    base's states take it)."""
    return isinstance(cfg, (PromptTokenConfig, DraftHeadConfig)) and cfg.online


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
        """Every tree size must hold a tree for prompt tokens of `num_epts` EPTs (runtime/trees/tree.py
        best_tree_for_size needs the root plus one prompt token's EPTs); raises ValueError naming the keys."""
        small = sorted({s for s in self.sizes if s < 1 + num_epts})
        if small:
            raise ValueError(f"calibrate.sizes {small} cannot hold a tree with train.num_epts={num_epts}: a tree "
                             f"needs the root token and one prompt token's {num_epts} EPT(s), so every size must be "
                             f">= {1 + num_epts}; drop those sizes or lower train.num_epts")
