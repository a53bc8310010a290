"""Training ProPD's early prediction head (ProPD paper section 4.1; train.method early-head): a head on the
residual stream after the first n decoder layers (train.early_layer) of the frozen base model that guesses
the next token, so a tree step can drop, after layer n, the nodes whose token is not among their parent's
top-K early guesses.

The head is PPD's residual block (models/decoding_head.py, zero at the start) followed by the base model's own
final norm and LM-head rows of the draft vocabulary: untrained it is the "logit lens" of layer n, which
the training improves by KD from the teacher cache (the distribution of token t+1 at every position t).
The evaluation reports the top-K recall of the teacher's most likely token for K = 1, 2, 4, 8, 16: the
figures that choose n and K (ProPD paper figure 3a).
"""

import random

import torch

from ppdkit.data_pipeline.teacher_cache import ShardSequence
from ppdkit.models.draft_heads import draft_logits, inverse_index
from ppdkit.models.decoding_head import ResidualHead, apply_residual_head

from .evaluate import DraftVocabTally
from .features import FeatureCache
from .losses import on_draft_vocab, soft_cross_entropy
from .warm_start import draft_vocabulary
from .training_run import TrainingRun

RECALL_AT = (1, 2, 4, 8, 16)
HYPERPARAMETERS = ("early_layer", "draft_vocab", "groups_per_sequence", "lr", "epochs", "seed")  # always KD


class EarlyHeadRun(TrainingRun):
    def __init__(self, method, cfg, base, train_sequences: list[ShardSequence], init=None):
        super().__init__(method, cfg, base)
        self.distances = 1
        layers = base.model.config.num_hidden_layers
        if not 1 <= cfg.early_layer < layers:
            raise ValueError(f"train.early_layer={cfg.early_layer}: the head must sit after 1 .. {layers - 1} of "
                             f"{base.model.config.name_or_path}'s {layers} decoder layers")
        lm_head = base.model.get_output_embeddings().weight.detach().float()  # [V, H]
        vocab = draft_vocabulary(cfg, train_sequences, lm_head.shape[0], init)
        self.vocab_index = inverse_index(vocab, lm_head.shape[0])
        self.vocab_rows = lm_head[vocab]  # [V', H]
        self.norm = base.model.get_decoder().norm  # the base model's final RMSNorm, frozen
        self.module = ResidualHead(lm_head.shape[1])
        self.module.register_buffer("draft_vocab", vocab)
        self.features = FeatureCache(base.model, cfg.early_layer)

    def _batch(self, sequences: list[ShardSequence], rng: random.Random, split: str):
        """(hidden after layer n [N, H], teacher top-K as draft-vocabulary indices [N, 1, K], their
        renormalised probabilities [N, 1, K], valid [N, 1]) at up to groups_per_sequence positions each."""
        hidden, ids, logprobs = [], [], []
        for seq in sequences:
            chosen = sorted(rng.sample(range(len(seq.positions)), min(self.cfg.groups_per_sequence,
                                                                        len(seq.positions))))
            at = seq.positions[chosen]  # [n] positions t: the entry is the distribution of token t+1
            hidden.append(self.features(seq, split)[at])
            ids.append(seq.topk_ids[chosen])
            logprobs.append(seq.topk_logprobs[chosen])
        return torch.cat(hidden), *on_draft_vocab(self.vocab_index, torch.cat(ids), torch.cat(logprobs))

    def _logp(self, engine, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] -> log-probabilities over the draft vocabulary [N, 1, V']."""
        state = self.norm(apply_residual_head(hidden, *engine()))
        return torch.log_softmax(draft_logits(state, self.vocab_rows), dim=-1)[:, None]

    def loss(self, engine, sequences, rng: random.Random, step: int) -> tuple[torch.Tensor, int]:
        hidden, index, probs, valid = self._batch(sequences, rng, "train")
        per = soft_cross_entropy(self._logp(engine, hidden), index, probs)  # [N, 1]
        return (per * valid).sum() / valid.sum().clamp_min(1), int(valid.sum())

    def evaluate(self, engine, holdout, step: int) -> dict[str, float]:
        rng = random.Random(1234)
        tally = DraftVocabTally(RECALL_AT)
        with torch.no_grad():
            for i in range(0, len(holdout), self.cfg.micro_batch):
                hidden, index, probs, valid = self._batch(holdout[i:i + self.cfg.micro_batch], rng, "holdout")
                tally.add(self._logp(engine, hidden), index, probs, valid)
        return tally.figures()

    def export_tensors(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"draft_vocab": state["draft_vocab"], "early_weight": state["weight"], "early_bias": state["bias"]}

    def hyperparameters(self) -> dict:
        return {key: getattr(self.cfg, key) for key in HYPERPARAMETERS}
