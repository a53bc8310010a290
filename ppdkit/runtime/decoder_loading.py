"""Building a Decoder: from a component (a directory or a models:/ URI) with its drafts checked against the base
model, or from a base model alone. The Decoder's `from_pretrained` and `from_base` are these functions."""

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ppdkit.models.artifact import ArtifactError, Component, read_component
from ppdkit.models.decoding_head import HEAD_TENSORS
from ppdkit.models.catalog import base_gguf
from ppdkit.models.component_hyperparameters import read_hyperparameters
from ppdkit.models.loading import BaseModel, load_base_model
from ppdkit.models.ngram_table import NgramTable

from .decoding_methods import get_method
from .drafters.corpus_ngrams import CorpusLookup
from .drafters.draft_parts import DraftParts, Eagle3Parts, HeadParts, LayerSkipParts, PromptTokenParts, SizedParts
from .drafters.head_loading import load_draft_heads, load_eagle3, load_skip_draft
from .drafters.layer_skip import check_skip_map
from .drafters.ppd import PromptTokenSet
from .forward.devices import check_device, on_device
from .forward.dtypes import BLOCK_FORMATS, Q4
from .forward.gguf_blocks import QuantizedWeight, quantize_model, read_quantized_weights
from .forward.linear import QUANTIZED
from .forward.precision import activation_dtype, bf16_kernels_here, gguf_kernels_here, resolve_dtype
from .forward.row_invariance import check_rows
from .kernels.openmp import release_openmp_threads
from .load_options import BASE_ONLY, COMPONENT_ONLY, LoadOptions, load_options
from .trees.profile import best_speedup, profile_trees
from .trees.pruning import load_early_head
from .trees.tree import DynamicTree
from .trees.tree_values import TREE_VALUES, TreeValues

LATENCY_SIZES = (2, 4, 8)  # the rows of a grown tree (runtime/decoding_methods.py GROWN_NODES: at most 8)

if TYPE_CHECKING:  # decoder.py imports this module: the class is passed in as `cls`
    from .decoder import Decoder


def from_pretrained(cls: type["Decoder"], source: str | Path, options: LoadOptions | None = None,
                    **overrides) -> "Decoder":
    """A component directory, or models:/NAME@ALIAS | models:/NAME/VERSION: base model, prompt tokens,
    trees and n-gram table (or draft heads and their trees, or a layer-skip map and its fine-tuned draft), loaded as
    `options` say (runtime/load_options.py), any of them overridable by keyword: from_pretrained(path, dtype="q4")."""
    options = load_options(options, overrides, BASE_ONLY, "to a component (it carries its own drafts)")
    device, tree_size = check_device(options.device), options.tree_size
    directory = _local(source)
    component = read_component(directory)
    digest = hashlib.sha256((directory / "component.json").read_bytes()).hexdigest()
    dtype = resolve_dtype(options.dtype, device, component.base_model["name"])
    base, blocks = base_weights(component.base_model["name"], dtype)
    read_component(directory, expect_fingerprint=base.fingerprint)  # refuses another base model
    base.model.to(device)  # the loaders below take the LM head's rows from it, on the device
    with on_device(device):  # the layouts, head trees and profile built below: on the device
        decoder = cls(base.model, base.tokenizer, None, options.max_length, quantized=blocks, weight_format=dtype,
                      fixed_shapes=options.fixed_shapes)  # fixed before the profile: it times the steps it will run
        decoder.draft = draft = _draft_parts(component, base.model, decoder.model, options.lookup_chains, dtype)
        if options.early_head is not None:
            early = read_component(_local(options.early_head), expect_fingerprint=base.fingerprint)  # not another base
            draft.early_head = load_early_head(early, base.model, options.prune_top_k)
        decoder.fingerprint, decoder.component_digest = base.fingerprint, digest
        decoder.base_name = component.base_model["name"]
        draft.corpus = base_corpus(decoder.base_name)
        if tree_size is not None and any(get_method(m).grown for m in decoder.methods()):
            # a grown tree (feature-grown*, eagle3*) of that many nodes every step: hardware where rows are nearly
            # free (a GPU), or a measurement of tokens per step at that size
            if tree_size < 2:
                raise ValueError(f"tree_size {tree_size}: a grown tree holds the root and at least one guess (>= 2)")
            draft.grown_nodes = tree_size
        if isinstance(draft, SizedParts) and draft.taus:
            _size_trees(decoder, draft, tree_size, options.dynamic_size)
        elif isinstance(draft, Eagle3Parts) and tree_size is None:
            _latency_profile(decoder)
        check_rows(decoder)
    del base, blocks  # the last references but the decoder's: a block format's float copy and unpacked blocks go
    _release_float_weights(decoder, component.base_model["name"], dtype, device)
    release_openmp_threads()  # its decodes may run on another thread (runtime/kernels/openmp.py)
    return decoder


