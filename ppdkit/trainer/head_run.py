"""Training draft heads over the base model's features (feature-head, medusa; models/draft_heads.py): what
trainer/worker.py runs for those methods (trainer/training_methods.py). The features come from trainer/features.py
(once per sequence), the targets from the teacher cache.
"""

import random

import torch

from ppdkit.data_pipeline.teacher_cache import ShardSequence
from ppdkit.models.draft_heads import TENSORS, DraftHeads, draft_logits, inverse_index, path_states

from .evaluate import TOPS, by_distance
from .config import FeatureHeadConfig
from .features import FeatureCache
from .head_batch import HeadBatch, head_batch, path_starts
from .losses import decay_mean, soft_cross_entropy, topk_hits
from .warm_start import draft_vocabulary
from .training_run import TrainingRun

HYPERPARAMETERS = ("head_depth", "draft_vocab", "head_inner", "feature_weight", "loss", "alpha",
                   "groups_per_sequence", "lr", "epochs", "seed")


class HeadRun(TrainingRun):
    def __init__(self, method, cfg, base, train_sequences: list[ShardSequence], init=None):
        super().__init__(method, cfg, base)
        self.kind, self.distances = method.head_kind, cfg.head_depth
        self.embed = base.model.get_input_embeddings().weight.detach().float()  # [V, H]
        vocab_size, hidden = self.embed.shape
        vocab = draft_vocabulary(cfg, train_sequences, vocab_size, init)  # [V']
        self.vocab_index = inverse_index(vocab, vocab_size)
        # [V', H] the frozen readout: the base model's own LM-head rows (tied to the embeddings in SmolLM2)
        self.vocab_rows = base.model.get_output_embeddings().weight.detach().float()[vocab]
        inner = cfg.head_inner if isinstance(cfg, FeatureHeadConfig) else 0  # Medusa's heads have no MLP
        self.module = DraftHeads(self.kind, hidden, cfg.head_depth, inner, cfg.seed)
        self.module.register_buffer("draft_vocab", vocab)  # saved with every checkpoint and exported
        self.features = FeatureCache(base.model)  # final hidden states, computed once per sequence

    def batch(self, sequences: list[ShardSequence], rng: random.Random, split: str) -> HeadBatch:
        starts = [path_starts(s, self.cfg.groups_per_sequence, rng) for s in sequences]
        return head_batch(sequences, [self.features(s, split) for s in sequences], self.cfg.head_depth,
                          self.vocab_index, starts)

    def _logp(self, engine, batch: HeadBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probabilities over the draft vocabulary [N, D, V'], the states [N, D, H])."""
        states = path_states(self.kind, engine(), batch.start, batch.path_tokens, self.embed)
        return torch.log_softmax(draft_logits(states, self.vocab_rows), dim=-1), states

    def per_depth_loss(self, logp: torch.Tensor, states: torch.Tensor, batch: HeadBatch) -> torch.Tensor:
        """[N, D]: soft cross-entropy to the teacher on the draft vocabulary (kd) or to the text's next token
        (ce), plus for the feature head feature_weight * smooth-L1 to the base model's own next feature."""
        if self.cfg.loss == "kd":
            per = soft_cross_entropy(logp, batch.teacher_index, batch.teacher_probs)
        else:
            # a token outside the draft vocabulary cannot be guessed: it scores as the draft's index 0
            per = -logp.gather(-1, self.vocab_index[batch.next_tokens].clamp_min(0)[..., None]).squeeze(-1)
        if self.kind == "feature":
            regression = torch.nn.functional.smooth_l1_loss(states, batch.features, reduction="none").mean(-1)
            per = per + self.cfg.feature_weight * regression
        return per

    def loss(self, engine, sequences, rng: random.Random, step: int) -> tuple[torch.Tensor, int]:
        batch = self.batch(sequences, rng, "train")
        logp, states = self._logp(engine, batch)
        return decay_mean(self.per_depth_loss(logp, states, batch), batch.valid, self.cfg.alpha), batch.supervised

    def evaluate(self, engine, holdout, step: int) -> dict[str, float]:
        """Top-1/5/10 accuracy by distance against the teacher's most likely token (outside the draft
        vocabulary counts as a miss), the loss by distance, and the draft vocabulary's coverage of the targets."""
        rng = random.Random(1234)  # the same paths at every evaluation
        d = self.cfg.head_depth
        hits, loss_sum, count, covered = {top: torch.zeros(d) for top in TOPS}, torch.zeros(d), torch.zeros(d), 0.0
        with torch.no_grad():
            for i in range(0, len(holdout), self.cfg.micro_batch):
                batch = self.batch(holdout[i:i + self.cfg.micro_batch], rng, "holdout")
                logp, states = self._logp(engine, batch)
                valid = batch.valid  # [N, D]
                # each batch's sums come to the CPU (one number a distance), wherever the batch was computed
                for top, hit in topk_hits(logp, batch.teacher_top1, TOPS).items():
                    hits[top] += (hit & valid).sum(0).cpu()
                loss_sum += (self.per_depth_loss(logp, states, batch) * valid).sum(0).cpu()
                count += valid.sum(0).cpu()
                covered += float(((batch.teacher_top1 >= 0) & valid).sum())
        return {**by_distance(hits, {"loss": loss_sum}, count),
                "draft_vocab_coverage": covered / max(count.sum().item(), 1.0)}

    def export_tensors(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"draft_vocab": state["draft_vocab"], **{name: state[name] for name in TENSORS[self.kind]}}

    def hyperparameters(self) -> dict:
        taken = type(self.cfg).model_fields  # Medusa takes neither head_inner nor feature_weight
        return {"head_kind": self.kind, **{key: getattr(self.cfg, key) for key in HYPERPARAMETERS if key in taken}}
