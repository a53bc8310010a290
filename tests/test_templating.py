import pytest

from ppdkit.data_pipeline.conversations import Conversation, MalformedRow
from ppdkit.data_pipeline.templating import TemplateError, encode_conversation

CONV = Conversation("a", (
    {"role": "system", "content": "Be nice."},
    {"role": "user", "content": "Hello there"},
    {"role": "assistant", "content": "Sure, here is a list"},
    {"role": "user", "content": "more"},
    {"role": "assistant", "content": "1. apples"},
))


def test_loss_mask_covers_exactly_the_assistant_turns(tiny_tokenizer):
    row = encode_conversation(tiny_tokenizer, CONV, max_length=512)
    assert row.input_ids == tiny_tokenizer.apply_chat_template(list(CONV.messages), tokenize=True, return_dict=False)
    learned = tiny_tokenizer.decode([t for t, m in zip(row.input_ids, row.loss_mask) if m])
    assert learned == "Sure, here is a list<|im_end|>\n1. apples<|im_end|>\n"
    not_learned = tiny_tokenizer.decode([t for t, m in zip(row.input_ids, row.loss_mask) if not m])
    assert "Hello there" in not_learned and "Sure" not in not_learned


def test_truncation_keeps_the_start(tiny_tokenizer):
    full = encode_conversation(tiny_tokenizer, CONV, max_length=512)
    cut = encode_conversation(tiny_tokenizer, CONV, max_length=40)
    assert cut.input_ids == full.input_ids[:40] and cut.loss_mask == full.loss_mask[:40]
    assert 0 < sum(cut.loss_mask) < sum(full.loss_mask)


def test_rows_with_nothing_to_learn_are_malformed(tiny_tokenizer):
    with pytest.raises(MalformedRow, match="no assistant tokens within max_length=10"):
        encode_conversation(tiny_tokenizer, CONV, max_length=10)
    with pytest.raises(MalformedRow, match="no assistant tokens"):
        encode_conversation(tiny_tokenizer, Conversation("b", ({"role": "user", "content": "hi"},)), 512)


def test_a_template_that_rewrites_history_is_refused(tiny_tokenizer):
    tok = tiny_tokenizer.__class__.from_pretrained(tiny_tokenizer.name_or_path)
    # Renders the message count up front: a prefix no longer renders as a prefix of the whole.
    tok.chat_template = "{{ messages|length }}{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
    with pytest.raises(TemplateError):
        encode_conversation(tok, CONV, 512)
