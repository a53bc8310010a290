"""Losses for prompt tokens against the compressed teacher (top-k log-probs + the rest's mass)."""

import torch

# Shapes: N insertion groups, k token distances, V vocabulary, K teacher top-k.


def kl_to_compressed_teacher(student_logp: torch.Tensor, teacher_ids: torch.Tensor, teacher_logp: torch.Tensor,
                             teacher_rest: torch.Tensor) -> torch.Tensor:
    """KL(teacher || student) per (group, distance): [N, k].

    student_logp [N, k, V]; teacher_ids, teacher_logp [N, k, K]; teacher_rest [N, k]. The tokens outside
    the teacher's top-k form one bucket on both sides, so this is the exact KL between the two
    distributions over (top-k tokens, everything else).
    """
    q_top = student_logp.gather(-1, teacher_ids)  # [N, k, K]
    kl_top = (teacher_logp.exp() * (teacher_logp - q_top)).sum(-1)  # [N, k]
    q_rest = (1.0 - q_top.exp().sum(-1)).clamp_min(1e-12)  # [N, k]
    rest = teacher_rest.clamp_min(0.0)
    kl_rest = torch.where(rest > 0, rest * (rest.clamp_min(1e-30).log() - q_rest.log()), torch.zeros_like(rest))
    return kl_top + kl_rest


def hard_label_ce(student_logp: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy against the actual next tokens (the no-distillation ablation): [N, k]."""
    return -student_logp.gather(-1, targets[..., None]).squeeze(-1)


def decay_mean(per_distance: torch.Tensor, valid: torch.Tensor, alpha: float) -> torch.Tensor:
    """mean over distance i of (mean over valid groups of loss_i) * alpha^i; per_distance, valid: [N, k]."""
    k = per_distance.shape[-1]
    weights = alpha ** torch.arange(1, k + 1, dtype=per_distance.dtype, device=per_distance.device)  # [k]
    valid = valid.to(per_distance.dtype)
    per_i = (per_distance * valid).sum(0) / valid.sum(0).clamp_min(1.0)  # [k]
    return (per_i * weights).mean()


def topk_hits(student_logp: torch.Tensor, target: torch.Tensor, ks: tuple[int, ...] = (1, 5, 10)) -> dict[int, torch.Tensor]:
    """{k: [N, k_dist] bool}: is `target` [N, k_dist] among the student's top-k at each distance."""
    ranked = student_logp.topk(max(ks), dim=-1).indices  # [N, k_dist, max(ks)]
    hit = ranked == target[..., None]
    return {k: hit[..., :k].any(-1) for k in ks}


def prompt_token_loss(logp: torch.Tensor, batch, loss: str, alpha: float) -> torch.Tensor:
    """The training objective of a batch: logp [B, G, k, V] -> scalar (kd: decayed KL; ce: decayed hard labels)."""
    logp = logp.flatten(0, 1)  # [N, k, V]
    if loss == "kd":
        per = kl_to_compressed_teacher(logp, batch.teacher_ids.flatten(0, 1), batch.teacher_logp.flatten(0, 1),
                                       batch.teacher_rest.flatten(0, 1))
    else:
        per = hard_label_ce(logp, batch.next_tokens.flatten(0, 1))
    return decay_mean(per, batch.target_valid.flatten(0, 1), alpha)


def soft_cross_entropy(logp: torch.Tensor, index: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """-sum_i p_i log q_i over the teacher's top-K: logp [N, D, V'] (the draft vocabulary), index [N, D, K]
    (-1: outside it, probability 0), probs [N, D, K] -> [N, D]. The KL to the teacher renormalised on the
    draft vocabulary, up to the teacher's entropy (a constant)."""
    return -(probs * logp.gather(-1, index.clamp_min(0))).sum(-1)


def on_draft_vocab(vocab_index: torch.Tensor, topk_ids: torch.Tensor, topk_logprobs: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The teacher's top-K at N positions (ids, log-probs [N, K]) on a draft vocabulary (vocab_index [V]: a
    token's index there, -1 outside): (index [N, 1, K], probabilities renormalised on the draft vocabulary
    [N, 1, K], valid [N, 1]: some of the teacher's mass falls inside)."""
    index = vocab_index[topk_ids.long()][:, None]
    probs = torch.where(index >= 0, topk_logprobs.float().exp()[:, None], torch.zeros(()))
    kept = probs.sum(-1)  # [N, 1]
    return index, probs / kept.clamp_min(1e-12)[..., None], kept > 0


def with_top1_share(index: torch.Tensor, probs: torch.Tensor, share: float) -> torch.Tensor:
    """The target (1 - share) x the teacher's distribution + share x its most likely token: index, probs [N, D, K]
    (on_draft_vocab's, the teacher's top-K in its order, so column 0 is its top-1) -> probs [N, D, K]. Greedy
    decoding keeps a guess only where it is the base's top-1, which the distribution alone weighs by its probability.
    Where the top-1 lies outside the draft vocabulary the distribution is kept as it is."""
    if share == 0.0:
        return probs
    top1 = torch.zeros_like(probs)
    top1[..., 0] = 1.0
    mixed = (1.0 - share) * probs + share * top1
    return torch.where(index[..., :1] >= 0, mixed, probs)
