"""Training EAGLE-3's draft (train.method eagle3, models/eagle3.py): what trainer/worker.py runs for it.

Whole sequences, with the training-time test: step 0 reads the fused hidden states g_t of the frozen base at
every position t and the next tokens x_{t+1}; step k reads step k-1's own outputs h and the tokens x_{t+1+k},
at rotary position t+k, and guesses x_{t+2+k}, whose teacher distribution is the cache's entry at t+1+k. In
step k the query at t attends to step 0's keys at positions <= t (the verified context, as the decoder's draft
cache holds it) and to steps 1..k's keys at t itself (the draft path that leads to it, as the decoder's
tree rows do), so the draft trains on exactly the inputs and visibility it decodes with. The loss is the
soft cross-entropy to the teacher renormalised on the draft vocabulary (train.top1_share of it moved onto the
teacher's most likely token), step k weighted by alpha^(k+1). The base's hidden states come from
trainer/features.py, computed in the teacher's dtype.

With train.parallel_draft, steps 1 .. D-1 read the draft's prompt tokens instead (models/eagle3.py PARALLEL): step k's
input is the k-th trained pair (an embedding, a hidden state that is also its residual) at every position, with the
same visibility and rotary positions, so one draft forward of the root's row and P prompt-token rows guesses what the
unrolled steps guess. They train at train.lr x train.prompt_lr_scale; with train.freeze_draft nothing else trains.
"""

import math
import random
from collections import defaultdict
from dataclasses import dataclass

import torch
from torch import nn

from ppdkit.data_pipeline.teacher_cache import ShardSequence
from ppdkit.models.draft_heads import inverse_index
from ppdkit.runtime.forward.llama import rotate  # x [B, heads, T, D], cos/sin [T, D]
from ppdkit.models.eagle3 import (PARALLEL, Eagle3Draft, aux_layers, expected_shapes, layer_input, layer_output,
                                  parallel_shapes, readout)

from .autocast_probe import use_autocast
from .evaluate import TOPS, by_distance
from .features import FeatureCache
from .losses import on_draft_vocab, soft_cross_entropy, topk_hits, with_top1_share
from .warm_start import draft_vocabulary
from .training_methods import cosine
from .training_run import TrainingRun

# the config keys a run records as its hyperparameters; beside them, the precision it trained in (auto resolved)
HYPERPARAMETERS = ("head_depth", "draft_vocab", "loss", "top1_share", "alpha", "lr", "epochs", "seed", "parallel_draft",
                   "freeze_draft")
KEEP_FEATURE_BYTES = 2e9  # a worker's kept hidden states; past it they are computed at every visit


@dataclass
class SequenceBatch:
    ids: torch.Tensor  # [B, T + D] token ids, 0 past each sequence's end
    real: torch.Tensor  # [B, T] bool: a token of the sequence
    fused_input: torch.Tensor  # [B, T, 3H] the base's low, middle and high hidden states
    entry: torch.Tensor  # [B, T + D] the row of the teacher's entry at each position in topk_*, -1 where none
    topk_ids: torch.Tensor  # [E, K] every entry of the batch's sequences
    topk_logprobs: torch.Tensor  # [E, K]


def unrolled_attention(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor], real: torch.Tensor
                       ) -> torch.Tensor:
    """Step k's attention: q [B, Hq, T, D]; keys/values [B, Hkv, T, D] of steps 0..k; real [B, T] -> [B, T, Hq D].
    Query t sees step 0's keys at 0..t (of real tokens) and step s's key at t itself for s = 1..k."""
    b, hq, t, d = q.shape
    group = hq // keys[0].shape[1]
    k0, v0 = keys[0].repeat_interleave(group, 1), values[0].repeat_interleave(group, 1)  # [B, Hq, T, D]
    scores = q @ k0.transpose(-1, -2) / math.sqrt(d)  # [B, Hq, T, T]
    visible = torch.ones(t, t, dtype=torch.bool, device=real.device).tril() & real[:, None, None, :]  # [B, 1, T, T]
    scores = scores.masked_fill(~visible, -math.inf)
    own = [(q * k.repeat_interleave(group, 1)).sum(-1, keepdim=True) / math.sqrt(d) for k in keys[1:]]  # [B,Hq,T,1]
    weights = torch.cat([scores, *own], dim=-1).softmax(-1)  # [B, Hq, T, T + k]
    out = weights[..., :t] @ v0
    for s, v in enumerate(values[1:]):
        out = out + weights[..., t + s:t + s + 1] * v.repeat_interleave(group, 1)
    return out.transpose(1, 2).reshape(b, t, hq * d)


