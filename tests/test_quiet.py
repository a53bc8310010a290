"""The trainer's forwards on a transformers model say nothing: no warning, no transformers log line.

They used to pass the key/value cache as `past_key_values` and read it back from the output, which transformers
5.24 deprecates (a FutureWarning on every call, printed 14 times in the test output and on the demo's console).
"""

import logging
import random
import warnings
from contextlib import contextmanager

import pytest
import torch
from transformers.utils import logging as hf_logging

from ppdkit.data_pipeline.teacher_cache import ShardSequence, compress_logits
from ppdkit.models.hf_cache import cache_kwargs, new_cache
from ppdkit.models.prompt_tokens import init_from_token_embeddings
from ppdkit.models.tiny import build_tiny_llama
from ppdkit.trainer.prompt_batch import collate
from ppdkit.trainer.skip_draft import DraftNorms, draft_states
from ppdkit.trainer.student import student_forward


@pytest.fixture(scope="module")
def tiny():
    model, _ = build_tiny_llama()
    return model.float().eval()


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@contextmanager
def complaints():
    """Every warning raised inside the block, and every line transformers logs at WARNING or above."""
    hf_logging.warning_once.cache_clear()  # transformers logs each deprecation once per process: hear it again here
    lines, root = _Lines(), logging.getLogger("transformers")
    said: list[str] = []
    root.addHandler(lines)
    try:
        with warnings.catch_warnings(record=True) as raised:
            warnings.simplefilter("always")
            yield said
    finally:
        root.removeHandler(lines)
    said += [f"{w.category.__name__}: {w.message}" for w in raised] + [f"transformers: {x}" for x in lines.lines]


def _batch(vocab: int, k: int, n: int):
    gen = torch.Generator().manual_seed(0)
    seqs = []
    for length in (24, 17):
        ids = torch.randint(3, vocab, (length,), generator=gen)
        positions = torch.arange(length // 3, length - 1)
        top_ids, top_logp, rest = compress_logits(torch.randn(len(positions), vocab, generator=gen), 8)
        seqs.append(ShardSequence(0, ids, positions, top_ids, top_logp, rest))
    return collate(seqs, k, n, groups=3, mask="ensemble", rng=random.Random(0))


def test_the_prompt_token_forward_and_its_backward_say_nothing(tiny):
    k, n = 3, 2
    emb = init_from_token_embeddings(tiny.get_input_embeddings(), k, n, seed=1).reshape(k * n, -1).requires_grad_()
    batch = _batch(tiny.config.vocab_size, k, n)
    with complaints() as said:
        logp, hidden = student_forward(tiny, emb, None, k, n, batch)
        logp[batch.target_valid].logsumexp(-1).sum().backward()
    assert said == []
    assert hidden.shape[1] == batch.ordinary_len and emb.grad.abs().sum() > 0  # the groups' pass ran on the cache


def test_the_skip_draft_forward_says_nothing(tiny):
    ids = torch.randint(3, tiny.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(2))
    with complaints() as said, torch.no_grad():
        states = draft_states(tiny, ids, (0,) * tiny.config.num_hidden_layers, DraftNorms(tiny)())
    assert said == []
    assert states.shape == (2, 12, tiny.config.hidden_size)


def test_a_cache_we_own_is_filled_by_the_forward_as_its_own_would_be(tiny):
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    decoder = tiny.get_decoder()
    ours = new_cache(tiny)
    with torch.no_grad():
        out = decoder(input_ids=ids, use_cache=True, **cache_kwargs(decoder, ours))
        plain = decoder(input_ids=ids).last_hidden_state
    assert ours.get_seq_length() == 5
    assert torch.equal(out.last_hidden_state, plain)


def test_a_forward_without_a_cache_argument_is_refused_by_name():
    class OldModel(torch.nn.Module):
        def forward(self, input_ids, past=None):
            return input_ids

    with pytest.raises(TypeError, match="OldModel.forward takes neither `cache` nor `past_key_values`"):
        cache_kwargs(OldModel(), None)