def _release_float_weights(decoder: "Decoder", name: str, dtype: str, device: torch.device) -> None:
    """On GGUF blocks the runtime multiplies its own weights: transformers' float32 copy (the larger part of the
    process) is dropped, and loaded again only when a baseline asks for it."""
    if dtype in BLOCK_FORMATS:
        decoder.release_hf_model(lambda: load_base_model(name, quantization="none", dtype="float32").model.to(device))


def base_weights(name: str, dtype: str) -> tuple[BaseModel, dict[str, QuantizedWeight] | None]:
    """The base model in `dtype` (resolved), and for gguf its own GGUF's blocks, for q4 blocks quantized from its
    weights (the model itself then float32, read for the embeddings and norms)."""
    if dtype not in BLOCK_FORMATS:
        return load_base_model(name, quantization="none", dtype=dtype), None
    base = load_base_model(name, quantization="none", dtype="float32")
    if dtype == Q4:
        return base, quantize_model(base.model)
    try:
        path = base_gguf(name)
    except ValueError as error:
        raise ValueError(f"dtype gguf multiplies the base model's own GGUF blocks: {error}. Use q4 (the same "
                         "format, quantized from its weights), float32 or bfloat16") from None
    cfg = base.model.config
    return base, read_quantized_weights(path, cfg.num_attention_heads, cfg.num_key_value_heads)


def draft_matrices(dtype: str) -> torch.dtype | str | None:
    """The format of an EAGLE-3 draft's matrices for a decoder in `dtype` (resolved). In bfloat16 or on GGUF blocks:
    GGUF blocks (QUANTIZED: EAGLE-3's Q4_1, runtime/drafters/head_loading.EAGLE3_BLOCK_BITS; a feature head's Q8_0)
    where this CPU's int8 kernel runs them, half bfloat16's bytes or less (drafting is memory-bound, and the draft only
    ranks guesses: the verification decides what is kept); else on GGUF blocks
    bfloat16 where the kernels run it (the base model's float32 copy would double what each draft level reads);
    else the base model's weight dtype (None). What each cost: docs/history.md. A float32 decoder keeps the draft
    exact, as trained."""
    if dtype in ("bfloat16", *BLOCK_FORMATS) and gguf_kernels_here():
        return QUANTIZED
    return torch.bfloat16 if dtype in BLOCK_FORMATS and bf16_kernels_here() else None


def _draft_parts(component: Component, model, lean, lookup_chains: int, dtype: str) -> DraftParts:
    """The component's parts, read by its method's loader and checked against the base model (`model`, transformers';
    `lean`, the decoder's own forward, over which a layer-skip draft runs)."""
    if component.method == "early-head":
        raise ArtifactError(f"{component.path} is an early-head component: it prunes another component's trees. Load "
                            "that component and pass this one as early_head= (ppdkit decode/bench --early-head)")
    if component.method in ("layer-skip", "skip-finetune"):  # the base model drafts for itself
        skip_map, fine_tuned = load_skip_draft(component, lean, model)
        return LayerSkipParts(skip_map=skip_map, fine_tuned=fine_tuned)
    if component.method == "eagle3":
        return Eagle3Parts(eagle3=load_eagle3(component, model, draft_matrices(dtype)),
                           tree_values=tree_values(component))
    if component.method in ("feature-head", "medusa"):  # draft heads over the base model's features
        heads, trees = load_draft_heads(component, model, draft_matrices(dtype))
        return HeadParts(heads=heads, trees={s: tree for s, (tree, _) in trees.items()},
                         taus={s: tau for s, (_, tau) in trees.items()}, tree_values=tree_values(component))
    # ept, ept-head; read_hyperparameters (in _drafts) refuses any other method, naming those it reads
    prompts, trees, ngrams = _drafts(component, model)
    return PromptTokenParts(prompts=prompts, trees=trees, ngrams=ngrams, lookup_chains=lookup_chains)


