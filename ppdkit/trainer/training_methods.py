"""The training methods, in one registry: `train.method` names one. An entry says what the method is, which
decoding methods (runtime/decoding_methods.py) use its component (the evaluate stage benchmarks those, the register
stage tags the version with their figures), and which TrainingRun trains it (trainer/training_run.py): built from
the config, the frozen base model and the training sequences, it gives the worker (trainer/worker.py) the
trainable module, its parameter groups, a batch's loss, the held-out evaluation and the exported tensors.

ept           PPD's prompt tokens with ensemble prompt tokens (PPD thesis ch. 4).      trainer/prompt_run.py
ept-head      the same plus PPD's custom decoding head for the prompt tokens' hidden states (PPD thesis
              4.4.2, models/decoding_head.py). 1-stage: both from step 0 (train.head_start_step=0). 2-stage: the
              prompt tokens alone until head_start_step, then both at lr * head_lr_scale.
feature-head  ppdkit's draft head over the base model's last hidden state and the path's tokens
              (models/draft_heads.py), KD from the teacher cache plus feature regression.  trainer/head_run.py
medusa        Medusa-1 heads over the last hidden state (the baseline of feature-head).
eagle3        EAGLE-3's draft: one decoder layer over the fused low, middle and high hidden states, trained
              with the training-time test (models/eagle3.py).                         trainer/eagle3_run.py
early-head    ProPD's early prediction head after n layers, for pruning tree nodes (ProPD paper 4.1).
                                                                                        trainer/early_run.py
layer-skip    Draft & Verify's skip map (D&V paper 3.3): no weights; a Ray Tune search of the sub-layers the
              draft leaves out, by measured time per token on development prompts. trainer/layer_skip_run.py
skip-finetune the aggressive skip (D&V paper appendix F): the top of a layer-skip search's ranking skipped,
              the draft's own norms trained by KD, guesses over a draft vocabulary.  trainer/skip_finetune_run.py
"""

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass


def cosine(step: int, total: int) -> float:
    """The lr factor of a cosine decay without warm-up (section 6.1.2), as CosineAnnealingLR gives it."""
    return 0.5 * (1.0 + math.cos(math.pi * min(step, total) / total))


def warmup(step: int, steps: int) -> float:
    """The lr factor of a linear warm-up over `steps` optimizer steps (step 0 at 1/steps, full from step steps - 1
    on), as transformers' schedules with warmup_steps rise; 1 throughout for steps 0. It multiplies a method's own
    factors (train.warmup_steps)."""
    return 1.0 if steps <= 0 else min(1.0, (step + 1) / steps)


def warmed(factor: Callable[[int], float], steps: int) -> Callable[[int], float]:
    """A step's lr factor `factor` after `steps` of linear warm-up: their product (factor itself for no warm-up)."""
    return factor if steps <= 0 else lambda step: warmup(step, steps) * factor(step)


@dataclass(frozen=True)
class TrainingMethod:
    name: str
    summary: str
    run: str  # "module:Name" in ppdkit.trainer: the TrainingRun class (method, cfg, base, train_sequences, init)
    decoding_methods: tuple[str, ...]  # runtime/decoding_methods.py names that use this method's component
    trains_head: bool = False  # PPD's custom decoding head: train.head_start_step / head_lr_scale apply
    head_kind: str | None = None  # a head over the base model's features: feature, medusa (models/draft_heads.py),
    # early (trainer/early_run.py), eagle3 (models/eagle3.py)
    searches: bool = False  # trains no weights: `run` names a function `(base, cfg, data_dir, out_dir, tracker_ref)`
    # that searches on Ray Tune and exports the component itself
    needs_teacher: bool = True  # reads the teacher cache (the teacher stage is skipped for a method that does not)
    calibrates: bool = True  # has trees to calibrate (the calibrate stage passes the component on otherwise)
    builds_on_search: bool = False  # starts from a layer-skip component's ranking (train.skip_from, skip_ratio)

    @property
    def reads_features(self) -> bool:
        """It trains on the frozen base's hidden states of the teacher's own forward (in the teacher's dtype)."""
        return self.head_kind in ("feature", "medusa", "eagle3")

    def runner(self):
        """What `run` names: the TrainingRun class, or a searching method's search function."""
        module, name = self.run.split(":")
        return getattr(importlib.import_module(f"ppdkit.trainer.{module}"), name)

    def start(self, cfg, base, train_sequences, init=None, teacher=None):
        """The method's run: module, param_groups, loss, evaluate, export_tensors, hyperparameters; its weights
        (and draft vocabulary) those of `init`, a trained component of this method (trainer/warm_start.py), if given.
        `teacher`: the TeacherCache it trains on, whose engine computes the features it reads (trainer/features.py), or
        train.online's OnlineTeacher, which computes them with the targets."""
        run = self.runner()(self, cfg, base, train_sequences, init)
        from .online_teacher import OnlineTeacher

        if isinstance(teacher, OnlineTeacher) and not self.reads_features:  # train.online: the targets alone
            teacher.serve_targets_only()
        elif isinstance(teacher, OnlineTeacher):  # train.online: the features come with the targets, one forward
            teacher.serve_features(run.features.layer)
        elif teacher is not None and self.reads_features:
            from .features import feature_store, teacher_runtime

            runtime = teacher_runtime(base.model, teacher)
            run.features.compute_on(runtime)
            if cfg.features_on_disk:
                run.features.keep_on_disk(feature_store(teacher, run.features.layer, runtime),
                                          sum(len(s.input_ids) for s in train_sequences),
                                          base.model.config.hidden_size)
        if init is not None:
            from .warm_start import load_weights

            load_weights(run, init)
        return run


TRAINING_METHODS: dict[str, TrainingMethod] = {m.name: m for m in (
    TrainingMethod("ept", "PPD's prompt tokens (PPD thesis ch. 4)", "prompt_run:PromptRun", ("ppd", "ppd-lookup", "ppd-corpus")),
    TrainingMethod("ept-head", "prompt tokens and a custom decoding head (PPD thesis 4.4.2)", "prompt_run:PromptRun",
                   ("ppd", "ppd-head", "ppd-lookup", "ppd-corpus"), trains_head=True),
    TrainingMethod("feature-head", "a draft head over the last hidden state and the path's tokens",
                   "head_run:HeadRun", ("feature-head", "feature-grown", "feature-grown-anpd"), head_kind="feature"),
    TrainingMethod("medusa", "Medusa-1 heads over the last hidden state (the feature head's baseline)",
                   "head_run:HeadRun", ("medusa",), head_kind="medusa"),
    TrainingMethod("eagle3", "EAGLE-3's draft: one decoder layer over the fused low, middle and high hidden states, "
                   "trained with the training-time test", "eagle3_run:Eagle3Run", ("eagle3", "eagle3-anpd", "eagle3-corpus"),
                   head_kind="eagle3", calibrates=False),
    TrainingMethod("early-head", "ProPD's early prediction head after train.early_layer layers (ProPD paper 4.1)",
                   "early_run:EarlyHeadRun", (), head_kind="early"),
    TrainingMethod("layer-skip", "Draft & Verify's skip map, searched on Ray Tune by measured time per token "
                   "(D&V paper 3.3)", "layer_skip_run:run_search", ("skip",), searches=True, needs_teacher=False,
                   calibrates=False),
    TrainingMethod("skip-finetune", "Draft & Verify's aggressive skip: more sub-layers skipped, the draft's own norms "
                   "fine-tuned by KD (D&V paper appendix F)", "skip_finetune_run:SkipFinetuneRun",
                   ("skip", "skip-ft"), calibrates=False, builds_on_search=True),
)}
