"""Batched decoding (ppdkit/runtime/batching/batched_decoding.py), greedy and sampled, and the regeneration built on it:
every answer is exactly `ar`'s (with the same seed, sampled)."""

import dataclasses
import random

import pytest
import torch
from conftest import kernels_or_skip

import ppdkit.runtime.batching.batched_decoding as batch_module
from ppdkit.data_pipeline.config import TeacherConfig
from ppdkit.data_pipeline.conversations import Conversation
from ppdkit.data_pipeline.regenerate import regenerate_conversations, turn_seed
from ppdkit.data_pipeline.templating import user_turn_prefix
from ppdkit.runtime.batching.batched_decoding import Request, decode_many
from ppdkit.runtime.decoder import Decoder
from ppdkit.runtime.forward.linear import SKINNY_MAX_ROWS

SEGMENT = 96


def _decoder(dtype: str) -> Decoder:
    module = kernels_or_skip("native")
    if dtype == "q4" and not module.quantized_available():
        pytest.skip("this CPU has no AVX512-VNNI: the block formats run what auto picks here")
    return Decoder.from_base("tiny-llama", dtype=dtype, max_length=SEGMENT + 64)


def _requests(decoder: Decoder, n: int, seed: int = 0) -> list[Request]:
    rng = random.Random(seed)
    vocab = decoder.model.vocab_size
    out = []
    for i in range(n):
        length = rng.choice([1, 3, 17, 40, 70])
        out.append(Request(i, [rng.randrange(3, vocab) for _ in range(length)], rng.choice([1, 5, 20, SEGMENT - 70])))
    return out


def _run(decoder: Decoder, requests: list[Request], slots: int, temperature: float = 0.0) -> dict[int, list[int]]:
    queue = list(requests)
    answers = decode_many(decoder.model, lambda: queue.pop(0) if queue else None, decoder.eos_ids(), slots, SEGMENT,
                          temperature=temperature)
    return {request.key: tokens for request, tokens in answers}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "q4"])  # q4: a block-format teacher regenerates on it
def test_every_batched_answer_is_ar_token_for_token(dtype):
    """30 prompts through 7 slots (slots refilled as answers end, neighbours of every length) against `ar` one
    prompt at a time: identical tokens, and identical again with another number of slots."""
    decoder = _decoder(dtype)
    requests = _requests(decoder, 30)
    batched = _run(decoder, requests, slots=7)
    assert sorted(batched) == list(range(30))
    for request in requests:
        alone = decoder.generate(request.ids, max_new_tokens=request.max_new_tokens, method="ar").tokens
        assert batched[request.key] == alone, request.key
    assert _run(decoder, requests, slots=3) == batched
    assert sum(len(t) for t in batched.values()) > 300  # the answers are long enough to say something


