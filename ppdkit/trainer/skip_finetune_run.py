"""Training the aggressive-skip draft (train.method skip-finetune, D&V paper appendix F): what trainer/worker.py
runs for it. The draft skips the top `train.skip_ratio` of the sub-layers a layer-skip search ranked
(train.skip_from), and learns by KD from the teacher cache only its own RMSNorm weights (ln1 and ln2 of every
layer, the final norm: 2 L H + H floats, ~35k for SmolLM2) and reads its guesses over a draft vocabulary (the
train.draft_vocab most frequent training tokens, through the base model's own LM-head rows).

Why the norms, not all kept layers or LoRA: the draft shares the base model's matmul weights and reads the
keys/values the whole model committed, so it costs no memory and its queries and keys stay those of the
model that wrote the cache; per-channel scales are what the skipped sub-layers' missing contributions
shift, and they train in minutes on a CPU. The paper's whole-draft fine-tune duplicates the kept layers.
The draft-vocabulary head is there for speed: the full LM head is a fifth of SmolLM2's weights, read once
per drafted token. The verifier stays the frozen base model, so the output is unchanged whatever is learnt.
"""

import random
from pathlib import Path

import torch

from ppdkit.data_pipeline.teacher_cache import ShardSequence
from ppdkit.models.artifact import ArtifactError, read_component
from ppdkit.models.draft_heads import draft_logits, inverse_index
from ppdkit.runtime.drafters.layer_skip import check_skip_map
from ppdkit.runtime.forward.llama import SKIP_ATTENTION, SKIP_MLP

from .evaluate import TOPS, DraftVocabTally
from .losses import on_draft_vocab, soft_cross_entropy
from .warm_start import draft_vocabulary
from .skip_draft import DraftNorms, draft_states
from .training_run import TrainingRun

HYPERPARAMETERS = ("skip_ratio", "draft_vocab", "loss", "lr", "epochs", "seed")


def aggressive_skip_map(ranking: list[str], layers: int, ratio: float) -> tuple[int, ...]:
    """The skip map leaving out the first round(ratio * 2L) sub-layers of a search's ranking ("attention_3",
    "mlp_7", ...: the one most worth skipping first)."""
    skip = [0] * layers
    for name in ranking[:round(ratio * 2 * layers)]:
        part, layer = name.split("_")
        skip[int(layer)] |= SKIP_ATTENTION if part == "attention" else SKIP_MLP
    return check_skip_map(tuple(skip), layers)


def searched_ranking(directory: Path, fingerprint: str, layers: int) -> tuple[list[str], dict]:
    """(the sub-layer ranking, the search's figures) of the layer-skip component in `directory`."""
    component = read_component(directory, expect_fingerprint=fingerprint)  # refuses another base model
    search = component.extras.get("search") or {}
    ranking = search.get("ranking")
    expected = {f"{part}_{i}" for i in range(layers) for part in ("attention", "mlp")}
    if component.method != "layer-skip" or not isinstance(ranking, list) or set(ranking) != expected:
        raise ArtifactError(f"train.skip_from={directory} is not a layer-skip component of this base model with a "
                            "search ranking of its 2 x {layers} sub-layers (search.json): point it at the "
                            "component of a `train.method: layer-skip` run")
    return ranking, {k: v for k, v in search.items() if k not in ("ranking", "trials")}


class SkipFinetuneRun(TrainingRun):
    def __init__(self, method, cfg, base, train_sequences: list[ShardSequence], init=None):
        super().__init__(method, cfg, base)
        self.distances = 1
        layers = base.model.config.num_hidden_layers
        self.ranking, self.search = searched_ranking(Path(cfg.skip_from), base.fingerprint, layers)
        self.skip = aggressive_skip_map(self.ranking, layers, cfg.skip_ratio)
        lm_head = base.model.get_output_embeddings().weight.detach().float()  # [V, H]
        vocab = draft_vocabulary(cfg, train_sequences, lm_head.shape[0], init)  # [V']
        self.vocab_index = inverse_index(vocab, lm_head.shape[0])
        self.vocab_rows = lm_head[vocab]  # [V', H]
        self.module = DraftNorms(base.model)
        self.module.register_buffer("draft_vocab", vocab)  # saved with every checkpoint and exported

    def _logp_and_targets(self, engine, sequences: list[ShardSequence]):
        """(draft log-probabilities [N, 1, V'] at every position with a teacher entry, the teacher's top-K as
        draft-vocabulary indices [N, 1, K], their probabilities renormalised on the draft vocabulary [N, 1, K],
        valid [N, 1])."""
        longest = max(len(s.input_ids) for s in sequences)
        ids = torch.zeros(len(sequences), longest, dtype=torch.long)  # right-padded
        for row, seq in enumerate(sequences):
            ids[row, :len(seq.input_ids)] = seq.input_ids
        states = draft_states(self.base.model, ids, self.skip, engine())  # [B, T, H]
        picked = torch.cat([states[row, seq.positions] for row, seq in enumerate(sequences)])  # [N, H]
        logp = torch.log_softmax(draft_logits(picked, self.vocab_rows), dim=-1)[:, None]  # [N, 1, V']
        return logp, *on_draft_vocab(self.vocab_index, torch.cat([s.topk_ids for s in sequences]),
                                     torch.cat([s.topk_logprobs for s in sequences]))

    def loss(self, engine, sequences, rng: random.Random, step: int) -> tuple[torch.Tensor, int]:
        logp, index, probs, valid = self._logp_and_targets(engine, sequences)
        if self.cfg.loss == "kd":
            per = soft_cross_entropy(logp, index, probs)  # [N, 1]
        else:  # the text's next token, where the teacher cache holds the sequence's own continuation
            nxt = torch.cat([s.input_ids[(s.positions + 1).clamp_max(len(s.input_ids) - 1)] for s in sequences])
            per = -logp.gather(-1, self.vocab_index[nxt].clamp_min(0)[:, None, None]).squeeze(-1)
        return (per * valid).sum() / valid.sum().clamp_min(1), int(valid.sum())

    def evaluate(self, engine, holdout, step: int) -> dict[str, float]:
        """Top-1/5/10 agreement with the teacher's most likely token (outside the draft vocabulary: a miss; top-1
        is the draft's acceptance rate for a first guess under greedy decoding), and the loss."""
        tally = DraftVocabTally(TOPS)
        with torch.no_grad():
            for i in range(0, len(holdout), self.cfg.micro_batch):
                tally.add(*self._logp_and_targets(engine, holdout[i:i + self.cfg.micro_batch]))
        return tally.figures()

    def export_tensors(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"draft_vocab": state["draft_vocab"], "skip_ln1": state["ln1"], "skip_ln2": state["ln2"],
                "skip_norm": state["norm"]}

    def hyperparameters(self) -> dict:
        return {"skip_map": list(self.skip), "skipped_attention": sum(bool(s & SKIP_ATTENTION) for s in self.skip),
                "skipped_mlp": sum(bool(s & SKIP_MLP) for s in self.skip), "layers": len(self.skip),
                "search": self.search, **{key: getattr(self.cfg, key) for key in HYPERPARAMETERS}}
