"""The student forward: the frozen base model reading a multi-insertion batch with the prompt tokens in it."""

import torch

from ppdkit.models.decoding_head import apply_residual_head
from ppdkit.models.hf_cache import cache_kwargs, new_cache
from ppdkit.models.prompt_tokens import aggregate_epts

from .prompt_batch import TrainBatch


def student_logprobs(base_model, embeddings: torch.Tensor, ept_weights: torch.Tensor | None, k: int, n: int,
                     batch: TrainBatch, head: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Log-probabilities of every group's prompt tokens: [B, G, k, V].

    embeddings [k*n, H] (trainable), ept_weights [k, n] or None, head: a custom decoding head's (weight
    [H, H], bias [H]) or None; the base model stays frozen, but the gradient flows through it to the embeddings.
    """
    return student_forward(base_model, embeddings, ept_weights, k, n, batch, head)[0]


def student_forward(base_model, embeddings: torch.Tensor, ept_weights: torch.Tensor | None, k: int, n: int,
                    batch: TrainBatch, head: tuple[torch.Tensor, torch.Tensor] | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(group log-probabilities [B, G, k, V], final hidden states of the ordinary tokens [B, T, H]).

    Two passes over one attention layout: the ordinary tokens first, without autograd (they never see
    a prompt token, so no gradient can flow through them), then the groups on their key/value cache.
    The backward pass thus covers the G*k*n group tokens, not the whole sequence.
    """
    t = batch.ordinary_len
    decoder = base_model.get_decoder()
    tokens = base_model.get_input_embeddings()(batch.input_ids)  # [B, L, H]
    mask = batch.mask(tokens.dtype)  # [B, 1, L, L]
    cache = cache_kwargs(decoder, new_cache(base_model))  # ours: filled by the prefix pass, read by the groups'
    with torch.no_grad():
        prefix = decoder(inputs_embeds=tokens[:, :t], attention_mask=mask[:, :, :t, :t],
                         position_ids=batch.position_ids[:, :t], use_cache=True, **cache)  # hidden [B, T, H]
    slots = batch.ept_slot[:, t:]  # [B, L-T]
    epts = embeddings.to(tokens.device, tokens.dtype)[slots.clamp_min(0)]  # [B, L-T, H]
    x = torch.where((slots >= 0)[..., None], epts, tokens[:, t:])  # [B, L-T, H]
    groups = decoder(inputs_embeds=x, attention_mask=mask[:, :, t:, :], position_ids=batch.position_ids[:, t:],
                     use_cache=True, **cache).last_hidden_state  # [B, L-T, H]
    rows = torch.arange(groups.shape[0], device=groups.device)[:, None, None]
    # a sequence with fewer groups than the batch pads with slot 0: clamped here, masked by group_valid later
    per_ept = groups[rows, (batch.group_slots - t).clamp_min(0)]  # [B, G, k*n, H]
    per_token = aggregate_epts(per_ept, k, n, None if ept_weights is None else ept_weights.to(per_ept.device))
    if head is not None:  # the custom decoding head reads the prompt tokens' states; ordinary tokens never
        per_token = apply_residual_head(per_token, *(part.to(per_token.device) for part in head))  # [B, G, k, H]
    logits = base_model.get_output_embeddings()(per_token)  # [B, G, k, V]
    return torch.log_softmax(logits.float(), dim=-1), prefix.last_hidden_state
