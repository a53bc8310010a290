"""Batched greedy decoding (runtime/batch.py) and the regeneration built on it: every answer is exactly `ar`'s."""

import random

import pytest
from conftest import kernels_or_skip

from ppdkit.data_pipeline.config import TeacherConfig
from ppdkit.data_pipeline.conversations import Conversation
from ppdkit.data_pipeline.regenerate import regenerate_conversations
from ppdkit.runtime.batch import Request, greedy_many
from ppdkit.runtime.decoder import Decoder
from ppdkit.runtime.linear import SKINNY_MAX_ROWS

SEGMENT = 96


def _decoder(dtype: str) -> Decoder:
    module = kernels_or_skip("native")
    if dtype == "bfloat16" and not module.bf16_available():
        pytest.skip("this CPU has no AVX512-BF16: bfloat16 runs the float32 path here")
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


def _run(decoder: Decoder, requests: list[Request], slots: int) -> dict[int, list[int]]:
    queue = list(requests)
    answers = greedy_many(decoder.model, lambda: queue.pop(0) if queue else None, decoder._eos_ids(), slots, SEGMENT)
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


def test_batched_regeneration_is_greedy_decoding_of_every_turn():
    """Multi-turn conversations regenerated on the runtime: each assistant turn is `ar`'s answer to the
    conversation so far (the model's own earlier turns included), whatever the number of slots."""
    decoder = _decoder("float32")
    tok = decoder.tokenizer
    convs = [Conversation(f"c{i}", ({"role": "user", "content": f"question {i} about {w}"},
                                    {"role": "assistant", "content": "an old answer"},
                                    {"role": "user", "content": "and then?"},
                                    {"role": "assistant", "content": "another old answer"}))
             for i, w in enumerate(["cats", "rust", "ray", "tea", "maps"])]
    kwargs = dict(max_new_tokens=12, max_length=SEGMENT, temperature=0.0, seed=0)
    new = regenerate_conversations(None, tok, convs, batch_size=2, runtime=decoder.model, **kwargs)
    assert regenerate_conversations(None, tok, convs, batch_size=5, runtime=decoder.model, **kwargs) == new
    for conv in new:
        assert [m["role"] for m in conv.messages] == ["user", "assistant", "user", "assistant"]
        for turn in (1, 3):
            history = tok.apply_chat_template(list(conv.messages[:turn]), tokenize=True, add_generation_prompt=True,
                                              return_dict=False)
            answer = decoder.generate(history, max_new_tokens=12, method="ar")
            assert conv.messages[turn]["content"] == answer.text
