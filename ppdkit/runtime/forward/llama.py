"""A lean forward for Llama-family models, batch 1, on a preallocated KV cache with arbitrary masks.

The weights are taken from a Hugging Face model, fused (one QKV and one gate/up matmul per layer) and packed
for the native few-rows matmul, or for oneDNN where that cannot be built (runtime/forward/linear.py): reading the
weights is most of a decoding step's cost, and Python's dispatch of ~40 small operations per layer most of the
rest, so with the native kernels a step of up to 96 tokens runs every layer in one call
(runtime/kernels/decoder_layers.cpp), and a longer prompt one such call per block of 96 (native_blocks); models
the kernels do not take run the PyTorch layers below, the same arithmetic; off the CPU they run every step in one
fixed shape (fix_shapes, runtime/forward/fixed_shapes.py), so that library kernels give a row the same numbers in any
step. bfloat16 weights (runtime/forward/precision.py) keep everything else in float32. Everything that depends only on
the positions and the mask (rotary tables, the additive attention bias) is computed once per forward, not once per
layer, and grouped-query attention multiplies each key/value head by its group of query heads directly instead of
repeating keys and values. A token tree (any visibility pattern) costs the same code as a single token. No Ray, DeepSpeed or MLflow is imported anywhere in runtime/.
"""

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from ppdkit.models.loading import check_model_type

from . import fixed_shapes
from .causal_attention import causal_attention
from .dtypes import GGUF
from .gguf_blocks import QuantizedWeight, concat_rows
from .kv_cache import KVCache, cache_width
from .linear import SKINNY_MAX_ROWS, Linear
from .precision import activation_dtype, dtype_name


@dataclass
class _Layer:
    ln1: torch.Tensor  # [H]
    qkv: Linear  # H -> (Hq + 2 Hkv) D
    o: Linear  # Hq D -> H
    ln2: torch.Tensor  # [H]
    gate_up: Linear  # H -> 2 I
    down: Linear  # I -> H
    qkv_bias: torch.Tensor | None = None  # [(Hq + 2 Hkv) D]: Qwen2's query/key/value biases


# a layer's sub-layers a layer-skip draft leaves out (forward's `skip`, one bit mask per layer)
SKIP_ATTENTION, SKIP_MLP = 1, 2


