"""Starting a run from a trained component (train.init_from) instead of a fresh draw: more epochs for a draft
that stopped improving only because its schedule ended, or a registered draft trained further on new data.

The component must be of the same method, made for the same base model, with tensors of this run's shapes; its
draft vocabulary (where the method has one) replaces the one this run's data would give, since its readout rows
are those tokens'. A larger train.draft_vocab grows it by this run's most frequent other tokens: the component's
rows keep their tokens, a new token's row starts as a fresh run's would (eagle3: the base model's LM-head row).
Tensors a run adds to the method's (its FRESH: an EAGLE-3 draft's prompt tokens) start as drawn where the component
has none. Only the weights carry over: the learning-rate schedule, the step count and the optimizer state start anew,
as a fine-tune from Hugging Face weights does.
"""

from pathlib import Path

import torch

from ppdkit.models.artifact import ArtifactError, Component, read_component
from ppdkit.models.draft_heads import frequent_tokens, inverse_index
from ppdkit.runtime.drafters.head_loading import checked_draft_vocab


def starting_component(cfg, fingerprint: str) -> Component | None:
    """train.init_from's component (a local directory: the pipeline resolves registry URIs first), checked against
    the base model loaded; None where the run starts from a fresh draw."""
    if cfg.init_from is None:
        return None
    component = read_component(Path(cfg.init_from), expect_fingerprint=fingerprint)  # refuses another base model
    if component.method != cfg.method:
        raise ArtifactError(f"train.init_from={cfg.init_from} is a {component.method} component; a run of "
                            f"train.method {cfg.method} starts only from one of its own method")
    return component


def draft_vocabulary(cfg, sequences: list, vocab_size: int, init: Component | None) -> torch.Tensor:
    """The draft vocabulary [V'] token ids: the starting component's, else the `cfg.draft_vocab` most frequent
    tokens of the training sequences. A component with fewer tokens than train.draft_vocab grows: its tokens
    and the most frequent others of the training sequences, ascending ids (load_weights places its rows)."""
    ids = [s.input_ids for s in sequences]
    if init is None:
        return frequent_tokens(ids, cfg.draft_vocab, vocab_size)
    vocab = init.tensors.get("draft_vocab")
    if vocab is None or len(vocab) > cfg.draft_vocab:
        raise ArtifactError(f"train.init_from={cfg.init_from} guesses among "
                            f"{'no' if vocab is None else len(vocab)} draft tokens, this run among "
                            f"train.draft_vocab={cfg.draft_vocab}: set train.draft_vocab to the component's "
                            "(or larger, to grow its vocabulary)")
    vocab = checked_draft_vocab(init, vocab_size)  # distinct ids of the base vocabulary, as decoding requires
    if len(vocab) == cfg.draft_vocab:
        return vocab
    more = frequent_tokens(ids, cfg.draft_vocab - len(vocab), vocab_size, besides=vocab)
    return torch.cat([vocab, more]).sort().values


def load_weights(run, init: Component) -> None:
    """Copy the component's tensors into the run's module, in place (before DeepSpeed wraps it). The run's
    export_tensors names each tensor of the module's state as the component stores it, so its inverse needs no
    second table."""
    with torch.no_grad():
        mine = run.export_tensors(run.module.state_dict())  # component name -> a view of the module's tensor
        fresh = set(getattr(run, "FRESH", ())) - set(init.tensors)  # the run's additions, kept as it drew them
        mine = {name: t for name, t in mine.items() if name not in fresh}
        missing, extra = sorted(set(mine) - set(init.tensors)), sorted(set(init.tensors) - set(mine))
        if missing or extra:
            raise ArtifactError(f"train.init_from={init.path}: its tensors do not match this run's (missing "
                                f"{missing or 'none'}, unexpected {extra or 'none'}); it was trained with other "
                                "settings of the method")
        # the run's tensors [V', ...] by draft token (DRAFT_VOCAB_ROWS), and where the component's tokens sit in the
        # run's vocabulary, which may have grown from the component's (draft_vocabulary)
        by_token, place = set(), None
        if "draft_vocab" in mine:
            vocab = mine["draft_vocab"].long()
            place = inverse_index(vocab, int(vocab.max()) + 1)[init.tensors["draft_vocab"].long()]
            by_token = set(getattr(run, "DRAFT_VOCAB_ROWS", ()))
        differ = [f"{name} {tuple(init.tensors[name].shape)} here {tuple(t.shape)}" for name, t in mine.items()
                  if name != "draft_vocab" and init.tensors[name].shape != (
                      (len(place), *t.shape[1:]) if name in by_token else t.shape)]
        if differ:
            raise ArtifactError(f"train.init_from={init.path} has other shapes than this run ({'; '.join(differ)}): "
                                "set the train keys that size them (head_depth, head_inner, draft_vocab, "
                                "num_prompt_tokens, num_epts) to the component's hyperparameters")
        live = {t.untyped_storage().data_ptr() for t in (*run.module.parameters(), *run.module.buffers())}
        copies = sorted(name for name, t in mine.items() if t.untyped_storage().data_ptr() not in live)
        if copies:  # a run whose export builds new tensors (a concatenation) needs its own inverse here
            raise TypeError(f"{type(run).__module__}: export_tensors returns copies of {copies}, not the module's "
                            "own tensors, so a component's values cannot be loaded through it")
        for name, tensor in mine.items():
            if name == "draft_vocab":
                continue  # the run's: the component's, or grown from it (draft_vocabulary)
            if name in by_token:
                # a new token's row keeps the run's start; the vocabulary may sit on the base's GPU
                tensor[place.to(tensor.device)] = init.tensors[name].to(tensor.device, tensor.dtype)
            else:
                tensor.copy_(init.tensors[name])
