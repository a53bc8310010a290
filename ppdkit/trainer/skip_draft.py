"""The fine-tuned layer-skip draft's training forward (train.method skip-finetune, D&V paper appendix F): the
frozen base model with sub-layers skipped and the draft's own RMSNorm weights, reading the context the way the
runtime's draft does (runtime/drafters/layer_skip.py).

At decoding time the draft's kept attention sub-layers read the keys/values the whole model committed for
the context, plus the draft's own for the token it reads. So the training forward runs the whole model once
without autograd for every layer's keys/values, and then the draft at every position at once: position t
attends to the whole model's keys/values of positions < t and to its own at t. Each position is thus
supervised exactly as the draft's first guess after a verified token is made (later guesses of a chain also
see earlier drafted tokens' own entries, which this does not model).
"""

import torch
from torch import nn
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from ppdkit.models.hf_cache import cache_kwargs, new_cache
from ppdkit.runtime.forward.llama import SKIP_ATTENTION, SKIP_MLP


class DraftNorms(nn.Module):
    """What skip-finetune trains: the draft's RMSNorm weights, a copy of the base model's at the start.
    forward() hands them out (an engine that gathers partitioned parameters around forward sees whole tensors)."""

    def __init__(self, base_model):
        super().__init__()
        layers = base_model.get_decoder().layers
        self.ln1 = nn.Parameter(torch.stack([layer.input_layernorm.weight.detach().float() for layer in layers]))
        self.ln2 = nn.Parameter(torch.stack([layer.post_attention_layernorm.weight.detach().float()
                                             for layer in layers]))  # [L, H] each
        self.norm = nn.Parameter(base_model.get_decoder().norm.weight.detach().float().clone())  # [H]

    def forward(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.ln1, self.ln2, self.norm


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., H] -> weight * x / rms(x), in float32 as the base model computes it."""
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps))


def committed_visibility(t: int, device: torch.device | None = None) -> torch.Tensor:
    """[T, 2T] bool: row t sees the committed keys of positions < t (first T columns) and its own (column T + t)."""
    rows = torch.arange(t, device=device)[:, None]
    cols = torch.arange(t, device=device)[None]
    return torch.cat([cols < rows, cols == rows], dim=1)


def draft_states(base_model, input_ids: torch.Tensor, skip: tuple[int, ...],
                 norms: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """input_ids [B, T] (right-padded: causal attention never lets a token see the padding) -> the draft's final
    hidden states [B, T, H] after its final norm; norms (ln1 [L, H], ln2 [L, H], norm [H]) carry the gradient."""
    decoder, eps = base_model.get_decoder(), base_model.config.rms_norm_eps
    ln1, ln2, norm = norms
    committed = new_cache(base_model)  # filled in place by the forward: every layer's keys/values [B, Hkv, T, D]
    with torch.no_grad():
        decoder(input_ids=input_ids, use_cache=True, **cache_kwargs(decoder, committed))
    x = decoder.embed_tokens(input_ids).float()  # [B, T, H]
    cos, sin = decoder.rotary_emb(x, torch.arange(input_ids.shape[1], device=x.device)[None])  # [1, T, D]
    visible = committed_visibility(input_ids.shape[1], x.device)
    for i, layer in enumerate(decoder.layers):
        if not skip[i] & SKIP_ATTENTION:
            keys, values = committed.layers[i].keys, committed.layers[i].values
            x = x + _attention(layer.self_attn, rms_norm(x, ln1[i], eps), cos, sin, keys, values, visible)
        if not skip[i] & SKIP_MLP:
            x = x + layer.mlp(rms_norm(x, ln2[i], eps))
    return rms_norm(x, norm, eps)


def _attention(attn, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
               visible: torch.Tensor) -> torch.Tensor:
    """One attention sub-layer of the draft: h [B, T, H] normed -> its output [B, T, H]; keys/values [B, Hkv, T, D]
    the whole model's (rotated), visible [T, 2T]."""
    b, t, _ = h.shape
    d = attn.head_dim
    q = attn.q_proj(h).view(b, t, -1, d).transpose(1, 2)  # [B, Hq, T, D]
    k = attn.k_proj(h).view(b, t, -1, d).transpose(1, 2)  # [B, Hkv, T, D]
    v = attn.v_proj(h).view(b, t, -1, d).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    out = nn.functional.scaled_dot_product_attention(
        q, torch.cat([keys.to(k.dtype), k], dim=2), torch.cat([values.to(v.dtype), v], dim=2), attn_mask=visible,
        enable_gqa=True)  # [B, Hq, T, D]
    return attn.o_proj(out.transpose(1, 2).reshape(b, t, -1))
