"""A tiny random Llama with its own tiny ChatML tokenizer: the model every unit test uses.

Everything here is deterministic (fixed corpus, fixed seed), so two processes that build it get the
same weights, the same vocabulary and the same fingerprint.
"""

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig, PreTrainedTokenizerFast,
                          Qwen2Config)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# A small corpus so the byte-level BPE learns a few hundred merges of everyday English and code.
_CORPUS = [
    "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with one step.",
    "def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(i * i)\n",
    "Hello! How are you doing today? I am fine, thank you. What can I help you with?",
    "Write a short story about a robot who learns to paint. Explain the theory of relativity simply.",
    "Paris is the capital of France. Water boils at 100 degrees Celsius at sea level.",
    "import numpy as np\nx = np.zeros((3, 4))\nprint(x.shape)\n",
    "Sure, here is a list:\n1. apples\n2. oranges\n3. bananas\nLet me know if you need more.",
]


def build_tiny_tokenizer(vocab_size: int = 384) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
        chat_template=CHATML_TEMPLATE,
    )


def tiny_llama_config(vocab_size: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )


def build_tiny_llama(seed: int = 0) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    tokenizer = build_tiny_tokenizer()
    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_llama_config(len(tokenizer)))
    return model.eval(), tokenizer


def write_tiny_llama(out_dir: Path, seed: int = 0) -> None:
    model, tokenizer = build_tiny_llama(seed)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def tiny_family_config(family: str, vocab_size: int, layers: int = 2):
    """A tiny config of a Llama-family base model users bring: `llama3` (rope scaling of type llama3),
    `qwen2` (query/key/value biases, an untied LM head), `mistral` (a sliding window)."""
    shape = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, rms_norm_eps=1e-5,
                 bos_token_id=1, eos_token_id=2, pad_token_id=2)
    if family == "llama3":
        return LlamaConfig(**shape, tie_word_embeddings=True, rope_theta=500000.0,
                           rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    if family == "qwen2":
        return Qwen2Config(**shape, tie_word_embeddings=False)
    if family == "mistral":
        return MistralConfig(**shape, tie_word_embeddings=False, sliding_window=256)
    raise ValueError(f"unknown tiny family {family!r}: llama3, qwen2 or mistral")


def write_tiny_family(out_dir: Path, family: str, seed: int = 0, layers: int = 2) -> None:
    """A tiny random model of `family` (tiny_family_config) with the tiny tokenizer, as a local HF directory."""
    tokenizer = build_tiny_tokenizer()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_family_config(family, len(tokenizer), layers))
    if family == "qwen2":  # random biases, so that a runtime that dropped them would be caught
        for name, param in model.named_parameters():
            if name.endswith("_proj.bias"):
                torch.nn.init.normal_(param, std=0.5)
    model.eval().save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
