"""Load a frozen base model (fp32/bf16/fp64, or 4-bit NF4 through bitsandbytes) with its tokenizer."""

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from .catalog import materialize
from .device_plan import current_device_plan
from .fingerprint import cached_fingerprint

log = logging.getLogger(__name__)

Quantization = Literal["none", "nf4"]
# model types whose decoder layers are Llama's (RMSNorm, rotary attention with grouped keys/values, SwiGLU MLP):
# Llama 2/3 (any rope scaling: the model's own rotary tables are used), Mistral (its sliding window caps the
# context, Decoder's max_length), Qwen2/2.5 (query/key/value biases, run on the PyTorch layers), SmolLM
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


def check_model_type(config) -> None:
    """A clear error for a base model whose architecture ppdkit cannot run, naming the ones it can."""
    kind = getattr(config, "model_type", None)
    if kind not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"base models of type {kind!r} are not supported: ppdkit runs the Llama family "
                         f"({', '.join(SUPPORTED_MODEL_TYPES)}: Llama 2/3, Mistral, Qwen2/2.5, SmolLM)")


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


@dataclass
class BaseModel:
    name: str  # catalog name or the directory the user gave
    path: Path  # local HF directory the weights came from
    fingerprint: str
    quantization: Quantization
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase


def load_tokenizer(name_or_dir: str) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(materialize(name_or_dir))


def load_base_model(
    name_or_dir: str,
    quantization: Quantization = "none",
    dtype: str = "float32",
    for_training: bool = False,
) -> BaseModel:
    """The frozen base model: every parameter has requires_grad=False, whatever the quantization.

    `for_training=True` keeps gradients flowing THROUGH a 4-bit model to trainable inputs (prompt
    embeddings); see `keep_4bit_differentiable` for why that needs care on CPUs with AVX512-BF16.
    """
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPES)}")
    path = materialize(name_or_dir)
    check_model_type(AutoConfig.from_pretrained(path))  # before loading weights the runtime could not run
    kwargs: dict = {"dtype": DTYPES[dtype]}
    if quantization == "nf4":
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=DTYPES[dtype],
            bnb_4bit_use_double_quant=False,
        )
        kwargs["device_map"] = current_device_plan().nf4_device_map  # bitsandbytes quantizes where it loads
    elif quantization != "none":
        raise ValueError(f"unknown quantization {quantization!r}; use 'none' or 'nf4'")
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    model.eval().requires_grad_(False)
    if quantization == "nf4" and for_training:
        keep_4bit_differentiable(model)
    return BaseModel(
        name=name_or_dir,
        path=path,
        fingerprint=cached_fingerprint(path),
        quantization=quantization,
        model=model,
        tokenizer=AutoTokenizer.from_pretrained(path),
    )


def keep_4bit_differentiable(model: torch.nn.Module) -> int:
    """Stop bitsandbytes from repacking 4-bit weights for CPU inference; returns the layers changed.

    On CPUs with AVX512-BF16, a Linear4bit in eval() mode that sees an input without grad repacks its
    weight into an inference-only layout FOR GOOD; afterwards gradients through it silently vanish.
    Call this before any forward of a model that will carry gradients to its inputs.
    """
    import bitsandbytes as bnb

    changed = 0
    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            if getattr(module.weight.quant_state, "packing_format_for_cpu", False):
                raise RuntimeError(
                    "this 4-bit model already repacked its weights for inference; load it again with "
                    "for_training=True before its first forward"
                )
            module.support_avx512bf16_for_cpu = False
            changed += 1
    return changed