def tree_values(component: Component) -> TreeValues | None:
    """The grown trees' fitted value model the component ships (tree_values.json), checked; None without one."""
    data = component.extras.get(TREE_VALUES)
    if data is None:
        return None
    try:
        return TreeValues.from_json(data, f"{component.path}/{TREE_VALUES}.json")
    except ValueError as error:
        raise ArtifactError(str(error)) from None


def _size_trees(decoder: "Decoder", draft: SizedParts, tree_size: int | None, dynamic_size: bool,
                refresh: bool = False) -> None:
    """Take the calibrated tree nearest `tree_size`, or, when none is given, the size this machine's
    profile chose (measured once per machine, then cached; again where the live steps prove it stale)."""
    if tree_size is None:
        decoder.profile = profile_trees(decoder.model, draft.taus, decoder.fingerprint, refresh=refresh,
                                        **draft.profile_arguments(decoder.model))
        decoder.measure_profile = lambda: _size_trees(decoder, draft, None, dynamic_size, refresh=True)
        tree_size = decoder.profile["chosen"]
        best = best_speedup(decoder.profile)
        # never a slowdown: where no calibrated size is predicted to beat one-token steps, the trees' methods run
        # plain steps (Decoder.resolve_method); a size asked for by name runs as asked
        decoder.unpaid = None if best >= 1.0 else (
            f"its calibrated trees are predicted at best {best:.2f}x one-token steps on this machine (tree size "
            f"{tree_size}, {decoder.profile['one_token_ms']:.1f} ms a token); a tree size given by name runs them")
    draft.use_size(min(draft.taus, key=lambda s: abs(s - tree_size)), dynamic_size)


def _latency_profile(decoder: "Decoder", refresh: bool = False) -> None:
    """No calibrated trees (EAGLE-3): the grown tree's latency line starts from this machine's forward times by rows
    (each size's "tau" 1: a latency profile, cached per machine like the others)."""
    decoder.profile = profile_trees(decoder.model, {size: 1.0 for size in LATENCY_SIZES}, decoder.fingerprint,
                                    drafter="latency", refresh=refresh)
    decoder.measure_profile = lambda: _latency_profile(decoder, refresh=True)


def from_base(cls: type["Decoder"], name: str, options: LoadOptions | None = None, **overrides) -> "Decoder":
    """A base model alone (a name of models/config.py or a local directory), for the methods that need no
    component: ar and the training-free drafters (anpd, self-draft); with `skip_map` (per decoder layer 0 keep, 1 skip
    the attention, 2 the MLP, 3 both) also Draft & Verify's `skip`. `options` as from_pretrained's."""
    options = load_options(options, overrides, COMPONENT_ONLY, "to a base model alone (they set a component's drafts)")
    device = check_device(options.device)
    dtype = resolve_dtype(options.dtype, device, name)
    base, blocks = base_weights(name, dtype)
    base.model.to(device)
    layers = base.model.config.num_hidden_layers
    draft = (DraftParts() if options.skip_map is None
             else LayerSkipParts(skip_map=check_skip_map(options.skip_map, layers)))
    decoder = cls(base.model, base.tokenizer, draft, options.max_length, quantized=blocks, weight_format=dtype,
                  fixed_shapes=options.fixed_shapes)
    decoder.fingerprint, decoder.base_name = base.fingerprint, name
    check_rows(decoder)
    del base, blocks  # as in from_pretrained
    _release_float_weights(decoder, name, dtype, device)
    release_openmp_threads()  # as in from_pretrained
    return decoder


