"""EAGLE-3's draft (papers/ README: EAGLE-3, Li et al. 2025): one decoder layer over a fusion of three of the frozen
base model's hidden states, read out over a reduced draft vocabulary.

At a verified position t the base model's hidden states after layers `low, mid, high` (Hugging Face's
hidden_states[k]: the residual stream after k decoder layers; by default 2, L/2 and L-3, what vLLM and
SpecForge use) are fused, g_t = fc [a_low; a_mid; a_high] [H]. The draft's layer reads
    x = [RMSNorm_in(e(x_{t+1})); RMSNorm_hidden(g_t)]   [2H]  (the next token's embedding, the base's own)
    u = g_t + o(attention(q(x), k(x), v(x)))             (rotary at position t, over the draft's own cache)
    h = u + down(SiLU(gate(RMSNorm_post(u))) * up(RMSNorm_post(u)))
h is the state the next draft step reads in place of g (the training-time test: the draft learns to run on its
own outputs), and lm_head(RMSNorm_out(h)) guesses token t+2 among the draft vocabulary. `norm_before_residual`
is False: the residual is g itself, not its norm (vLLM's default for this layout; the export says so).

The tensor names are those of the Hugging Face EAGLE-3 layout that vLLM loads (LlamaForCausalLMEagle3), so an
export renames nothing; the draft vocabulary's token ids are `draft_vocab` [V'] (the export turns them into
vLLM's d2t offsets and SGLang's t2d mask).

Prompt tokens for the draft (PPD thesis 6.4, the synergy; P-EAGLE's parallel drafting in vLLM's speculators): a draft
may carry `parallel.embeds` and `parallel.hidden` [P, H], one trained pair per depth 2 .. P + 1. Drafting then reads,
after the root's row at position t, P more rows at t + 1 .. t + P whose inputs are those pairs (in place of a guessed
token's embedding and its parent's h), causal among themselves: one draft forward guesses every depth, each row's
readout a distribution for its depth given the verified text alone, where the training-time test's rows read the
draft's own guesses one forward a depth. Exports for vLLM and llama.cpp leave them out (they draft sequentially).
"""

import torch
from torch import nn

from .draft_heads import apply_linear

# name: (rows, columns) in terms of H (hidden), Q (query heads x head dim), K (key/value heads x head dim),
# I (MLP width), V (draft vocabulary)
SHAPES = {
    "fc.weight": ("H", "3H"),
    "midlayer.hidden_norm.weight": ("H",),
    "midlayer.input_layernorm.weight": ("H",),
    "midlayer.self_attn.q_proj.weight": ("Q", "2H"),
    "midlayer.self_attn.k_proj.weight": ("K", "2H"),
    "midlayer.self_attn.v_proj.weight": ("K", "2H"),
    "midlayer.self_attn.o_proj.weight": ("H", "Q"),
    "midlayer.post_attention_layernorm.weight": ("H",),
    "midlayer.mlp.gate_proj.weight": ("I", "H"),
    "midlayer.mlp.up_proj.weight": ("I", "H"),
    "midlayer.mlp.down_proj.weight": ("H", "I"),
    "norm.weight": ("H",),
    "lm_head.weight": ("V", "H"),
}
TENSORS = tuple(SHAPES)
PARALLEL = ("parallel.embeds", "parallel.hidden")  # [P, H] each: the draft's prompt tokens, depth 2 .. P + 1


def aux_layers(num_layers: int) -> tuple[int, int, int]:
    """The default low, middle and high hidden states (hidden_states indices), as vLLM and SpecForge pick them
    (2, 15, 27 for 30 layers); kept within 1 .. L-1 for models of a few layers (tests' tiny ones): transformers'
    hidden_states[L] is after the final norm, not the residual stream the decoder reads."""
    return tuple(min(max(k, 1), num_layers - 1) for k in (2, num_layers // 2, num_layers - 3))


def head_dim(config) -> int:
    """A Hugging Face Llama-family config's attention head size."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def expected_shapes(config, vocab: int) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape for a base model of this Hugging Face config and a draft vocabulary of `vocab` ids."""
    hidden, d = config.hidden_size, head_dim(config)
    sizes = {"H": hidden, "3H": 3 * hidden, "2H": 2 * hidden, "Q": config.num_attention_heads * d,
             "K": config.num_key_value_heads * d, "I": config.intermediate_size, "V": vocab}
    return {name: tuple(sizes[dim] for dim in dims) for name, dims in SHAPES.items()}


def parallel_shapes(config, depths: int) -> dict[str, tuple[int, int]]:
    """The prompt tokens' shapes for a draft that guesses `depths` depths in one forward (P = depths - 1 pairs)."""
    return {name: (depths - 1, config.hidden_size) for name in PARALLEL}


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in float32 whatever x's dtype, as transformers and the lean runtime do."""
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def layer_input(embeds: torch.Tensor, hidden: torch.Tensor, w: dict, eps: float) -> torch.Tensor:
    """embeds [..., H] (the next tokens' embeddings), hidden [..., H] (g or the previous step's h) -> the
    attention's input [..., 2H]."""
    return torch.cat([rms_norm(embeds, w["midlayer.input_layernorm.weight"], eps),
                      rms_norm(hidden, w["midlayer.hidden_norm.weight"], eps)], dim=-1)


def layer_output(attended: torch.Tensor, hidden: torch.Tensor, w: dict, eps: float) -> torch.Tensor:
    """attended [..., Q] (the attention's heads, concatenated), hidden [..., H] the residual -> h [..., H]. The
    matrices of `w` may be tensors (training) or the runtime's layers (decoding)."""
    u = hidden + apply_linear(attended, w["midlayer.self_attn.o_proj.weight"])
    x = rms_norm(u, w["midlayer.post_attention_layernorm.weight"], eps)
    gate, up = apply_linear(x, w["midlayer.mlp.gate_proj.weight"]), apply_linear(x, w["midlayer.mlp.up_proj.weight"])
    return u + apply_linear(nn.functional.silu(gate) * up, w["midlayer.mlp.down_proj.weight"])


def readout(h: torch.Tensor, w: dict, eps: float) -> torch.Tensor:
    """h [..., H] -> draft-vocabulary logits [..., V']."""
    return apply_linear(rms_norm(h, w["norm.weight"], eps), w["lm_head.weight"])


class Eagle3Draft(nn.Module):
    """The trainable draft: every tensor of SHAPES (the embeddings stay the base model's, frozen). The LM head
    starts as the base's own rows of the draft vocabulary, the matrices as Hugging Face initialises them (normal,
    std 0.02), the norms at 1. Measured on SmolLM2, held-out top-1 after 50 steps: 0.15; 0.12 with the base's
    final norm weights in the readout's norm, with or without starting as the base's logit lens at the high
    layer (fc = [0 0 I], zero output projections)."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], lm_head_rows: torch.Tensor, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        start = {"lm_head.weight": lm_head_rows.detach().float().clone()}
        self.weights = nn.ParameterDict()
        for name, shape in shapes.items():
            if name in start:
                value = start[name]
            elif len(shape) == 1:
                value = torch.ones(shape)
            else:
                value = torch.randn(shape, generator=gen) * 0.02
            self.weights[name.replace(".", "__")] = nn.Parameter(value)  # ParameterDict keys hold no dots

    def forward(self) -> dict[str, torch.Tensor]:
        """Every tensor by its SHAPES name (an engine that gathers partitioned parameters around forward sees
        whole tensors)."""
        return {key.replace("__", "."): value for key, value in self.weights.items()}