class Eagle3Run(TrainingRun):
    DRAFT_VOCAB_ROWS = ("lm_head.weight",)  # a tensor [V', ...] by draft token: warm_start grows it with the vocabulary
    FRESH = PARALLEL  # tensors a train.init_from component may lack: a sequential draft gets its prompt tokens here

    def __init__(self, method, cfg, base, train_sequences: list[ShardSequence], init=None):
        super().__init__(method, cfg, base)
        self.distances = cfg.head_depth  # the training-time test's steps: distances 1 .. D after the root
        config = base.model.config
        self.embed = base.model.get_input_embeddings().weight.detach().float()  # [V, H], frozen
        vocab_size = self.embed.shape[0]
        vocab = draft_vocabulary(cfg, train_sequences, vocab_size, init)  # [V']
        self.device = self.embed.device  # the base's: a GPU trains there (the module follows: .to(run.device))
        self.vocab_index = inverse_index(vocab, vocab_size).to(self.device)
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.eps, self.layers = config.rms_norm_eps, aux_layers(config.num_hidden_layers)
        shapes = expected_shapes(config, len(vocab))
        self.parallel = cfg.parallel_draft
        if self.parallel:
            shapes |= parallel_shapes(config, cfg.head_depth)
        lm_head = base.model.get_output_embeddings().weight.detach()[vocab]
        self.module = Eagle3Draft(shapes, lm_head, cfg.seed)
        if cfg.freeze_draft:  # the prompt tokens alone train
            for name, weight in self.module().items():
                weight.requires_grad_(name in PARALLEL)
        self.module.register_buffer("draft_vocab", vocab)  # saved with every checkpoint and exported
        self.features = FeatureCache(base.model, self.layers, KEEP_FEATURE_BYTES)
        self.autocast = use_autocast(cfg.precision, self.embed.device)  # train.precision, auto resolved here
        positions = torch.arange(config.max_position_embeddings, device=self.device)[None]
        cos, sin = base.model.model.rotary_emb(torch.zeros(1, device=self.device), positions)  # base's rope [1, P, D]
        self.cos, self.sin = cos[0].float(), sin[0].float()

    def param_groups(self, total_steps: int):
        """One group on the cosine schedule; with prompt tokens, theirs at train.prompt_lr_scale x the lr, and the
        draft's beside them unless train.freeze_draft holds it."""
        if not self.parallel:
            return super().param_groups(total_steps)
        weights, scale = self.module(), self.cfg.prompt_lr_scale
        groups, factors = [{"params": [weights[name] for name in PARALLEL]}], [lambda s: scale * cosine(s, total_steps)]
        if not self.cfg.freeze_draft:
            groups.append({"params": [w for name, w in weights.items() if name not in PARALLEL]})
            factors.append(lambda s: cosine(s, total_steps))
        return groups, factors

    def lr_metrics(self, lrs: list[float]) -> dict[str, float]:
        if not self.parallel:
            return super().lr_metrics(lrs)
        return {"train.lr_prompt_tokens": lrs[0], **({"train.lr": lrs[1]} if len(lrs) > 1 else {})}

    def batch(self, sequences: list[ShardSequence], split: str) -> SequenceBatch:
        depth, longest = self.cfg.head_depth, max(len(s.input_ids) for s in sequences)
        b = len(sequences)
        ids = torch.zeros(b, longest + depth, dtype=torch.long)
        entry = torch.full((b, longest + depth), -1, dtype=torch.long)
        real = torch.zeros(b, longest, dtype=torch.bool)
        fused = torch.zeros(b, longest, 3 * self.embed.shape[1], device=self.device)
        first = 0
        for row, seq in enumerate(sequences):
            n = len(seq.input_ids)
            ids[row, :n], real[row, :n] = seq.input_ids, True
            fused[row, :n] = self.features(seq, split)
            entry[row, seq.positions] = torch.arange(first, first + len(seq.positions))
            first += len(seq.positions)
        on = self.device
        return SequenceBatch(ids.to(on), real.to(on), fused, entry.to(on),
                             torch.cat([s.topk_ids.to(on) for s in sequences]),
                             torch.cat([s.topk_logprobs.to(on) for s in sequences]))

    def unroll(self, w: dict[str, torch.Tensor], batch: SequenceBatch) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The training-time test: per step k, (log-probabilities [N_k, V'] at the positions whose target has a
        teacher entry, those entries' rows [N_k])."""
        # bf16-autocast: the matmuls of training in bfloat16 (evaluation, like decoding, stays in float32)
        with torch.autocast(self.embed.device.type, torch.bfloat16, enabled=self.autocast and torch.is_grad_enabled()):
            return self._unroll(w, batch)

    def _unroll(self, w: dict[str, torch.Tensor], batch: SequenceBatch) -> list[tuple[torch.Tensor, torch.Tensor]]:
        t = batch.real.shape[1]
        hidden = nn.functional.linear(batch.fused_input, w["fc.weight"])  # [B, T, H] g
        kv, out = defaultdict(lambda: ([], [])), []  # a layer's prefix -> its keys and values of steps 0..k
        for k in range(self.cfg.head_depth):
            if k and self.parallel:  # the k-th prompt-token pair at every position, in place of a guess and its state
                embeds = w["parallel.embeds"][k - 1].expand_as(hidden)  # [B, T, H]
                hidden = w["parallel.hidden"][k - 1].expand_as(hidden)
            else:
                embeds = self.embed[batch.ids[:, 1 + k:1 + k + t]]  # [B, T, H]
            x = layer_input(embeds, hidden, w, self.eps)  # [B, T, 2H]
            cos, sin = self.cos[k:k + t], self.sin[k:k + t]  # rotary position t + k
            hidden = self._draft_step(w, x, hidden, kv, cos, sin, batch.real)  # [B, T, H] h: the next step's input
            target = batch.entry[:, 1 + k:1 + k + t]  # [B, T] the teacher's entry for token t + 2 + k
            chosen = (target >= 0) & batch.real
            logp = torch.log_softmax(readout(hidden[chosen], w, self.eps).float(), dim=-1)  # [N_k, V']
            out.append((logp, target[chosen]))
        return out

    def _draft_step(self, w, x: torch.Tensor, hidden: torch.Tensor, kv, cos, sin, real) -> torch.Tensor:
        """The draft's layer at one step of the training-time test: x [B, T, 2H], hidden [B, T, H] the residual
        -> h [B, T, H]. kv holds each layer's keys and values of the earlier steps, by tensor-name prefix."""
        attended = self._attended(w, x, "midlayer.", kv["midlayer."], cos, sin, real)
        return layer_output(attended, hidden, w, self.eps)

    def _attended(self, w, x: torch.Tensor, prefix: str, kv: tuple[list, list], cos, sin, real) -> torch.Tensor:
        """The attention heads [B, T, Q] of the layer whose tensors start with `prefix` at step len(keys): its
        key and value [B, Hkv, T, D] of x [B, T, in] appended to kv = (keys, values) first."""
        b, t = real.shape
        keys, values = kv
        q = nn.functional.linear(x, w[prefix + "self_attn.q_proj.weight"]).view(b, t, self.heads, -1)
        key = nn.functional.linear(x, w[prefix + "self_attn.k_proj.weight"]).view(b, t, self.kv_heads, -1)
        value = nn.functional.linear(x, w[prefix + "self_attn.v_proj.weight"]).view(b, t, self.kv_heads, -1)
        keys.append(rotate(key.transpose(1, 2), cos, sin))
        values.append(value.transpose(1, 2))
        return unrolled_attention(rotate(q.transpose(1, 2), cos, sin), keys, values, real)

    def _targets(self, batch: SequenceBatch, rows: torch.Tensor, top1_share: float):
        """The teacher's entries `rows` on the draft vocabulary: (index [N, 1, K], the target's probabilities
        [N, 1, K] with top1_share of it on the teacher's top-1, valid [N, 1], the teacher's most likely token's draft
        index [N, 1])."""
        ids = batch.topk_ids[rows]
        index, probs, valid = on_draft_vocab(self.vocab_index, ids, batch.topk_logprobs[rows])
        return index, with_top1_share(index, probs, top1_share), valid, self.vocab_index[ids[:, :1].long()]

    def _per_step(self, w, batch: SequenceBatch, top1_share: float = 0.0):
        """Per step: (soft cross-entropy [N_k] to the target, valid [N_k], logp [N_k, V'], teacher top-1 [N_k])."""
        steps = []
        for logp, rows in self.unroll(w, batch):
            index, probs, valid, top1 = self._targets(batch, rows, top1_share)
            steps.append((soft_cross_entropy(logp[:, None], index, probs)[:, 0], valid[:, 0], logp, top1[:, 0]))
        return steps

    def loss(self, engine, sequences, rng: random.Random, step: int) -> tuple[torch.Tensor, int]:
        steps = self._per_step(engine(), self.batch(sequences, "train"), self.cfg.top1_share)
        # decay_mean over [N, D] wants one row per path: each step's mean, then the decayed mean over steps
        weights = self.cfg.alpha ** torch.arange(1, len(steps) + 1, dtype=torch.float32, device=self.device)
        means = torch.stack([(ce * valid).sum() / valid.sum().clamp_min(1) for ce, valid, _, _ in steps])
        return (means * weights).mean(), int(steps[0][1].sum())

    def evaluate(self, engine, holdout, step: int) -> dict[str, float]:
        """Top-1/5/10 agreement with the teacher's most likely token at distances 1 .. D (the training-time
        test's steps, each on the draft's own earlier outputs), the loss by distance (to the teacher's distribution,
        whatever train.top1_share trains on, so that runs compare)."""
        d = self.cfg.head_depth
        on = self.device  # the sums stay where the positions are scored (a GPU's), read once at the end
        hits, loss_sum, count = {top: torch.zeros(d, device=on) for top in TOPS}, torch.zeros(d, device=on), \
            torch.zeros(d, device=on)
        with torch.no_grad():
            w = engine()
            for i in range(0, len(holdout), self.cfg.micro_batch):
                for k, (ce, valid, logp, top1) in enumerate(self._per_step(w, self.batch(
                        holdout[i:i + self.cfg.micro_batch], "holdout"))):
                    for top, hit in topk_hits(logp[:, None], top1[:, None], TOPS).items():
                        hits[top][k] += (hit[:, 0] & valid).sum()
                    loss_sum[k] += (ce * valid).sum()
                    count[k] += valid.sum()
        return by_distance(hits, {"loss": loss_sum}, count)

    def export_tensors(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"draft_vocab": state["draft_vocab"],
                **{key[len("weights."):].replace("__", "."): v for key, v in state.items()
                   if key.startswith("weights.")}}

    def hyperparameters(self) -> dict:
        return {"head_kind": "eagle3", "aux_layers": list(self.layers),
                **{key: getattr(self.cfg, key) for key in HYPERPARAMETERS},
                "precision": "bf16-autocast" if self.autocast else "fp32"}  # what this run trained in (auto resolved)