def base_corpus(name: str) -> CorpusLookup | None:
    """The self-distilled corpus committed for a catalog base model (data_pipeline/corpora/NAME), if there is one:
    its n-gram tables are read only when a corpus method first runs."""
    from ppdkit.data_pipeline.corpus import committed_corpus, has_committed_corpus

    return CorpusLookup(committed_corpus(name)) if has_committed_corpus(name) else None


def _local(source: str | Path) -> Path:
    """A component's directory: `source` itself, or the registry version a models:/ URI names, downloaded."""
    if str(source).startswith("models:/"):
        from ppdkit.registry.models import resolve  # the registry (MLflow) only for registry URIs

        return Path(resolve(str(source)))
    return Path(source)


def _drafts(component: Component, model) -> tuple[PromptTokenSet, dict[int, DynamicTree], NgramTable | None]:
    """The prompt tokens, trees by size and n-gram table of a PPD component, each checked against the base
    model's shapes: a component that passed its checksums but was built wrong gets a clear error here,
    not an index error mid-decoding."""
    where, config = component.path, model.config
    h = read_hyperparameters(component)
    k, n, mask = h.num_prompt_tokens, h.num_epts, h.mask
    emb = component.tensors.get("prompt_embeddings")  # [k, n, H]
    if emb is None or tuple(emb.shape) != (k, n, config.hidden_size):
        raise ArtifactError(f"{where}: prompt_embeddings must be [{k}, {n}, {config.hidden_size}] (prompt tokens, "
                            f"EPTs, the base model's hidden size), found {None if emb is None else tuple(emb.shape)}")
    weights = component.tensors.get("ept_weights")  # [k, n]
    if weights is not None and tuple(weights.shape) != (k, n):
        raise ArtifactError(f"{where}: ept_weights must be [{k}, {n}], found {tuple(weights.shape)}")
    head = tuple(component.tensors.get(name) for name in HEAD_TENSORS)
    if any(t is not None for t in head):
        expected = {"head_weight": (config.hidden_size, config.hidden_size), "head_bias": (config.hidden_size,)}
        found = {name: None if t is None else tuple(t.shape) for name, t in zip(HEAD_TENSORS, head)}
        if found != expected:
            raise ArtifactError(f"{where}: a custom decoding head needs head_weight [H, H] and head_bias [H] for the "
                                f"base model's hidden size H={config.hidden_size}, found {found}")
    on = {"device": model.device, "dtype": activation_dtype(model.dtype)}  # safetensors read them on the CPU
    prompts = PromptTokenSet(emb.reshape(k * n, -1).to(**on), None if weights is None else weights.to(model.device),
                             k, n, mask, None if head[0] is None else tuple(t.to(**on) for t in head))
    by_size = {}
    for size, data in (component.extras.get("trees") or {}).get("trees", {}).items():
        try:
            tree = DynamicTree.from_json(data)
            tree.check(k, config.vocab_size)
            by_size[int(size)] = tree
        except ValueError as e:
            raise ArtifactError(f"{where}/trees.json: the tree of size {size} cannot be used: {e}; run the calibrate "
                                "stage again") from None
    ngrams = None
    if component.ngrams:
        try:
            ngrams = NgramTable.from_tensors(component.ngrams)
        except (ValueError, KeyError, IndexError) as e:
            raise ArtifactError(f"{where}/ngrams.safetensors is not an n-gram table ({e})") from None
        largest = max((t for key, found in ngrams.entries.items() for t in (*key, *sum(found, []))), default=0)
        if largest >= config.vocab_size:
            raise ArtifactError(f"{where}/ngrams.safetensors holds token id {largest}, outside the base model's "
                                f"vocabulary of {config.vocab_size}")
    return prompts, by_size, ngrams