class LeanLlama:
    def __init__(self, hf_model, max_positions: int = 4096, pack: bool = True,
                 quantized: dict[str, QuantizedWeight] | None = None, weight_format: str = GGUF):
        """The weights stay on the device `hf_model` is on (Decoder moves it there): on a CPU they are packed
        for the native kernels, on any other device the PyTorch layers run on them as they are. `quantized`: the
        matmuls' weights as a GGUF's blocks (runtime/forward/gguf_blocks.py, by Hugging Face name), multiplied as such
        (the input embeddings and norms are read from the model); `weight_format` names them (gguf: the file's own,
        q4: quantized by ppdkit)."""
        cfg = hf_model.config
        check_model_type(cfg)
        sd = {k: v.detach() for k, v in hf_model.state_dict().items()}
        self.device = next(hf_model.parameters()).device
        pack = pack and self.device.type == "cpu"  # the native kernels and oneDNN's packing are CPU code
        unsupported = sorted({k.split(".")[-2] for k in sd if k.endswith("_proj.bias")} - {"q_proj", "k_proj", "v_proj"})
        if unsupported:
            raise ValueError(f"the lean runtime supports query/key/value biases (Qwen2), not biases of {unsupported}")
        self.weight_dtype = next(hf_model.parameters()).dtype  # the matmuls' weights (runtime/forward/precision.py)
        # their format by its runtime/forward/dtypes.py name (the key of timings and reports): a dtype, or gguf's blocks
        self.weight_format = weight_format if quantized is not None else dtype_name(self.weight_dtype)
        self.dtype = activation_dtype(self.weight_dtype)  # activations, norms, rotary tables, the KV cache
        self.hidden = cfg.hidden_size
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.group = self.heads // self.kv_heads  # query heads per key/value head
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eps = cfg.rms_norm_eps
        self.vocab_size = cfg.vocab_size
        self.eos_token_id = cfg.eos_token_id
        p = "model.layers.{}."

        def weight(*names: str) -> torch.Tensor | QuantizedWeight:
            """The (fused) matmul weight of these Hugging Face weights: their GGUF blocks where given."""
            if quantized is not None:
                return concat_rows([quantized[name] for name in names])
            return torch.cat([sd[name] for name in names]) if len(names) > 1 else sd[names[0]]  # one: shared

        self.layers = [
            _Layer(
                ln1=sd[p.format(i) + "input_layernorm.weight"].to(self.dtype),
                qkv=Linear(weight(*(p.format(i) + f"self_attn.{x}_proj.weight" for x in "qkv")), pack),
                o=Linear(weight(p.format(i) + "self_attn.o_proj.weight"), pack),
                ln2=sd[p.format(i) + "post_attention_layernorm.weight"].to(self.dtype),
                gate_up=Linear(weight(p.format(i) + "mlp.gate_proj.weight", p.format(i) + "mlp.up_proj.weight"), pack),
                down=Linear(weight(p.format(i) + "mlp.down_proj.weight"), pack),
                qkv_bias=torch.cat([sd[p.format(i) + f"self_attn.{x}_proj.bias"] for x in "qkv"]).to(self.dtype)
                if p.format(i) + "self_attn.q_proj.bias" in sd else None,
            )
            for i in range(cfg.num_hidden_layers)
        ]
        self.embed = sd["model.embed_tokens.weight"]  # [V, H] in the weights' dtype; embed_ids widens the rows
        self.norm = sd["model.norm.weight"].to(self.dtype)
        head = "lm_head.weight" if "lm_head.weight" in (quantized or sd) else "model.embed_tokens.weight"
        self.head = Linear(weight(head), pack)  # tied embeddings share one matrix
        positions = torch.arange(max_positions, device=self.device)[None]
        probe = torch.zeros(1, dtype=self.dtype, device=self.device)  # the tables in the activations' dtype
        cos, sin = hf_model.model.rotary_emb(probe, positions)  # the model's own rope (any scaling type)
        self.cos, self.sin = cos[0].to(self.dtype), sin[0].to(self.dtype)  # [P, D]
        self.max_positions = max_positions
        # Every matmul on the native kernel: a decoding step runs all layers in one native call
        # (runtime/kernels/decoder_layers.cpp), not ~40 Python-dispatched operations per layer.
        linears = [lin for layer in self.layers for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)]
        # (the native layers have no biases: a model with them runs its steps on the PyTorch layers below)
        biased = any(layer.qkv_bias is not None for layer in self.layers)
        self.native = linears[0].native if all(lin.native is not None for lin in linears) and not biased else None
        self.kernel = self.head.kernel  # bfloat16's native kernel (amx or avx512), one for every weight; else None
        self.native_weights = _native_weights(self.layers) if self.native else []
        self.native_shape = [self.heads, self.kv_heads, self.head_dim, cfg.intermediate_size, self.hidden]
        self.fixed_rows: int | None = None  # fix_shapes: every step this many rows, for row-invariant library kernels

    def fix_shapes(self, rows: int | None = fixed_shapes.ROWS) -> None:
        """Run every step, norm and LM head in blocks of `rows` rows over a KV cache of fixed capacity, so that a
        row's result never depends on the step it is in (runtime/forward/fixed_shapes.py): the PyTorch layers' lossless
        mode, for a GPU. None: steps of their own shapes again."""
        self.fixed_rows = rows

    def with_norms(self, ln1: torch.Tensor, ln2: torch.Tensor, norm: torch.Tensor) -> "LeanLlama":
        """This model with other RMSNorm weights, ln1 and ln2 [L, H] (before each attention and MLP) and the final
        norm [H], sharing every matmul weight and the rotary tables (nothing large is copied): a fine-tuned
        layer-skip draft (runtime/drafters/layer_skip.py)."""
        view = copy.copy(self)
        view.layers = [replace(layer, ln1=a.to(self.dtype).contiguous(), ln2=b.to(self.dtype).contiguous())
                       for layer, a, b in zip(self.layers, ln1, ln2, strict=True)]
        view.norm = norm.to(self.dtype).contiguous()
        view.native_weights = _native_weights(view.layers) if self.native else []
        return view

    def new_cache(self, capacity: int, zeroed: bool = True) -> KVCache:
        if self.fixed_rows:  # the attention's shapes include the capacity: one for every call
            fixed = fixed_shapes.capacity(self.max_positions, self.fixed_rows)
            if capacity > fixed:
                raise ValueError(f"a KV cache of {capacity} slots: fixed-shape steps have {fixed} (max_length "
                                 f"{self.max_positions}); load the decoder with a larger max_length")
            capacity = fixed
        elif self.native is not None:
            capacity = cache_width(capacity)
        return KVCache(len(self.layers), self.kv_heads, self.head_dim, capacity, self.dtype, self.device, zeroed)

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        xf = x.float()  # in float32 whatever the dtype, as transformers does, so the outputs agree
        return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                mask: torch.Tensor | None, skip: tuple[int, ...] | None = None) -> torch.Tensor:
        """x [T, H] input embeddings at `positions` [T] -> final hidden states [T, H].

        mask [T, length + T] bool (True: may attend), None for causal over cache + new tokens. The new
        keys/values are written after the committed ones; the caller commits what it keeps. `skip`: per
        layer, the sub-layers left out (bit 1 attention, bit 2 MLP; runtime/drafters/layer_skip.py's drafts).
        """
        return self.final_norm(self.forward_layers(x, positions, cache, mask, 0, len(self.layers), skip))

    def forward_sequences(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                          window: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """The rows of several sequences sharing `cache` (runtime/batching/batched_decoding.py,
        runtime/batching/batched_verify.py): x [T, H] at `positions` [T] -> final hidden states [T, H]. As
        forward_windows, through every layer."""
        return self.final_norm(self.forward_windows(x, positions, cache, window, bias, 0, len(self.layers)))

    def forward_windows(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache, window: torch.Tensor,
                        bias: torch.Tensor | None, start: int, stop: int) -> torch.Tensor:
        """Layers start .. stop - 1 on rows of several sequences sharing `cache`: x [T, H] -> the residual stream
        [T, H], no final norm. window [T, 3] int64: row r sees slots window[r, 0] .. window[r, 1] (its own
        sequence's) and writes its key/value at window[r, 2]; bias [g T, S] (attention_bias's layout, column j being
        slot window[r, 0] + j) masks a tree step's rows from each other, None: each row sees its whole window. Each
        row's arithmetic is that of its sequence's step decoded alone (native kernels only: their rows never depend
        on each other, and a row's attention sums the keys it sees in their order wherever they sit)."""
        self._check_windows(x.shape[0])
        cos, sin = self.cos[positions], self.sin[positions]  # [T, D]
        return self.native.decoder_layers(x.to(self.dtype), self.native_weights[6 * start:6 * stop],
                                          self.native_shape, self.eps, cos, sin, bias, cache.k[start:stop],
                                          cache.v[start:stop], 0, [], window)

    def _check_windows(self, rows: int) -> None:
        """Several sequences' rows in one step: only the native kernels keep each row its own step's arithmetic."""
        if self.native is None or rows > SKINNY_MAX_ROWS:
            raise ValueError("decoding several sequences in one step needs the native kernels and at most "
                             f"{SKINNY_MAX_ROWS} rows")

    def forward_windows_states(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache, window: torch.Tensor,
                               bias: torch.Tensor | None, layers: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """forward_windows over every layer, with the residual stream after each of `layers` read in the same call
        (EAGLE-3's verification in a shared step) -> final hidden states [T, H], the states [T, len(layers) H]: the
        bits of forward_windows run in segments that stop there (layer_states.run_with_states)."""
        self._check_windows(x.shape[0])
        hidden, states = self.native.decoder_layers_states(
            x.to(self.dtype), self.native_weights, self.native_shape, self.eps, self.cos[positions],
            self.sin[positions], bias, cache.k, cache.v, 0, list(layers), window)
        return self.final_norm(hidden), states

    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        if self.fixed_rows:
            return fixed_shapes.in_blocks(lambda rows: self._rms(rows, self.norm), x, self.fixed_rows)
        return self._rms(x, self.norm)

    def forward_layers(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache, mask: torch.Tensor | None,
                       start: int, stop: int, skip: tuple[int, ...] | None = None) -> torch.Tensor:
        """Decoder layers start .. stop - 1 only: x [T, H], the residual stream after layer start - 1 (the
        input embeddings for start 0) -> the residual stream after layer stop - 1, no final norm. Their
        keys/values are written like forward's (ProPD's early pruning runs a tree in two parts); `skip` as
        forward's, one mask per layer of the model. A skipped attention writes no keys/values."""
        return self.layer_runner(x.shape[0], positions, cache, mask, skip)(x, start, stop)

    def layer_runner(self, t: int, positions: torch.Tensor, cache: KVCache, mask: torch.Tensor | None,
                     skip: tuple[int, ...] | None = None) -> Callable[[torch.Tensor, int, int], torch.Tensor]:
        """One forward's T rows at `positions` [T] after `cache`'s committed slots, seeing what `mask` allows ->
        run(x [T, H], start, stop), forward_layers for those rows. What depends only on the positions and the mask
        (rotary rows, the attention bias) is made once here, not once per call: a forward run in segments
        (runtime/forward/layer_states.py, 4 a step for EAGLE-3) otherwise made it in each, about 0.1 ms a segment on a
        2-core CPU, every step."""
        # (no-ops when the caller made them on the model's device, as the decoder does: torch.device context)
        positions = positions.to(self.device)
        mask = None if mask is None else mask.to(self.device)
        if int(positions.max()) >= self.max_positions:
            raise ValueError(f"position {int(positions.max())} beyond the runtime's {self.max_positions}")
        cache.reserve(t)
        if self.fixed_rows:
            return lambda x, start, stop: self._fixed_layers(x.to(self.dtype), positions, cache, mask, start, stop,
                                                             skip)
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]  # [T, 1, D]
        if self.native is not None and (t <= SKINNY_MAX_ROWS or mask is None):
            blocks = native_blocks(t)

            def block_bias(rows: slice) -> torch.Tensor | None:  # [g R, length + first + R]
                return attention_bias(mask, cache.length + rows.start, rows.stop - rows.start, self.group, self.dtype,
                                      self.device)
            # a step (one block) keeps its bias for all its segments; a long prompt's blocks make theirs as they run
            # (kept, they would hold a [g 96, S] bias per block at once)
            kept = block_bias(blocks[0]) if len(blocks) == 1 else None

            def native(x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
                x = x.to(self.dtype)  # drafts' rows (prompt tokens) may come in the weights' dtype
                out = [self._native_rows(x[rows], cos[rows, 0], sin[rows, 0], kept if len(blocks) == 1 else
                                         block_bias(rows), cache, rows.start, start, stop, skip) for rows in blocks]
                return out[0] if len(out) == 1 else torch.cat(out)

            if len(blocks) == 1 and not skip:  # a step: every layer in one call, the states it captures read there
                # (runtime/forward/layer_states.py; run in segments, EAGLE-3's verification made 4 calls a step)
                native.with_states = lambda x, counts: self.native.decoder_layers_states(
                    x.to(self.dtype), self.native_weights, self.native_shape, self.eps, cos[:, 0], sin[:, 0], kept,
                    cache.k, cache.v, cache.length, list(counts), None)
            return native
        if mask is None and t > 1:  # a prompt on the PyTorch layers: causal_attention
            return lambda x, start, stop: self._layers(x.to(self.dtype), cos, sin, None, cache, start, stop, skip,
                                                       causal=True)
        bias = attention_bias(mask, cache.length, t, self.group, self.dtype, self.device)  # [g T, S] or None
        return lambda x, start, stop: self._layers(x.to(self.dtype), cos, sin, bias, cache, start, stop, skip)

    def _native_rows(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bias: torch.Tensor | None,
                     cache: KVCache, first: int, start: int, stop: int, skip: tuple[int, ...] | None) -> torch.Tensor:
        """Layers start .. stop - 1 in one native call for at most SKINNY_MAX_ROWS rows: x [T, H], cos/sin [T, D],
        bias [g T, length + first + T] (attention_bias's) -> [T, H]. `first`: the rows' offset among the forward's,
        whose keys/values go `first` slots after the committed ones (a block of a long prompt sees the blocks before
        it; its bias is then causal)."""
        return self.native.decoder_layers(x, self.native_weights[6 * start:6 * stop], self.native_shape, self.eps, cos,
                                          sin, bias, cache.k[start:stop], cache.v[start:stop], cache.length + first,
                                          list(skip[start:stop]) if skip else [], None)

    def _layers(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bias: torch.Tensor | None,
                cache: KVCache, start: int, stop: int, skip: tuple[int, ...] | None = None,
                causal: bool = False) -> torch.Tensor:
        """Decoder layers start .. stop - 1 in PyTorch operations: x [T, H], cos/sin [T, 1, D] -> [T, H].
        `causal`: the rows see the cache and the rows before them (bias unused), computed in query blocks."""
        return self._sublayers(x, lambda i, h: self._attention(i, h, cos, sin, bias, cache, causal), start, stop,
                               skip)

    def _sublayers(self, x: torch.Tensor, attention, start: int, stop: int,
                   skip: tuple[int, ...] | None) -> torch.Tensor:
        """Layers start .. stop - 1, each x + attention(i, x) then x + its MLP, a sub-layer left out where `skip`
        says: x [T, H] -> [T, H]."""
        for i in range(start, stop):
            skipped = skip[i] if skip else 0
            if not skipped & SKIP_ATTENTION:
                x = x + attention(i, x)
            if not skipped & SKIP_MLP:
                x = x + self._mlp(i, x)
        return x

    def _fixed_layers(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache, mask: torch.Tensor | None,
                      start: int, stop: int, skip: tuple[int, ...] | None) -> torch.Tensor:
        """_layers in blocks of exactly fixed_rows rows (fix_shapes), each block's rows seeing the blocks before it:
        x [T, H] -> [T, H]."""
        rows, out = self.fixed_rows, []
        for first in range(0, x.shape[0], rows):
            count = min(rows, x.shape[0] - first)
            order, visible = fixed_shapes.key_order(positions, cache.length, first, count, mask, rows, cache.capacity)
            at = F.pad(positions[first:first + count], (0, rows - count))  # padding rows at position 0
            cos, sin = self.cos[at][:, None], self.sin[at][:, None]  # [R, 1, D]
            h = F.pad(x[first:first + count], (0, 0, 0, rows - count))  # [R, H]

            def attention(i: int, h: torch.Tensor) -> torch.Tensor:  # this block's: its rows' keys, its order
                q, k, v = self._qkv(i, h, cos, sin)
                cache.write_at(i, cache.length + first, k[:, :count], v[:, :count])
                attn = fixed_shapes.attention(q, cache.k[i], cache.v[i], order, visible)  # [R, Hkv, g, D]
                return self.layers[i].o(attn.reshape(rows, self.heads * self.head_dim))

            out.append(self._sublayers(h, attention, start, stop, skip)[:count])
        return torch.cat(out)

    def _mlp(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """Layer i's MLP sub-layer: x [T, H] -> its output [T, H] (before the residual add)."""
        layer = self.layers[i]
        gate, up = layer.gate_up(self._rms(x, layer.ln2)).chunk(2, dim=-1)
        return layer.down(torch.nn.functional.silu(gate) * up)

    def _qkv(self, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Layer i's rotated queries [Hkv, g, T, D] (each key/value head's group), keys and values [Hkv, T, D]."""
        t, hq, hkv, d, g = x.shape[0], self.heads, self.kv_heads, self.head_dim, self.group
        layer = self.layers[i]
        qkv = layer.qkv(self._rms(x, layer.ln1))  # [T, (Hq + 2 Hkv) D]
        if layer.qkv_bias is not None:
            qkv = qkv + layer.qkv_bias
        qk = rotate(qkv[:, :(hq + hkv) * d].view(t, hq + hkv, d), cos, sin)  # [T, Hq + Hkv, D]
        q = qk[:, :hq].reshape(t, hkv, g, d).permute(1, 2, 0, 3)  # [Hkv, g, T, D]
        k = qk[:, hq:].transpose(0, 1)  # [Hkv, T, D]
        v = qkv[:, (hq + hkv) * d:].view(t, hkv, d).transpose(0, 1)  # [Hkv, T, D]
        return q, k, v

    def _attention(self, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bias: torch.Tensor | None,
                   cache: KVCache, causal: bool = False) -> torch.Tensor:
        """Layer i's attention sub-layer: x [T, H] -> its output [T, H] (before the residual add); writes the
        new keys/values."""
        t = x.shape[0]
        hq, hkv, d, g = self.heads, self.kv_heads, self.head_dim, self.group
        scale = 1.0 / math.sqrt(d)
        q, k, v = self._qkv(i, x, cos, sin)
        keys, values = cache.write(i, k, v)  # [Hkv, S, D]: the committed rows (cache.length), then these
        if causal:
            attn = causal_attention(q, keys, values, cache.length, scale)  # [Hkv, g, T, D]
            return self.layers[i].o(attn.permute(2, 0, 1, 3).reshape(t, hq * d))
        q = q.reshape(hkv, g * t, d)  # [Hkv, g T, D]
        if bias is None:
            scores = torch.bmm(q, keys.transpose(1, 2)).mul_(scale)  # [Hkv, g T, S]
        else:
            scores = torch.baddbmm(bias, q, keys.transpose(1, 2), alpha=scale)
        attn = torch.bmm(scores.softmax(-1), values)  # [Hkv, g T, D]
        attn = attn.view(hkv, g, t, d).permute(2, 0, 1, 3).reshape(t, hq * d)
        return self.layers[i].o(attn)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., V]."""
        if self.fixed_rows:
            return fixed_shapes.in_blocks(self.head, hidden, self.fixed_rows)
        return self.head(hidden)

    def embed_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed[ids.to(self.device)].to(self.dtype)


def end_tokens(model: LeanLlama, tokenizer) -> set[int]:
    """The ids that end an answer: the model config's end token(s) and the tokenizer's."""
    eos = model.eos_token_id
    ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def _native_weights(layers: list[_Layer]) -> list[torch.Tensor]:
    """The native decoder_layers' weights: per layer ln1, qkv, o, ln2, gate_up, down (packed panels)."""
    return [w for layer in layers for w in (layer.ln1.contiguous(), layer.qkv.panels, layer.o.panels,
                                            layer.ln2.contiguous(), layer.gate_up.panels, layer.down.panels)]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (the half-split convention of Llama): x [..., D] with cos/sin broadcast to it ([T, 1, D]
    for x [T, heads, D])."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def native_blocks(t: int) -> list[slice]:
    """A forward's T rows in blocks the native kernels take (at most SKINNY_MAX_ROWS): one block up to there, else
    a long prompt in blocks of SKINNY_MAX_ROWS. The kernels' rows never depend on each other and a row's attention
    sums the keys it sees in order, so a prompt read in blocks gives every row exactly the numbers it gets read one
    token at a time (tests/test_precision.py). In bfloat16 on a CPU without AMX it also halves the time of a long
    prompt against the PyTorch layers (docs/devices.md#long-prompts)."""
    return [slice(first, min(first + SKINNY_MAX_ROWS, t)) for first in range(0, t, SKINNY_MAX_ROWS)]


def attention_bias(mask: torch.Tensor | None, length: int, t: int, group: int, dtype: torch.dtype,
                   device: torch.device) -> torch.Tensor | None:
    """The additive bias [group * t, length + t] of a visibility mask (None: causal), one row per query
    head of a group, in the order the grouped queries are laid out; None when nothing is masked."""
    if mask is None:
        if t == 1:
            return None  # one new token sees everything
        mask = torch.ones(t, length + t, dtype=torch.bool, device=device).tril(diagonal=length)
    bias = torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill_(~mask, float("-inf"))
    return bias.repeat(group, 1)
