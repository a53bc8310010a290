"""A lean forward for Llama-family models, batch 1, on a preallocated KV cache with arbitrary masks.

The weights are taken from a Hugging Face model (fused: one QKV and one gate/up matmul per layer),
the rotary tables are computed once by the model's own rotary module, and attention is one SDPA call
per layer with a boolean mask, so a token tree (any 4-D visibility pattern) costs the same code as a
single token. No Ray, DeepSpeed or MLflow is imported anywhere in runtime/.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .kv_cache import KVCache


@dataclass
class _Layer:
    ln1: torch.Tensor  # [H]
    wqkv: torch.Tensor  # [(Hq + 2 Hkv) D, H]
    wo: torch.Tensor  # [H, Hq D]
    ln2: torch.Tensor  # [H]
    w_gate_up: torch.Tensor  # [2 I, H]
    w_down: torch.Tensor  # [H, I]


class LeanLlama:
    def __init__(self, hf_model, max_positions: int = 4096):
        cfg = hf_model.config
        if getattr(cfg, "model_type", "llama") not in ("llama", "mistral", "qwen2"):
            raise ValueError(f"the lean runtime supports Llama-family models, not {cfg.model_type!r}")
        sd = {k: v.detach() for k, v in hf_model.state_dict().items()}
        self.dtype = next(hf_model.parameters()).dtype
        self.hidden = cfg.hidden_size
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eps = cfg.rms_norm_eps
        self.vocab_size = cfg.vocab_size
        self.eos_token_id = cfg.eos_token_id
        p = "model.layers.{}."
        self.layers = [
            _Layer(
                ln1=sd[p.format(i) + "input_layernorm.weight"],
                wqkv=torch.cat([sd[p.format(i) + f"self_attn.{x}_proj.weight"] for x in "qkv"]).contiguous(),
                wo=sd[p.format(i) + "self_attn.o_proj.weight"],
                ln2=sd[p.format(i) + "post_attention_layernorm.weight"],
                w_gate_up=torch.cat([sd[p.format(i) + "mlp.gate_proj.weight"],
                                     sd[p.format(i) + "mlp.up_proj.weight"]]).contiguous(),
                w_down=sd[p.format(i) + "mlp.down_proj.weight"],
            )
            for i in range(cfg.num_hidden_layers)
        ]
        if any(k.endswith("_proj.bias") for k in sd):
            raise ValueError("the lean runtime does not support attention or MLP biases")
        self.embed = sd["model.embed_tokens.weight"]
        self.norm = sd["model.norm.weight"]
        self.head = sd.get("lm_head.weight", self.embed)  # tied embeddings share one matrix
        positions = torch.arange(max_positions)[None]
        probe = torch.zeros(1, dtype=self.dtype)
        cos, sin = hf_model.model.rotary_emb(probe, positions)  # the model's own rope (any scaling type)
        self.cos, self.sin = cos[0].to(self.dtype), sin[0].to(self.dtype)  # [P, D]
        self.max_positions = max_positions

    def new_cache(self, capacity: int) -> KVCache:
        return KVCache(len(self.layers), self.kv_heads, self.head_dim, capacity, self.dtype)

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        xf = x.float()  # in float32 whatever the dtype, as transformers does, so the outputs agree
        return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [heads, T, D] rotated by positions [T]."""
        cos, sin = self.cos[positions], self.sin[positions]  # [T, D]
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                mask: torch.Tensor | None) -> torch.Tensor:
        """x [T, H] input embeddings at `positions` [T] -> final hidden states [T, H].

        mask [T, length + T] bool (True: may attend), None for causal over cache + new tokens. The new
        keys/values are written after the committed ones; the caller commits what it keeps.
        """
        t = x.shape[0]
        if int(positions.max()) >= self.max_positions:
            raise ValueError(f"position {int(positions.max())} beyond the runtime's {self.max_positions}")
        cache.reserve(t)
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        for i, layer in enumerate(self.layers):
            h = self._rms(x, layer.ln1)
            qkv = F.linear(h, layer.wqkv)  # [T, (Hq + 2Hkv) D]
            q = qkv[:, :q_size].view(t, self.heads, self.head_dim).transpose(0, 1)  # [Hq, T, D]
            k = qkv[:, q_size:q_size + kv_size].view(t, self.kv_heads, self.head_dim).transpose(0, 1)
            v = qkv[:, q_size + kv_size:].view(t, self.kv_heads, self.head_dim).transpose(0, 1)
            q, k = self._rope(q, positions), self._rope(k, positions)
            keys, values = cache.write(i, k, v)  # [Hkv, S, D]
            if mask is None and t == 1:
                attn = F.scaled_dot_product_attention(q, keys, values, enable_gqa=True)
            else:
                m = mask if mask is not None else _causal(cache.length, t)
                attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=m, enable_gqa=True)
            x = x + F.linear(attn.transpose(0, 1).reshape(t, q_size), layer.wo)
            h = self._rms(x, layer.ln2)
            gate, up = F.linear(h, layer.w_gate_up).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, layer.w_down)
        return self._rms(x, self.norm)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[T, H] -> [T, V]."""
        return F.linear(hidden, self.head)

    def embed_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed[ids]


def _causal(length: int, t: int) -> torch.Tensor:
    """[t, length + t]: every new token sees the cache and the new tokens up to itself."""
    return torch.ones(t, length + t, dtype=torch.bool).tril(diagonal=length)
