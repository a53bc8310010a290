"""The base model's own chat template, tokenized, with a loss mask on the assistant's tokens.

The mask marks each assistant turn's content and its end-of-turn marker (the model must learn to
stop), never the template's role headers or the user's words. Assistant spans are found in the
rendered text by rendering growing prefixes of the conversation, which works for any template whose
rendering of a prefix is a prefix of the whole rendering (ChatML, Llama, Mistral, ...).

Only the first max_length tokens are kept, so only as much text as holds them is tokenized: a long message
tokenized whole costs time and memory by its length, however few of its tokens are kept (docs/history.md).
"""

from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from .conversations import Conversation, MalformedRow

# Characters first tokenized per token kept (4x more while too few tokens come out), and the tokens
# past max_length that must come out too: merges are local (most tokenizers split words first), so only
# tokens near the cut can differ from the whole text's. The kept tokens equalled the whole text's on
# 10k ShareGPT and adversarial conversations (no spaces, digits, CJK, emoji) with both bundled tokenizers.
_CHARS_PER_TOKEN = 8
_MARGIN_TOKENS = 64


@dataclass(frozen=True)
class TokenizedConversation:
    id: str
    input_ids: list[int]
    loss_mask: list[int]  # 1 where the token is the assistant's (a training target), else 0


class TemplateError(ValueError):
    """The tokenizer's chat template cannot be used for loss masking (not a row problem)."""


def _render(tokenizer: PreTrainedTokenizerBase, messages: list[dict], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


# stands for a user turn's text while its header is rendered: no template writes it on its own
_TEXT_GOES_HERE = "PPDKIT-USER-TEXT-GOES-HERE"


def user_turn_prefix(tokenizer: PreTrainedTokenizerBase, messages: list[dict]) -> str:
    """The rendering of `messages` and then of a user turn's header, up to where its text starts: what the model
    continues to write that turn itself (a template's default system prompt included, as the decoder renders it)."""
    text = _render(tokenizer, [*messages, {"role": "user", "content": _TEXT_GOES_HERE}], generation_prompt=False)
    if _TEXT_GOES_HERE not in text:
        raise TemplateError("the chat template does not render a user turn's text as given, so the model cannot be "
                            "asked to write one (a user turn marked write)")
    return text[:text.index(_TEXT_GOES_HERE)]


def assistant_char_spans(tokenizer: PreTrainedTokenizerBase, messages: list[dict], text: str,
                         within: int) -> list[tuple[int, int]]:
    """[start, end) character spans in `text` (the whole rendering) of the assistant turns that start
    before character `within`: later ones cannot reach the tokens kept, and each costs two renders."""
    spans = []
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = _render(tokenizer, messages[:k], generation_prompt=True) if k else ""
        if len(before) >= within:
            break
        through = _render(tokenizer, messages[: k + 1], generation_prompt=False)
        if not text.startswith(through) or not through.startswith(before):
            raise TemplateError("the chat template does not render prefixes of a conversation as prefixes of "
                                "the whole, so assistant tokens cannot be located for the loss mask")
        spans.append((len(before), len(through)))
    return spans


def first_tokens(tokenizer: PreTrainedTokenizerBase, text: str,
                 max_length: int) -> tuple[list[int], list[tuple[int, int]]]:
    """(ids, character offsets) of the first `max_length` tokens of `text`, tokenizing a prefix that holds
    them with _MARGIN_TOKENS to spare, grown 4x at a time; a text shorter than the first guess is tokenized whole."""
    chars = (max_length + _MARGIN_TOKENS) * _CHARS_PER_TOKEN
    while True:
        whole = chars >= len(text)
        enc = tokenizer(text if whole else text[:chars], add_special_tokens=False, return_offsets_mapping=True)
        if whole or len(enc["input_ids"]) >= max_length + _MARGIN_TOKENS:
            return enc["input_ids"][:max_length], enc["offset_mapping"][:max_length]
        chars *= 4


def encode_conversation(
    tokenizer: PreTrainedTokenizerBase, conv: Conversation, max_length: int
) -> TokenizedConversation:
    """Template, tokenize, mask; keep the first `max_length` tokens. Raises MalformedRow when nothing is left
    to learn."""
    messages = list(conv.messages)
    if not messages:  # chat templates refuse an empty conversation with a ValueError of their own
        raise MalformedRow("no messages")
    text = _render(tokenizer, messages, generation_prompt=False)
    ids, offsets = first_tokens(tokenizer, text, max_length)
    spans = assistant_char_spans(tokenizer, messages, text, within=offsets[-1][1] if offsets else 0)
    mask = [int(any(start <= a and b <= end for start, end in spans) and b > a) for a, b in offsets]
    if not any(mask):
        raise MalformedRow("no assistant tokens" if not conv.has_assistant_turn()
                           else f"no assistant tokens within max_length={max_length}")
    return TokenizedConversation(id=conv.id, input_ids=list(ids), loss_mask=mask)


def supervised_positions(loss_mask: list[int]) -> list[int]:
    """Positions t whose next token t+1 is an assistant token: where the teacher's distribution is a target."""
    return [t for t in range(len(loss_mask) - 1) if loss_mask[t + 1]]
