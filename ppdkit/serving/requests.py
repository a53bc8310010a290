"""What an OpenAI-style request may ask of the server, checked: the request bodies (pydantic), the server's limits,
and the decoding options a request comes to (runtime/generate_options.py) or the 400 that says what cannot be served."""

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from ppdkit.runtime.decoder import Decoder
from ppdkit.runtime.generate_options import GenerateOptions


@dataclass(frozen=True)
class ServeLimits:
    max_tokens: int = 1024  # the most new tokens a request may ask for (and the default)
    max_request_bytes: int = 1_000_000
    max_waiting: int = 64  # requests queued behind those decoding
    max_batch: int = 64  # requests decoded together (runtime/batching/batch_engine.py)


class OpenAIRequest(BaseModel):
    # OpenAI clients send fields we do not use (user, logprobs: null, ...): ignored, but the ones that would
    # change the answer are checked in `generate_options`
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = 1
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    method: str | None = None
    tools: list | None = None  # refused: nothing here calls a tool
    functions: list | None = None  # tools' older form
    # refused where they ask for something (UNSERVED): ignoring them would answer another request than the one sent
    tool_choice: str | dict | None = None
    response_format: dict | None = None
    logprobs: bool | int | None = None  # a flag for chat, a count for completions
    top_logprobs: int | None = None
    logit_bias: dict | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant"]
    content: str  # OpenAI's list of content parts comes as its text (`text_of_parts`)

    @field_validator("role")
    @classmethod
    def _developer_is_system(cls, role: str) -> str:
        # OpenAI's system role for its newer models; chat templates know it as system
        return "system" if role == "developer" else role

    @field_validator("content", mode="before")
    @classmethod
    def _parts_as_text(cls, content):
        return text_of_parts(content) if isinstance(content, list) else content


TEXT_PART = '{"type": "text", "text": "..."}'


def text_of_parts(parts: list) -> str:
    """A message's content parts as one string: their texts, or a validation error naming the part that is no text
    part (an image, audio, a file: this server serves a text model)."""
    if not parts:
        raise PydanticCustomError("content_parts", f"no content parts: send a string or at least one {TEXT_PART}")
    for i, part in enumerate(parts):
        if not isinstance(part, dict):
            raise _part_error(i, f"is a {type(part).__name__}, not a content part like {TEXT_PART}")
        if part.get("type") != "text":
            raise _part_error(i, f"is of type {part.get('type')!r}: this server serves text parts only ({TEXT_PART}), "
                                 "no images, audio or files")
        if "text" not in part:
            raise _part_error(i, "has no 'text'")
        if not isinstance(part["text"], str):
            raise _part_error(i, f"has 'text' of type {type(part['text']).__name__}, not a string")
    # OpenAI does not document how a message's text parts join; vLLM and TensorRT-LLM, servers its clients talk to in
    # its place, join them with newlines, so the same request makes the same prompt here
    return "\n".join(part["text"] for part in parts)


def _part_error(index: int, what: str) -> PydanticCustomError:
    return PydanticCustomError("content_part", f"content part {index} {what}")


class ChatRequest(OpenAIRequest):
    messages: list[ChatMessage] = Field(min_length=1)


class CompletionRequest(OpenAIRequest):
    prompt: str = Field(min_length=1)


class RequestError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


def generate_options(request: OpenAIRequest, decoder: Decoder, limits: ServeLimits, default_method: str
                     ) -> GenerateOptions:
    """What `decoder.generate` is asked for this request, or RequestError(400) naming what cannot be served."""
    if request.n != 1:
        raise RequestError(400, f"n={request.n}: this server returns one choice per request; send n=1", "n")
    for name, given in (("tools", request.tools), ("functions", request.functions)):
        if given:
            raise RequestError(400, f"{name}: this server answers in text and calls no tools; send the request "
                                    f"without {name}", name)
    for name, (asks, why) in UNSERVED.items():
        if asks(getattr(request, name)):
            raise RequestError(400, f"{name}={getattr(request, name)!r}: {why}", name)
    if len(stops(request)) > MAX_STOPS or "" in stops(request):
        raise RequestError(400, f"stop: up to {MAX_STOPS} non-empty strings", "stop")
    if request.top_p != 1.0:
        raise RequestError(400, "top_p is not supported: sampling follows the base model's distribution at "
                                "`temperature`; leave top_p at 1", "top_p")
    asked = request.max_completion_tokens or request.max_tokens or limits.max_tokens
    if asked > limits.max_tokens:
        raise RequestError(400, f"max_tokens={asked} is above this server's cap of {limits.max_tokens} (ppdkit "
                                "serve --max-tokens)", "max_tokens")
    method = request.method or default_method
    if method not in decoder.methods():
        raise RequestError(400, f"method {method!r} is not served here; use one of {', '.join(decoder.methods())}",
                           "method")
    return GenerateOptions(max_new_tokens=asked, method=method, temperature=request.temperature, seed=request.seed)


MAX_STOPS = 4  # as OpenAI's API

# OpenAI's fields this server cannot honour: what a value that asks for something looks like, and what to send instead
# (their neutral values, which OpenAI's SDKs and LangChain send by default, pass)
UNSERVED = {
    "tool_choice": (lambda v: v not in (None, "none"), "this server calls no tools; leave tool_choice out or 'none'"),
    "response_format": (lambda v: v not in (None, {"type": "text"}),
                        "this server answers in free text (no JSON mode or schema); leave response_format out"),
    "logprobs": (bool, "this server returns no log-probabilities; leave logprobs out or false"),
    "top_logprobs": (bool, "this server returns no log-probabilities; leave top_logprobs out or 0"),
    "logit_bias": (bool, "this server decodes the base model's own distribution; leave logit_bias out"),
    "frequency_penalty": (bool, "this server decodes the base model's own distribution; leave it at 0"),
    "presence_penalty": (bool, "this server decodes the base model's own distribution; leave it at 0"),
}


def stops(request: OpenAIRequest) -> tuple[str, ...]:
    return (request.stop,) if isinstance(request.stop, str) else tuple(request.stop or ())


def chat_ids(decoder: Decoder, messages: list[ChatMessage]) -> list[int]:
    try:
        return decoder.tokenizer.apply_chat_template([m.model_dump() for m in messages], tokenize=True,
                                                     add_generation_prompt=True, return_dict=False)
    except Exception as error:  # a template that rejects the roles or their order
        raise RequestError(400, f"the model's chat template refused these messages: {error}", "messages") from None


