"""An eagle3 component written in the layouts production servers load: `speculators` (vLLM's draft format library,
pinned SPECULATORS_VERSION; vLLM loads it as such) and `sglang` (the Hugging Face EAGLE-3 layout SpecForge writes
for SGLang, which vLLM loads too). Both hold the same tensors:

    embed_tokens.weight [V, H]   the base model's input embeddings (speculators reads the draft's own; vLLM and
                                 SGLang may share the target's, but a copy costs nothing to them)
    fc.weight, <layer>.*, norm.weight, lm_head.weight [V', H]   models/eagle3.py's, <layer> = layers.0 or midlayer
    d2t [V'] int64               target id = draft id + d2t[draft id] (the draft vocabulary in ascending ids)
    t2d [V] bool                 which target ids the draft vocabulary holds

and a config.json. The servers' loaders take a missing tensor silently (vLLM decoded with fc.weight absent), so
the writer checks the tensors' names and shapes against the base model itself; `norm_before_residual` is written
out, since vLLM's default for a missing key (true) is not the draft's (false).
"""

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from .artifact import ArtifactError, read_component
from .eagle3 import SHAPES, expected_shapes, head_dim
from .loading import load_base_model

FORMATS = ("speculators", "sglang")
SPECULATORS_VERSION = "0.9.0"
LAYER_PREFIX = {"speculators": "layers.0.", "sglang": "midlayer."}
# the Hugging Face Hub ids of catalog base models (a server resolves the verifier by it); other bases are named
# by their own name or directory
HUB_IDS = {"smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct"}


def exported_tensors(tensors: dict[str, torch.Tensor], vocab: torch.Tensor, embed: torch.Tensor, fmt: str
                     ) -> dict[str, torch.Tensor]:
    """The draft's tensors (models/eagle3.py names), its draft vocabulary [V'] and the base's embeddings [V, H]
    -> the layout's tensors."""
    out = {name.replace("midlayer.", LAYER_PREFIX[fmt]): tensors[name].float().contiguous() for name in SHAPES}
    order = vocab.long().sort().values  # the draft's ids ascending: d2t's offsets then never go back
    if not torch.equal(order, vocab.long()):
        raise ArtifactError("draft_vocab is not in ascending token ids: d2t would not describe it")
    t2d = torch.zeros(len(embed), dtype=torch.bool)
    t2d[order] = True
    return {**out, "embed_tokens.weight": embed.float().contiguous(), "d2t": order - torch.arange(len(order)),
            "t2d": t2d}


def _config(fmt: str, model_config, draft_vocab: int, layers: list[int], verifier: str) -> dict:
    c = model_config
    layer = {"model_type": "llama", "vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
             "intermediate_size": c.intermediate_size, "num_hidden_layers": 1,
             "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
             "head_dim": head_dim(c),
             "hidden_act": "silu", "max_position_embeddings": c.max_position_embeddings,
             "rms_norm_eps": c.rms_norm_eps, "rope_parameters": dict(c.rope_parameters),
             "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False}
    if fmt == "sglang":
        return {**layer, "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": draft_vocab,
                "target_hidden_size": c.hidden_size, "norm_before_residual": False,
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": layers}}
    return {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
            "speculators_version": SPECULATORS_VERSION, "draft_vocab_size": draft_vocab, "norm_before_residual": False,
            "eagle_aux_hidden_state_layer_ids": layers, "transformer_layer_config": layer,
            "speculators_config": {
                "algorithm": "eagle3",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3, "verifier_accept_k": 1,
                                      "accept_tolerance": 0.0}],
                "default_proposal_method": "greedy",
                "verifier": {"name_or_path": verifier, "architectures": list(c.architectures or ["LlamaForCausalLM"])}}}


def export_eagle3(component_dir: Path, out: Path, fmt: str, verifier: str | None = None) -> Path:
    """Write the eagle3 component in `component_dir` to `out` in layout `fmt` (FORMATS); `verifier` names the base
    model in the config (default: its Hub id, or its name). Refuses another method's component, a component of
    another base model, or tensors that do not fit the base model."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; use one of {', '.join(FORMATS)}")
    component = read_component(Path(component_dir))
    if component.method != "eagle3":
        raise ArtifactError(f"{component_dir} is a {component.method} component: only eagle3 drafts have a "
                            f"{fmt} layout (train one with train.method: eagle3)")
    name = component.base_model["name"]
    base = load_base_model(name, quantization="none", dtype="float32")
    read_component(Path(component_dir), expect_fingerprint=base.fingerprint)  # refuses another base model
    c, vocab = base.model.config, component.tensors["draft_vocab"]
    expected = expected_shapes(c, len(vocab))
    found = {k: tuple(component.tensors[k].shape) if k in component.tensors else None for k in expected}
    if found != expected:
        raise ArtifactError(f"{component_dir}: the draft's tensors do not fit {name} (found, needed): "
                            f"{ {k: (found[k], v) for k, v in expected.items() if found[k] != v} }")
    layers = list(component.hyperparameters["aux_layers"])
    if len(set(layers)) != 3 or not all(0 <= k < c.num_hidden_layers for k in layers):
        # vLLM reads aux state k at the input of decoder layer k: three distinct layers of the model
        raise ArtifactError(f"{component_dir}: vLLM and speculators need the draft's three hidden states from "
                            f"distinct layers in 0 .. {c.num_hidden_layers - 1}, and it reads {layers} ({name} has "
                            f"{c.num_hidden_layers} layers: a base of 8 or more gets distinct defaults)")
    embed = base.model.get_input_embeddings().weight.detach()
    tensors = exported_tensors(component.tensors, vocab, embed, fmt)
    config = _config(fmt, c, len(vocab), layers, verifier or HUB_IDS.get(name, name))
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out