@pytest.mark.parametrize("dtype", ["float32", "q4"])
def test_every_sampled_batched_answer_is_ar_sampled_alone_with_its_seed(dtype):
    """Sampled at a temperature, each request draws from its own row with its own seed: its answer is `ar`'s alone
    with that seed, whatever its neighbours and the number of slots; another seed gives other answers."""
    decoder = _decoder(dtype)
    requests = [dataclasses.replace(r, seed=1000 + r.key) for r in _requests(decoder, 16, seed=3)]
    sampled = _run(decoder, requests, slots=5, temperature=0.8)
    for request in requests:
        alone = decoder.generate(request.ids, max_new_tokens=request.max_new_tokens, method="ar", temperature=0.8,
                                 seed=request.seed).tokens
        assert sampled[request.key] == alone, request.key
    assert _run(decoder, requests, slots=2, temperature=0.8) == sampled
    reseeded = _run(decoder, [dataclasses.replace(r, seed=r.seed + 1) for r in requests], slots=5, temperature=0.8)
    assert reseeded != sampled and _run(decoder, requests, slots=5) != sampled  # neither greedy nor the same draws


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "q4"])
def test_a_request_that_continues_a_finished_one_reads_only_its_new_tokens(dtype, monkeypatch):
    """A follow-up request (an answered prompt, its answer and new tokens: a conversation's next turn) takes the
    segment its prompt left and reads only what is new, and its answer is still `ar`'s token for token."""
    decoder = _decoder(dtype)
    reused = {}  # prompt ids -> the positions its segment gave it
    choose = batch_module._segment_for
    monkeypatch.setattr(batch_module, "_segment_for",
                        lambda ids, free, held: reused.setdefault(tuple(ids), choose(ids, free, held)))
    rng = random.Random(1)
    queue = _requests(decoder, 12, seed=1)
    answered = []
    for request, tokens in decode_many(decoder.model, lambda: queue.pop(0) if queue else None, decoder.eos_ids(),
                                       slots=3, segment=SEGMENT):
        answered.append((request, tokens))
        follow = request.ids + tokens + [rng.randrange(3, decoder.model.vocab_size) for _ in range(rng.choice([1, 6]))]
        if isinstance(request.key, int) and len(follow) + 8 <= SEGMENT:
            queue.insert(0, Request(("next", request.key), follow, 8))  # first in line, as regeneration queues turns
    firsts = {request.key: request.ids + tokens for request, tokens in answered if isinstance(request.key, int)}
    follow_ups = [request for request, _ in answered if not isinstance(request.key, int)]
    assert len(follow_ups) >= 5
    for request in follow_ups:  # all of its first turn but the answer's last token (never fed back)
        assert reused[tuple(request.ids)][1] == len(firsts[request.key[1]]) - 1, request.key
    for request, tokens in answered:
        assert tokens == decoder.generate(request.ids, max_new_tokens=request.max_new_tokens, method="ar").tokens


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "q4"])
def test_a_prompt_read_after_its_reused_prefix_leaves_what_a_whole_prefill_writes(dtype):
    """The segment of a prompt read after the positions it reuses holds, bit for bit, the keys/values of a
    prefill of the whole prompt, and gives the same first token (another prompt read in between)."""
    model = _decoder(dtype).model
    rng = random.Random(2)

    def ids(n: int) -> list[int]:
        return [rng.randrange(3, model.vocab_size) for _ in range(n)]

    cache, scratch = model.new_cache(3 * SEGMENT), model.new_cache(SEGMENT)
    first = Request("first", ids(30), 4)
    greedy = batch_module.Sampling()
    batch_module._prefill(model, cache, scratch, first, 0, SEGMENT, greedy)
    batch_module._prefill(model, cache, scratch, Request("other", ids(50), 4), SEGMENT, SEGMENT, greedy)
    follow = Request("follow", first.ids + ids(41), 4)
    part = batch_module._prefill(model, cache, scratch, follow, 0, SEGMENT, greedy, reuse=30)
    whole = batch_module._prefill(model, cache, scratch, follow, 2 * SEGMENT, SEGMENT, greedy)
    n = len(follow.ids)
    assert part.tokens == whole.tokens and part.length == whole.length == n
    assert torch.equal(cache.k[..., :n], cache.k[..., 2 * SEGMENT:2 * SEGMENT + n])
    assert torch.equal(cache.v[:, :, :n], cache.v[:, :, 2 * SEGMENT:2 * SEGMENT + n])


def test_requests_that_cannot_be_batched_are_refused_clearly():
    decoder = _decoder("float32")
    with pytest.raises(ValueError, match="do not fit a segment"):
        _run(decoder, [Request("long", [5] * 90, 10)], slots=2)
    with pytest.raises(ValueError, match="slots must be between 1 and"):
        _run(decoder, [], slots=SKINNY_MAX_ROWS + 1)


def test_the_teacher_config_allows_no_more_slots_than_the_kernels_take():
    assert TeacherConfig.model_fields["generate_batch"].metadata[-1].le == SKINNY_MAX_ROWS
    with pytest.raises(ValueError, match="less than or equal"):
        TeacherConfig(generate_batch=SKINNY_MAX_ROWS + 1)


def _two_turn_conversations(topics: list[str]) -> list[Conversation]:
    return [Conversation(f"c{i}", ({"role": "user", "content": f"question {i} about {w}"},
                                   {"role": "assistant", "content": "an old answer"},
                                   {"role": "user", "content": "and then?"},
                                   {"role": "assistant", "content": "another old answer"}))
            for i, w in enumerate(topics)]


def _history(tok, conv: Conversation, turn: int) -> list[int]:
    """The prompt ids an assistant turn answered: the conversation before it, with the generation prompt."""
    return tok.apply_chat_template(list(conv.messages[:turn]), tokenize=True, add_generation_prompt=True,
                                   return_dict=False)


def test_batched_regeneration_is_greedy_decoding_of_every_turn():
    """Multi-turn conversations regenerated on the runtime: each assistant turn is `ar`'s answer to the
    conversation so far (the model's own earlier turns included), whatever the number of slots."""
    decoder = _decoder("float32")
    tok = decoder.tokenizer
    convs = _two_turn_conversations(["cats", "rust", "ray", "tea", "maps"])
    kwargs = dict(max_new_tokens=12, max_length=SEGMENT, temperature=0.0, seed=0)
    new = regenerate_conversations(None, tok, convs, batch_size=2, runtime=decoder.model, **kwargs)
    assert regenerate_conversations(None, tok, convs, batch_size=5, runtime=decoder.model, **kwargs) == new
    for conv in new:
        assert [m["role"] for m in conv.messages] == ["user", "assistant", "user", "assistant"]
        for turn in (1, 3):
            answer = decoder.generate(_history(tok, conv, turn), max_new_tokens=12, method="ar")
            assert conv.messages[turn]["content"] == answer.text


