"""The student forward: the frozen base model reading a multi-insertion batch with the prompt tokens in it."""

import torch

from ppdkit.models.prompt_tokens import aggregate_epts

from .batch import TrainBatch


def student_logprobs(base_model, embeddings: torch.Tensor, ept_weights: torch.Tensor | None, k: int, n: int,
                     batch: TrainBatch) -> torch.Tensor:
    """Log-probabilities of every group's prompt tokens: [B, G, k, V].

    embeddings [k*n, H] (trainable), ept_weights [k, n] or None; the base model stays frozen, but the
    gradient flows through it to the embeddings.
    """
    return student_forward(base_model, embeddings, ept_weights, k, n, batch)[0]


def student_forward(base_model, embeddings: torch.Tensor, ept_weights: torch.Tensor | None, k: int, n: int,
                    batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(group log-probabilities [B, G, k, V], final hidden states of every input token [B, L, H])."""
    tokens = base_model.get_input_embeddings()(batch.input_ids)  # [B, L, H]
    epts = embeddings.to(tokens.dtype)[batch.ept_slot.clamp_min(0)]  # [B, L, H]
    x = torch.where((batch.ept_slot >= 0)[..., None], epts, tokens)  # [B, L, H]
    hidden = base_model.get_decoder()(inputs_embeds=x, attention_mask=batch.mask(x.dtype),
                                      position_ids=batch.position_ids).last_hidden_state  # [B, L, H]
    rows = torch.arange(hidden.shape[0])[:, None, None]
    per_ept = hidden[rows, batch.group_slots]  # [B, G, k*n, H]
    per_token = aggregate_epts(per_ept, k, n, ept_weights)  # [B, G, k, H]
    logits = base_model.get_output_embeddings()(per_token)  # [B, G, k, V]
    return torch.log_softmax(logits.float(), dim=-1), hidden
