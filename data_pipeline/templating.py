"""The base model's own chat template, tokenized, with a loss mask on the assistant's tokens.

The mask marks each assistant turn's content and its end-of-turn marker (the model must learn to
stop), never the template's role headers or the user's words. Assistant spans are found in the
rendered text by rendering growing prefixes of the conversation, which works for any template whose
rendering of a prefix is a prefix of the whole rendering (ChatML, Llama, Mistral, ...).
"""

from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from .conversations import Conversation, MalformedRow


@dataclass(frozen=True)
class TokenizedConversation:
    id: str
    input_ids: list[int]
    loss_mask: list[int]  # 1 where the token is the assistant's (a training target), else 0


class TemplateError(ValueError):
    """The tokenizer's chat template cannot be used for loss masking (not a row problem)."""


def _render(tokenizer: PreTrainedTokenizerBase, messages: list[dict], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def assistant_char_spans(tokenizer: PreTrainedTokenizerBase, conv: Conversation) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the [start, end) character spans of its assistant turns."""
    messages = list(conv.messages)
    text = _render(tokenizer, messages, generation_prompt=False)
    spans = []
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = _render(tokenizer, messages[:k], generation_prompt=True) if k else ""
        through = _render(tokenizer, messages[: k + 1], generation_prompt=False)
        if not text.startswith(through) or not through.startswith(before):
            raise TemplateError("the chat template does not render prefixes of a conversation as prefixes of "
                                "the whole, so assistant tokens cannot be located for the loss mask")
        spans.append((len(before), len(through)))
    return text, spans


def encode_conversation(
    tokenizer: PreTrainedTokenizerBase, conv: Conversation, max_length: int
) -> TokenizedConversation:
    """Template, tokenize, mask; keep the first `max_length` tokens. Raises MalformedRow when nothing is left to learn."""
    text, spans = assistant_char_spans(tokenizer, conv)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"][:max_length], enc["offset_mapping"][:max_length]
    mask = [int(any(start <= a and b <= end for start, end in spans) and b > a) for a, b in offsets]
    if not any(mask):
        raise MalformedRow("no assistant tokens" if not spans else f"no assistant tokens within max_length={max_length}")
    return TokenizedConversation(id=conv.id, input_ids=list(ids), loss_mask=mask)