def test_sampled_regeneration_runs_on_the_runtime_each_turn_ar_with_its_own_seed():
    """teacher.temperature > 0 on the runtime: each assistant turn is `ar` sampled alone with turn_seed(seed,
    conversation, turn), so the same seed gives the same conversations with any number of slots, another seed others."""
    decoder = _decoder("float32")
    tok = decoder.tokenizer
    convs = _two_turn_conversations(["cats", "rust", "ray", "tea"])
    kwargs = dict(max_new_tokens=12, max_length=SEGMENT, temperature=0.9)
    new = regenerate_conversations(None, tok, convs, batch_size=3, runtime=decoder.model, seed=7, **kwargs)
    assert regenerate_conversations(None, tok, convs, batch_size=1, runtime=decoder.model, seed=7, **kwargs) == new
    assert regenerate_conversations(None, tok, convs, batch_size=3, runtime=decoder.model, seed=8, **kwargs) != new
    for conv in new:
        for answer, turn in ((0, 1), (1, 3)):
            alone = decoder.generate(_history(tok, conv, turn), max_new_tokens=12, method="ar", temperature=0.9,
                                     seed=turn_seed(7, conv.id, answer))
            assert conv.messages[turn]["content"] == alone.text


def test_user_turns_marked_write_are_the_models_own_samples_then_answered():
    """Magpie: a user turn marked write is `ar` sampled alone from the template's user header at the prompt
    temperature with turn_seed(seed, conversation, turn, "user"); its answer is greedy `ar` of the conversation so
    far. Any number of slots gives the same conversations, another seed other prompts, and no mark is left."""
    decoder = _decoder("float32")
    tok = decoder.tokenizer
    to_write = {"role": "user", "content": "", "write": True}
    convs = [Conversation(f"m{i}", (to_write, {"role": "assistant", "content": ""}, to_write,
                                    {"role": "assistant", "content": ""})) for i in range(4)]
    kwargs = dict(max_new_tokens=10, max_length=SEGMENT, temperature=0.0, prompt_temperature=0.9)
    new = regenerate_conversations(None, tok, convs, batch_size=3, runtime=decoder.model, seed=5, **kwargs)
    assert regenerate_conversations(None, tok, convs, batch_size=1, runtime=decoder.model, seed=5, **kwargs) == new
    assert regenerate_conversations(None, tok, convs, batch_size=3, runtime=decoder.model, seed=6, **kwargs) != new
    assert len({c.messages[0]["content"] for c in new}) > 1  # each conversation draws its own prompt
    assert any(len(c.messages) == 4 for c in new)  # (an empty written prompt would end its conversation there)
    for conv in new:
        assert not conv.has_turns_to_write()
        assert [m["role"] for m in conv.messages] == ["user", "assistant", "user", "assistant"][:len(conv.messages)]
        for turn, written in ((0, 0), (2, 1)):
            if turn >= len(conv.messages):
                continue
            header = tok(user_turn_prefix(tok, list(conv.messages[:turn])), add_special_tokens=False)["input_ids"]
            alone = decoder.generate(header, max_new_tokens=10, method="ar", temperature=0.9,
                                     seed=turn_seed(5, conv.id, written, "user"))
            assert conv.messages[turn]["content"] == alone.text.strip()
            if turn + 1 < len(conv.messages):
                answer = decoder.generate(_history(tok, conv, turn + 1), max_new_tokens=10, method="ar")
                assert conv.messages[turn + 1]["content"] == answer.text


def test_a_steering_system_prompt_shapes_the_written_prompt_but_not_its_answer():
    """Magpie by kind: a system turn marked steer is read while the model writes the user turn (`ar` sampled from the
    user header after it) and left out of what the answer is written to and of the conversation kept, so the answer
    is greedy `ar` of the written prompt alone, as the decoder would be asked it."""
    decoder = _decoder("float32")
    tok = decoder.tokenizer
    steer = {"role": "system", "content": "Users ask you to write Python code.", "steer": True}
    convs = [Conversation(f"k{i}", (steer, {"role": "user", "content": "", "write": True},
                                    {"role": "assistant", "content": ""})) for i in range(3)]
    new = regenerate_conversations(None, tok, convs, batch_size=2, runtime=decoder.model, seed=3, max_new_tokens=10,
                                   max_length=SEGMENT, temperature=0.0, prompt_temperature=0.9)
    for conv in new:
        assert [m["role"] for m in conv.messages] == ["user", "assistant"]
        assert not any(m.get("steer") for m in conv.messages)
        header = tok(user_turn_prefix(tok, [steer]), add_special_tokens=False)["input_ids"]
        written = decoder.generate(header, max_new_tokens=10, method="ar", temperature=0.9,
                                   seed=turn_seed(3, conv.id, 0, "user"))
        assert conv.messages[0]["content"] == written.text.strip()
        answer = decoder.generate(_history(tok, conv, 1), max_new_tokens=10, method="ar")
        assert conv.messages[1]["content"] == answer.text
