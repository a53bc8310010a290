"""A streamed answer's text, piece by piece, as its tokens are verified: held back where a character or a stop
sequence is not complete yet."""


class TextPieces:
    """New tokens -> the text they add. Held back: an incomplete UTF-8 character (a token may end mid-character)
    and an end of the text that may begin a stop sequence; the answer ends before the first stop sequence
    (`stopped` then turns True, and the decoder is asked to stop)."""

    def __init__(self, tokenizer, stops: tuple[str, ...] = ()):
        self.tokenizer, self.tokens, self.stops = tokenizer, [], stops
        self.sent = 0  # characters of the text given out so far
        self.stopped = False

    def add(self, tokens: list[int]) -> str:
        if self.stopped:
            return ""
        self.tokens += tokens
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        found = [at for stop in self.stops if (at := text.find(stop)) >= 0]
        if found:
            self.stopped, end = True, min(found)
        elif text.endswith("\ufffd"):
            return ""
        else:  # the longest end of the text that is the start of a stop sequence waits for what follows
            end = len(text) - max((k for stop in self.stops for k in range(1, len(stop)) if text.endswith(stop[:k])),
                                  default=0)
        piece, self.sent = text[self.sent:end], max(self.sent, end)
        return piece

    def rest(self) -> str:
        """What was held back, once the answer is complete (a byte sequence that never became a character, the
        start of a stop sequence that never came)."""
        if self.stopped:
            return ""
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        piece, self.sent = text[self.sent:], len(text)
        return piece
