"""One conversation form for every source, and the bookkeeping of rows that could not be used.

Accepted row forms (JSON objects):
- ShareGPT: {"id"?, "conversations": [{"from": "human"|"gpt"|"system"|..., "value": str}, ...]}
- messages: {"id"?, "messages": [{"role": "user"|"assistant"|"system", "content": str}, ...]}; a user turn
            {"role": "user", "write": true} (no content) is written by the base model itself when the teacher
            regenerates (data_pipeline/regenerate.py; data.source magpie is made of them); a system turn
            {"role": "system", "content": ..., "steer": true} is read only while the model writes a user turn
            (data_pipeline/prompt_kinds.py) and left out of the conversation it answers
- MT-Bench: {"question_id"?, "turns": [str, ...]}   (the first turn: later ones answer a reply we lack)
- prompt:   {"task_id"?|"id"?, "prompt": str}      (one user turn, e.g. HumanEval)
"""

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

ROLES = ("system", "user", "assistant")
# ShareGPT speaker names seen in the wild -> chat-template roles
_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bard": "assistant",
                   "bing": "assistant", "assistant": "assistant", "model": "assistant", "system": "system"}


class MalformedRow(ValueError):
    """A row that cannot become a conversation; its message is the reason, counted in the report."""


@dataclass(frozen=True)
class Conversation:
    id: str
    messages: tuple[dict[str, str], ...]  # ({"role": ..., "content": ...}, ...)

    @property
    def first_user_turn(self) -> str:
        return next(m["content"] for m in self.messages if m["role"] == "user")

    def has_assistant_turn(self) -> bool:
        return any(m["role"] == "assistant" for m in self.messages)

    def has_turns_to_write(self) -> bool:
        """Whether a user turn is left for the model to write (a `write` mark): only regeneration can use it."""
        return any(map(to_write, self.messages))


def to_write(message: dict) -> bool:
    """Whether a message is a turn left for the model to write (_turn_to_write's mark)."""
    return bool(message.get("write"))


def steers(message: dict) -> bool:
    """Whether a message is a steering system prompt: read while the model writes a user turn, never answered to."""
    return bool(message.get("steer"))


@dataclass
class ReadReport:
    """What happened to every row of a source: kept, or skipped with a reason. Nothing vanishes silently."""

    source: str
    rows: int = 0
    kept: int = 0
    skipped: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)  # the first few skipped rows, for the log

    def keep(self) -> None:
        self.rows += 1
        self.kept += 1

    def skip(self, where: str, reason: str) -> None:
        self.rows += 1
        self.skipped[reason] += 1
        if len(self.examples) < 5:
            self.examples.append(f"{where}: {reason}")

    def merge(self, other: "ReadReport") -> None:
        self.rows += other.rows
        self.kept += other.kept
        self.skipped.update(other.skipped)
        self.examples.extend(other.examples[: max(0, 5 - len(self.examples))])

    def summary(self) -> dict[str, Any]:
        return {"source": self.source, "rows": self.rows, "kept": self.kept,
                "skipped": sum(self.skipped.values()), "skipped_by_reason": dict(self.skipped),
                "skipped_examples": list(self.examples)}

    def describe(self) -> str:
        text = f"{self.source}: {self.rows} rows, {self.kept} kept, {sum(self.skipped.values())} skipped"
        if self.skipped:
            text += " (" + ", ".join(f"{n} {reason}" for reason, n in self.skipped.most_common()) + ")"
        return text


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise MalformedRow(f"{what} is {type(value).__name__}, not a string")
    return value


def _turns(items: Any, role_key: str, text_key: str, roles: dict[str, str], form: str) -> list[dict[str, str]]:
    if not isinstance(items, list) or not items:
        raise MalformedRow(f"'{form}' is not a non-empty list")
    messages = []
    for turn in items:
        if isinstance(turn, dict) and turn.get("write") is True and form == "messages":
            messages.append(_turn_to_write(turn))
            continue
        if not isinstance(turn, dict) or role_key not in turn or text_key not in turn:
            raise MalformedRow(f"a '{form}' entry lacks '{role_key}'/'{text_key}'")
        role = roles.get(str(turn[role_key]).lower())
        if role is None:
            raise MalformedRow(f"unknown role {turn[role_key]!r}")
        message = {"role": role, "content": _text(turn[text_key], f"a '{form}' {text_key}")}
        if form == "messages" and turn.get("steer") is True:
            if role != "system":
                raise MalformedRow("only a system turn can be marked steer (it steers the user turns the model "
                                   "writes)")
            message["steer"] = True
        messages.append(message)
    return messages


def _turn_to_write(turn: dict) -> dict:
    """A user turn the model writes itself: {"role": "user", "write": true}, its content left empty until then."""
    if turn.get("role") != "user" or turn.get("content"):
        raise MalformedRow("only a user turn without content can be marked write (the model writes it; an assistant "
                           "turn is rewritten by teacher.regenerate anyway)")
    return {"role": "user", "content": "", "write": True}


def to_conversation(row: Any, fallback_id: str) -> Conversation:
    """Normalize one row of any accepted form; raises MalformedRow with the reason."""
    if not isinstance(row, dict):
        raise MalformedRow(f"row is {type(row).__name__}, not an object")
    row_id = str(row.get("id", row.get("question_id", row.get("task_id", fallback_id))))
    if "conversations" in row:
        messages = _turns(row["conversations"], "from", "value", _SHAREGPT_ROLES, "conversations")
    elif "messages" in row:
        messages = _turns(row["messages"], "role", "content", {r: r for r in ROLES}, "messages")
    elif "turns" in row:
        turns = row["turns"]
        if not isinstance(turns, list) or not turns:
            raise MalformedRow("'turns' is not a non-empty list")
        messages = [{"role": "user", "content": _text(t, "a turn")} for t in turns[:1]]
    elif "prompt" in row:
        messages = [{"role": "user", "content": _text(row["prompt"], "'prompt'")}]
    else:
        raise MalformedRow("no 'conversations', 'messages', 'turns' or 'prompt' key")
    if not any(m["role"] == "user" for m in messages):
        raise MalformedRow("no user turn")
    return Conversation(id=row_id, messages=tuple(messages))
