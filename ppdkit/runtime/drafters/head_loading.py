"""A draft-head component (feature-head, medusa), an EAGLE-3 draft or a layer-skip one read into the decoder: its
heads and calibrated trees, its draft, or its skip map and fine-tuned draft, each checked against the base model's
shapes, so a component built wrong gets a clear error at load, not an index error mid-decoding."""

from collections.abc import Callable

import torch

from ppdkit.models.artifact import ArtifactError, Component
from ppdkit.models.component_hyperparameters import read_hyperparameters
from ppdkit.models.draft_heads import TENSORS
from ppdkit.models.eagle3 import PARALLEL, expected_shapes, head_dim


from ..forward.linear import QUANTIZED, Linear, draft_blocks, draft_layers
from ..forward.precision import activation_dtype
from ..trees.tree import check_nodes
from .eagle3_drafter import Eagle3Set
from .heads_drafter import DraftHeadSet, HeadTree, head_tree
from .layer_skip import SkipDraft, check_skip_map


def load_draft_heads(component: Component, model, matrices: torch.dtype | str | None = None
                     ) -> tuple[DraftHeadSet, dict[int, tuple[HeadTree, float]]]:
    """(the heads, {tree size: (tree, expected tokens per step tau)}); `model` the base (transformers) model;
    `matrices` (runtime/decoder_loading.draft_matrices) QUANTIZED puts the feature head's matrices and the readout in
    Q8_0 blocks on a CPU; otherwise they stay in the activations' dtype."""
    where, config = component.path, model.config
    h = read_hyperparameters(component)  # a HeadHyperparameters for feature-head and medusa
    kind, depth = h.head_kind, h.head_depth
    hidden, tensors = config.hidden_size, component.tensors
    vocab = checked_draft_vocab(component, config.vocab_size)
    found = {name: None if tensors.get(name) is None else tuple(tensors[name].shape) for name in TENSORS[kind]}
    inner = found.get("feature_up", (0,))[0] if found.get("feature_up") else 0
    expected = ({"feature_in": (hidden, 2 * hidden), "feature_up": (inner, hidden), "feature_down": (hidden, inner)}
                if kind == "feature" else {"medusa_weight": (depth, hidden, hidden), "medusa_bias": (depth, hidden)})
    if found != expected or (kind == "feature" and not inner):
        raise ArtifactError(f"{where}: {kind} heads for hidden size {hidden} need {expected} (I: the MLP width), "
                            f"found {found}")
    dtype = activation_dtype(next(model.parameters()).dtype)  # the heads run on the decoder's activations
    rows = model.get_output_embeddings().weight.detach()[vocab].to(dtype)  # [V', H] the LM head's rows
    heads = DraftHeadSet(kind, tuple(tensors[name].to(model.device, dtype) for name in TENSORS[kind]),
                         vocab.to(model.device), rows, depth, matrices)
    trees = {}
    for size, data in (component.extras.get("trees") or {}).get("trees", {}).items():
        try:
            parents, depths, ranks = list(data["parents"]), list(data["depths"]), list(data["ranks"])
            if not parents or not len(parents) == len(depths) == len(ranks):
                raise ValueError("parents, depths and ranks must be equally long and hold the root")
            check_nodes(parents, depths, ranks, depth, len(vocab))
            trees[int(size)] = (head_tree(parents, depths, ranks), float(data["tau"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ArtifactError(f"{where}/trees.json: the tree of size {size} cannot be used: {e}; run the calibrate "
                                "stage again") from None
    return heads, trees


# The bits of an EAGLE-3 draft's GGUF blocks (where `matrices` asks for blocks): Q4_1. A level reads every matrix of
# the draft (~10 MB on Q8_0 for SmolLM2's, its 8192-row readout half of it) from memory, which the verification's
# stream of the base weights has evicted; on Q4_1 a step's drafting takes less time and the trees keep about the
# same guesses (docs/tools/draft_blocks.py, shown in the SmolLM2 draft's model card).
EAGLE3_BLOCK_BITS = 4


def load_eagle3(component: Component, model, matrices: torch.dtype | str | None = None,
                bits: int = EAGLE3_BLOCK_BITS) -> Eagle3Set:
    """An eagle3 component's draft, its tensors' shapes and hidden-state layers checked against the base model;
    `matrices` and `bits` as eagle3_set's."""
    where, config = component.path, model.config
    vocab = checked_draft_vocab(component, config.vocab_size)
    expected = expected_shapes(config, len(vocab))
    found = {name: None if component.tensors.get(name) is None else tuple(component.tensors[name].shape)
             for name in expected}
    if found != expected:
        wrong = {name: (found[name], shape) for name, shape in expected.items() if found[name] != shape}
        raise ArtifactError(f"{where}: an EAGLE-3 draft of this base model needs these tensors with these shapes "
                            f"(found, needed): {wrong}")
    layers = read_hyperparameters(component).aux_layers
    if not all(1 <= k <= config.num_hidden_layers for k in layers):
        raise ArtifactError(f"{where}/component.json: hyperparameters.aux_layers must name 3 of the base model's "
                            f"hidden states (1 .. {config.num_hidden_layers}), found {layers!r}")
    draft = eagle3_set({name: component.tensors[name] for name in expected}, vocab, tuple(layers), model, matrices,
                       bits)
    draft.parallel = _prompt_tokens(component, config.hidden_size, model)
    return draft


def _prompt_tokens(component: Component, hidden: int, model) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The draft's prompt tokens (models/eagle3.py PARALLEL), checked, in the activations' dtype: (embeddings [P, H],
    hidden states [P, H]); None for a draft without them."""
    found = [component.tensors.get(name) for name in PARALLEL]
    if all(t is None for t in found):
        return None
    shapes = [None if t is None else tuple(t.shape) for t in found]
    if None in shapes or shapes[0] != shapes[1] or len(shapes[0]) != 2 or shapes[0][1] != hidden or not shapes[0][0]:
        raise ArtifactError(f"{component.path}: a draft's prompt tokens are {' and '.join(PARALLEL)}, both [P, "
                            f"{hidden}] with P >= 1; found {dict(zip(PARALLEL, shapes))}")
    dtype = activation_dtype(next(model.parameters()).dtype)
    return tuple(t.to(model.device, dtype) for t in found)


def eagle3_set(tensors: dict[str, torch.Tensor], vocab: torch.Tensor, layers: tuple[int, ...], model,
               matrices: torch.dtype | str | None = None, bits: int = EAGLE3_BLOCK_BITS) -> Eagle3Set:
    """The runtime's draft from models/eagle3.py's tensors (checked), on `model`'s device and activations; its
    matrices in `matrices` (runtime/decoder_loading.draft_matrices): a dtype, QUANTIZED (GGUF blocks of `bits`, on a
    CPU; the base's weight dtype elsewhere), by default the base's weight dtype."""
    config = model.config
    # its matrices narrow (bfloat16 halves what each draft step reads, Q8_0 blocks quarter it, Q4_1 under a fifth:
    # drafting is memory-bound, 35 MB a level in float32), its norms and activations in the decoder's activation dtype
    weight_dtype = next(model.parameters()).dtype
    dtype = activation_dtype(weight_dtype)
    blocks = draft_blocks(matrices, model.device)
    if matrices in (None, QUANTIZED):  # blocks are cut from float32 copies
        matrices = torch.float32 if blocks else weight_dtype
    t = {name: value.to(model.device, matrices if value.dim() == 2 else dtype) for name, value in tensors.items()}
    qkv = torch.cat([t[f"midlayer.self_attn.{x}_proj.weight"] for x in "qkv"])
    linear = draft_layers(blocks, bits)
    weights = {name: linear(value) if value.dim() == 2 else value for name, value in t.items()}
    draft = Eagle3Set({**weights, "qkv": linear(qkv)}, vocab.to(model.device), layers, config.num_attention_heads,
                      config.num_key_value_heads, head_dim(config), config.rms_norm_eps)
    if dtype == torch.float32:  # the native kernels' activations
        _go_native(draft, t, config.hidden_size, linear)
    return draft


def _go_native(draft: Eagle3Set, t: dict[str, torch.Tensor], hidden: int, linear: Callable[[torch.Tensor], Linear]
               ) -> None:
    """Give `draft` the weights of its layer's native call (decoder_layers.cpp eagle3_layer) where the CPU kernels run
    every one of its matrices; t: its tensors by name, on the device; `linear` packs a matrix as the others were."""
    p = "midlayer."
    qkv, o, down = (draft.weights[name] for name in ("qkv", p + "self_attn.o_proj.weight", p + "mlp.down_proj.weight"))
    if any(m.native is None for m in (qkv, o, down)):  # a GPU, or no kernels here: no fused copy to pack
        return
    gate_up = linear(torch.cat([t[p + "mlp.gate_proj.weight"], t[p + "mlp.up_proj.weight"]]))  # one pass for both
    if gate_up.native is None:
        return
    norm = {name: t[p + name].contiguous() for name in ("input_layernorm.weight", "hidden_norm.weight",
                                                        "post_attention_layernorm.weight")}
    draft.native_weights = [norm["input_layernorm.weight"], norm["hidden_norm.weight"], qkv.panels, o.panels,
                            norm["post_attention_layernorm.weight"], gate_up.panels, down.panels]
    draft.native_shape = [draft.heads, draft.kv_heads, draft.head_dim, gate_up.out_features // 2, hidden]


def checked_draft_vocab(component: Component, vocab_size: int):
    """The component's draft_vocab [V'] as int64, after checking it holds distinct ids of the base vocabulary."""
    vocab = component.tensors.get("draft_vocab")
    if vocab is None or vocab.dim() != 1 or vocab.is_floating_point() or not len(vocab) or int(vocab.min()) < 0 \
            or int(vocab.max()) >= vocab_size or len(set(vocab.tolist())) != len(vocab):
        raise ArtifactError(f"{component.path}: draft_vocab must hold distinct token ids of the base model's "
                            f"vocabulary (0..{vocab_size - 1})")
    return vocab.long()


def load_skip_draft(component: Component, lean, model) -> tuple[tuple[int, ...], SkipDraft | None]:
    """A layer-skip component's skip map, and for skip-finetune its fine-tuned draft; `lean` the decoder's
    LeanLlama, `model` the base (transformers) model."""
    where = component.path
    try:
        skip = check_skip_map(read_hyperparameters(component).skip_map, len(lean.layers))
    except ValueError as e:
        raise ArtifactError(f"{where}/component.json: a {component.method} component needs hyperparameters.skip_map "
                            f"for this base model: {e}") from None
    if component.method == "layer-skip":
        return skip, None
    layers, hidden = len(lean.layers), lean.hidden
    expected = {"skip_ln1": (layers, hidden), "skip_ln2": (layers, hidden), "skip_norm": (hidden,)}
    found = {name: None if component.tensors.get(name) is None else tuple(component.tensors[name].shape)
             for name in expected}
    if found != expected:
        raise ArtifactError(f"{where}: a skip-finetune draft of this base model needs {expected}, found {found}")
    norms = [component.tensors[name].to(lean.device, torch.float32) for name in expected]  # finite: checked at read
    vocab = checked_draft_vocab(component, lean.vocab_size).to(lean.device)
    lm_head = model.get_output_embeddings().weight.detach()
    return skip, SkipDraft.fine_tuned(lean, lm_head, skip, *norms, vocab)
