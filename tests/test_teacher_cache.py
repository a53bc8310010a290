"""The compressed teacher form: what it keeps, what it loses (reported as a KL), and its files."""

import pytest
import torch

from ppdkit.data_pipeline.teacher_cache import (HEAD_ROWS, STORAGE_DTYPES, ShardSequence, compress_head,
                                                compress_logits, id_dtype, read_shard, reconstruct_logprobs,
                                                write_shard)
from ppdkit.models.tiny import build_tiny_llama


def _kl(p_log: torch.Tensor, q_log: torch.Tensor) -> torch.Tensor:
    return (p_log.exp() * (p_log - q_log)).sum(-1)  # [P]


def test_compression_keeps_the_top_and_the_exact_rest_mass():
    torch.manual_seed(0)
    logits = torch.randn(5, 100) * 3
    ids, logp, rest = compress_logits(logits, k=10)
    full = torch.log_softmax(logits, -1)
    assert torch.equal(ids, full.topk(10).indices)
    assert torch.allclose(logp, full.gather(1, ids))
    assert torch.allclose(rest + logp.exp().sum(-1), torch.ones(5), atol=1e-6)
    assert (logp[:, :-1] >= logp[:, 1:]).all()


@pytest.mark.parametrize("positions", [1, HEAD_ROWS, 2 * HEAD_ROWS + 5])
def test_the_head_in_blocks_compresses_as_the_whole_product(positions):
    """compress_head cuts the positions into blocks of HEAD_ROWS; every position keeps its own row's result."""
    g = torch.Generator().manual_seed(positions)
    hidden, weight = torch.randn(positions, 8, generator=g), torch.randn(100, 8, generator=g)
    head = lambda h: (h[:, None, :] * weight).sum(-1)  # [P, V]: each row computed alone, whatever the block
    for blocked, whole in zip(compress_head(head, hidden, 10), compress_logits(head(hidden), 10), strict=True):
        assert torch.equal(blocked, whole)


def test_reconstruction_is_exact_with_the_whole_vocabulary():
    logits = torch.randn(3, 50)
    ids, logp, rest = compress_logits(logits, k=50)
    assert torch.allclose(reconstruct_logprobs(ids, logp, rest, 50), torch.log_softmax(logits, -1), atol=1e-5)


def test_kl_of_reconstruction_on_a_real_model_shrinks_with_k(capsys):
    model, tok = build_tiny_llama()
    ids = torch.tensor([tok("Sure, here is a list: 1. apples 2. oranges. The quick brown fox.")["input_ids"]])
    with torch.no_grad():
        logits = model(ids).logits[0] * 40  # sharpen the random model's near-uniform outputs into LLM-like ones
    full = torch.log_softmax(logits, -1)
    kls = {}
    for k in (8, 32, 64, 128):
        t_ids, t_logp, rest = compress_logits(logits, k)
        kls[k] = _kl(full, reconstruct_logprobs(t_ids, t_logp.half().float(), rest, logits.shape[-1])).mean().item()
    with capsys.disabled():
        print("\nKL(full || reconstructed), tiny model, by k:", {k: f"{v:.2e}" for k, v in kls.items()})
    assert kls[8] > kls[32] > kls[64] > kls[128] >= 0
    assert kls[64] < 0.05


@pytest.mark.parametrize("dtype,vocab", [("float16", 300), ("bfloat16", 300), ("float32", 70000)])
def test_shard_round_trip(tmp_path, dtype, vocab):
    torch.manual_seed(1)
    seqs = []
    for row, (n_tok, n_pos) in enumerate([(7, 3), (5, 0), (9, 6)]):
        ids, logp, rest = compress_logits(torch.randn(n_pos, vocab), k=4)
        seqs.append(ShardSequence(row=10 + row, input_ids=torch.randint(0, vocab, (n_tok,)),
                                  positions=torch.arange(n_pos), topk_ids=ids, topk_logprobs=logp, rest_mass=rest))
    record = write_shard(tmp_path / "s.safetensors", seqs, vocab_size=vocab, dtype=dtype)
    assert record["sequences"] == 3 and record["positions"] == 9 and record["tokens"] == 21
    assert not list(tmp_path.glob(".*tmp"))  # the temporary file was renamed, not left behind
    back = list(read_shard(tmp_path / "s.safetensors"))
    for a, b in zip(seqs, back):  # the distributions come back memory-mapped, in the dtypes stored
        assert b.topk_ids.dtype == id_dtype(vocab) and b.topk_logprobs.dtype == STORAGE_DTYPES[dtype]
        assert a.row == b.row and torch.equal(a.input_ids, b.input_ids) and torch.equal(a.topk_ids, b.topk_ids.long())
        assert torch.equal(a.positions, b.positions)
        assert torch.allclose(a.topk_logprobs, b.topk_logprobs.float(), atol=1e-2)
        assert torch.equal(a.rest_mass, b.rest_mass)
