"""A draft-head component (feature-head, medusa) read into the decoder: its heads and calibrated trees, each
checked against the base model's shapes, so a component built wrong gets a clear error at load, not an
index error mid-decoding."""

from ppdkit.models.artifact import ArtifactError, Component
from ppdkit.models.draft_heads import HEAD_KINDS, TENSORS

from .draft_heads import DraftHeadSet, HeadTree, head_tree
from .tree import check_nodes


def load_draft_heads(component: Component, model) -> tuple[DraftHeadSet, dict[int, tuple[HeadTree, float]]]:
    """(the heads, {tree size: (tree, expected tokens per step tau)}); `model` the base (transformers) model."""
    where, config, h = component.path, model.config, component.hyperparameters
    if component.method == "early-head":
        raise ArtifactError(f"{where} is an early-head component: it prunes another component's trees. Load that "
                            "component and pass this one as early_head= (ppdkit decode/bench --early-head)")
    kind, depth = h.get("head_kind"), h.get("head_depth")
    if kind not in HEAD_KINDS or not isinstance(depth, int) or depth < 1:
        raise ArtifactError(f"{where}/component.json: a draft-head component needs hyperparameters head_kind (one of "
                            f"{', '.join(HEAD_KINDS)}) and head_depth >= 1, found {kind!r} and {depth!r}")
    hidden, tensors = config.hidden_size, component.tensors
    vocab = tensors["draft_vocab"]
    if vocab.dim() != 1 or vocab.is_floating_point() or not len(vocab) or int(vocab.min()) < 0 \
            or int(vocab.max()) >= config.vocab_size or len(set(vocab.tolist())) != len(vocab):
        raise ArtifactError(f"{where}: draft_vocab must hold distinct token ids of the base model's vocabulary "
                            f"(0..{config.vocab_size - 1})")
    found = {name: None if tensors.get(name) is None else tuple(tensors[name].shape) for name in TENSORS[kind]}
    inner = found.get("feature_up", (0,))[0] if found.get("feature_up") else 0
    expected = ({"feature_in": (hidden, 2 * hidden), "feature_up": (inner, hidden), "feature_down": (hidden, inner)}
                if kind == "feature" else {"medusa_weight": (depth, hidden, hidden), "medusa_bias": (depth, hidden)})
    if found != expected or (kind == "feature" and not inner):
        raise ArtifactError(f"{where}: {kind} heads for hidden size {hidden} need {expected} (I: the MLP width), "
                            f"found {found}")
    dtype = next(model.parameters()).dtype
    vocab = vocab.long()
    rows = model.get_output_embeddings().weight.detach()[vocab].to(dtype)  # [V', H] the LM head's rows
    heads = DraftHeadSet(kind, tuple(tensors[name].to(dtype) for name in TENSORS[kind]), vocab, rows, depth)
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

