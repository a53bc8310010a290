"""Steps of one fixed shape (ppdkit/runtime/forward/fixed_shapes.py), the PyTorch layers' lossless mode for a GPU: every
row of a step, causal or tree-shaped, in one block or several, gets exactly the result of the one-row steps `ar` runs,
on library kernels that promise nothing about rows; a verified row's keys come in `ar`'s order; decoding through it
is lossless, prefill and trees split in blocks included."""

from types import SimpleNamespace

import pytest
import torch
from conftest import lossless_on_random_prompts, plain_tiny_decoder

import ppdkit.runtime.forward.linear as linear_module
from ppdkit.models.tiny import build_tiny_llama
from ppdkit.runtime.forward import fixed_shapes
from ppdkit.runtime.decoder import Decoder
from ppdkit.runtime.forward.fixed_shapes import key_order
from ppdkit.runtime.forward.llama import LeanLlama
from ppdkit.runtime.forward.row_invariance import first_mismatch


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_row_of_a_fixed_shape_step_is_the_one_row_steps_result(dtype, monkeypatch):
    """The row-invariance probe (causal and tree-shaped steps of 1 to 80 rows over a 37-token context) finds no
    row that differs, with blocks of 24 rows, so that the context's prefill and the larger steps run in blocks."""
    monkeypatch.setattr(linear_module, "native_kernels", lambda: None)  # library matmuls only
    model, _ = build_tiny_llama()
    lean = LeanLlama(model.to(dtype).eval(), max_positions=256)
    assert lean.native is None
    lean.fix_shapes(24)
    assert first_mismatch(lean, 80) is None


def test_a_verified_rows_keys_come_in_ars_order():
    """Five cached tokens, then a tree: row 0 (position 5), its children rows 1 and 2 (position 6) and row 2's
    child row 3 (position 7). Row 3 sees slots 0-4, row 0's and row 2's and its own: the keys `ar` had cached as
    positions 0..7, in that order. Padding rows see slot 0 alone."""
    cached, tree = 5, torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    mask = torch.cat([torch.ones(4, cached, dtype=torch.bool), tree], dim=1)
    order, visible = key_order(torch.tensor([5, 6, 6, 7]), cached, 0, 4, mask, 6, 16)
    assert order[3, :8].tolist() == [0, 1, 2, 3, 4, 5, 7, 8] and visible[3].sum() == 8
    assert order[2, :7].tolist() == [0, 1, 2, 3, 4, 5, 7] and visible[2].sum() == 7
    assert visible[4:].sum(-1).tolist() == [1, 1] and order[4:, 0].tolist() == [0, 0]
    # the second block of a step (rows 2-3) sees the first block's rows, written before it runs
    order, visible = key_order(torch.tensor([5, 6, 6, 7]), cached, 2, 2, mask, 2, 16)
    assert order[1, :8].tolist() == [0, 1, 2, 3, 4, 5, 7, 8] and visible.sum(-1).tolist() == [7, 8]
    causal, _ = key_order(torch.tensor([5, 6]), cached, 0, 2, None, 2, 16)
    assert causal[1, :7].tolist() == list(range(7))


def test_a_row_that_sees_a_later_row_is_refused_and_the_cache_is_fixed():
    mask = torch.ones(2, 3 + 2, dtype=torch.bool)  # row 0 sees row 1: blocks in order cannot give it that key
    with pytest.raises(ValueError, match="sees a later row"):
        key_order(torch.tensor([3, 4]), 3, 0, 1, mask, 4, 16)
    model, _ = build_tiny_llama()
    lean = LeanLlama(model.float().eval(), max_positions=64, pack=False)
    lean.fix_shapes(8)
    fixed = fixed_shapes.capacity(64, 8)
    assert lean.new_cache(10).capacity == lean.new_cache(fixed).capacity == fixed  # one shape for every call
    with pytest.raises(ValueError, match="larger max_length"):
        lean.new_cache(fixed + 1)


@pytest.mark.parametrize("method", ["anpd", "self-draft"])
def test_decoding_in_blocks_of_few_rows_is_lossless(method, monkeypatch):
    """Blocks of 4 rows: prompts of up to 40 tokens and the n-gram trees run in several blocks each."""
    decoder = plain_tiny_decoder("pytorch", monkeypatch)
    decoder.model.fix_shapes(4)
    pairs = lossless_on_random_prompts(decoder, method, 24, cases=8)
    assert sum(len(out.tokens) for _, out in pairs) > sum(out.steps for _, out in pairs)  # guesses were accepted


def test_a_decoder_runs_fixed_shape_steps_off_the_cpu_by_default():
    chosen = []
    fake = SimpleNamespace(model=SimpleNamespace(fix_shapes=chosen.append))
    for device, asked in (("cuda", None), ("cuda", False), ("cpu", None), ("cpu", True), ("meta", None)):
        fake.device = torch.device(device)
        Decoder.fix_shapes(fake, asked)
    assert chosen == [fixed_shapes.ROWS, None, None, fixed_shapes.ROWS, None]
