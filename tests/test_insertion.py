"""Multi-insertion must give, for every group, exactly what one insertion on a truncated sequence gives."""

import random

import pytest
import torch

from ppdkit.data_pipeline.teacher_cache import ShardSequence, compress_logits
from ppdkit.models.prompt_tokens import init_from_token_embeddings
from ppdkit.models.tiny import build_tiny_llama
from ppdkit.trainer.prompt_batch import collate, collate_at
from ppdkit.trainer.insertion import build_layout
from ppdkit.trainer.student import student_logprobs


@pytest.fixture(scope="module")
def tiny():
    model, _ = build_tiny_llama()
    return model.double().eval()


def _sequence(length: int, vocab: int, seed: int) -> ShardSequence:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (length,), generator=gen)
    positions = torch.arange(length // 3, length - 1)  # the last two thirds are "assistant" positions
    top_ids, top_logp, rest = compress_logits(torch.randn(len(positions), vocab, generator=gen), 8)
    return ShardSequence(0, ids, positions, top_ids, top_logp, rest)


def test_layout_by_hand():
    lay = build_layout(seq_len=4, insert_after=[1, 3], k=2, n=1, mask="ensemble")
    assert lay.position_ids.tolist() == [0, 1, 2, 3, 2, 3, 4, 5]
    assert lay.group_slots.tolist() == [[4, 5], [6, 7]]
    a = lay.allowed.int()
    assert a[:4, 4:].sum() == 0  # ordinary tokens never see prompt tokens
    assert a[4].tolist() == [1, 1, 0, 0, 1, 0, 0, 0]  # group 1, distance 1: prefix 0..1 and itself
    assert a[5].tolist() == [1, 1, 0, 0, 1, 1, 0, 0]
    assert a[7].tolist() == [1, 1, 1, 1, 0, 0, 1, 1]  # group 2 never sees group 1


@pytest.mark.parametrize("k,n,mask", [(3, 1, "ensemble"), (2, 3, "ensemble"), (2, 2, "decoder"), (3, 2, "encoder")])
def test_every_group_equals_a_single_truncated_insertion(tiny, k, n, mask):
    vocab = tiny.config.vocab_size
    seqs = [_sequence(30, vocab, 1), _sequence(22, vocab, 2)]
    emb = init_from_token_embeddings(tiny.get_input_embeddings(), k, n, seed=3).double().reshape(k * n, -1)
    multi = collate(seqs, k, n, groups=5, mask=mask, rng=random.Random(0))
    logp = student_logprobs(tiny, emb, None, k, n, multi)  # [B, G, k, V]
    checked = 0
    for b, seq in enumerate(seqs):
        points = [int(multi.position_ids[b, slots[0]]) - 1 for slots, ok in zip(multi.group_slots[b], multi.group_valid[b]) if ok]
        for g, t in enumerate(points):
            truncated = ShardSequence(0, seq.input_ids[:t + 1], seq.positions, seq.topk_ids, seq.topk_logprobs, seq.rest_mass)
            single = collate_at([truncated], k, n, mask, [[t]])
            ref = student_logprobs(tiny, emb, None, k, n, single)[0, 0]
            assert torch.allclose(logp[b, g], ref, atol=1e-9), (b, g, t)
            checked += 1
    assert checked == 10


def test_plain_causal_model_agrees_with_one_ept(tiny):
    """n=1: the EPT mask is causal, so appending the prompt tokens to a cut sequence is a plain forward."""
    k, vocab = 3, tiny.config.vocab_size
    seq = _sequence(25, vocab, 5)
    emb = init_from_token_embeddings(tiny.get_input_embeddings(), k, 1, seed=4).double().reshape(k, -1)
    batch = collate([seq], k, 1, groups=4, mask="ensemble", rng=random.Random(1))
    logp = student_logprobs(tiny, emb, None, k, 1, batch)
    for g in range(4):
        t = int(batch.position_ids[0, batch.group_slots[0, g, 0]]) - 1
        x = torch.cat([tiny.get_input_embeddings()(seq.input_ids[:t + 1]), emb])[None]
        with torch.no_grad():
            ref = torch.log_softmax(tiny(inputs_embeds=x).logits[0, -k:].float(), -1)
        assert torch.allclose(logp[0, g].float(), ref, atol=1e-5)


def test_ordinary_tokens_keep_the_base_models_outputs(tiny):
    k, n, vocab = 2, 2, tiny.config.vocab_size
    seq = _sequence(20, vocab, 7)
    batch = collate([seq], k, n, groups=6, mask="ensemble", rng=random.Random(2))
    emb = torch.randn(k * n, tiny.config.hidden_size, dtype=torch.float64)
    x = torch.where((batch.ept_slot >= 0)[..., None], emb[batch.ept_slot.clamp_min(0)],
                    tiny.get_input_embeddings()(batch.input_ids))
    with torch.no_grad():
        with_prompts = tiny(inputs_embeds=x, attention_mask=batch.mask(x.dtype), position_ids=batch.position_ids).logits
        plain = tiny(seq.input_ids[None]).logits
    assert torch.allclose(with_prompts[0, :20], plain[0], atol=1e-10)


def test_groups_after_a_padding_gap_see_only_their_prefix():
    lay = build_layout(seq_len=3, insert_after=[2], k=2, n=1, mask="ensemble", groups_start=5)
    assert lay.group_slots.tolist() == [[5, 6]]
    assert lay.position_ids.tolist() == [0, 1, 2, 0, 0, 3, 4]
    a = lay.allowed.int()
    assert a[3].tolist() == [0, 0, 0, 1, 0, 0, 0]  # padding attends to itself only
    assert a[6].tolist() == [1, 1, 1, 0, 0, 1, 1]
    with pytest.raises(ValueError, match="overlap"):
        build_layout(seq_len=4, insert_after=[1], k=2, n=1, mask="ensemble", groups_start=3)


def test_two_pass_gradient_equals_one_full_forward(tiny):
    """The student runs the ordinary tokens without autograd; the gradient must not change by it."""
    k, n, vocab = 2, 2, tiny.config.vocab_size
    seqs = [_sequence(26, vocab, 8), _sequence(6, vocab, 9)]  # the short one has fewer points than groups
    batch = collate(seqs, k, n, groups=4, mask="ensemble", rng=random.Random(3))
    assert not batch.group_valid.all()  # padding groups take part (and must not break the two passes)
    start = init_from_token_embeddings(tiny.get_input_embeddings(), k, n, seed=5).double().reshape(k * n, -1)
    target = torch.randn(2, 4, k, vocab, dtype=torch.float64) * batch.group_valid[..., None, None]

    emb = start.clone().requires_grad_(True)
    (student_logprobs(tiny, emb, None, k, n, batch) * target).sum().backward()

    ref_emb = start.clone().requires_grad_(True)
    x = torch.where((batch.ept_slot >= 0)[..., None], ref_emb[batch.ept_slot.clamp_min(0)],
                    tiny.get_input_embeddings()(batch.input_ids))
    hidden = tiny.get_decoder()(inputs_embeds=x, attention_mask=batch.mask(x.dtype),
                                position_ids=batch.position_ids).last_hidden_state
    per_token = hidden[torch.arange(2)[:, None, None], batch.group_slots].reshape(2, 4, k, n, -1).mean(3)
    ref = torch.log_softmax(tiny.get_output_embeddings()(per_token), -1)
    (ref * target).sum().backward()
    assert emb.grad.abs().max() > 0
    # HF's attention takes its softmax in float32 even for a float64 model, so shapes that differ by a
    # pass round differently at ~1e-7; a wrong prefix or mask would differ at order 1.
    assert torch.allclose(emb.grad, ref_emb.grad, rtol=1e-5, atol=1e-5), (emb.grad - ref_emb.grad).abs().max()
