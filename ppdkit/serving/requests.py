"""What an OpenAI-style request may ask of the server, checked: the request bodies (pydantic), the server's limits,
and the decoding options a request comes to (runtime/generate_options.py) or the 400 that says what cannot be served."""

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ppdkit.runtime.decoder import Decoder
from ppdkit.runtime.generate_options import GenerateOptions


@dataclass(frozen=True)
class ServeLimits:
    max_tokens: int = 1024  # the most new tokens a request may ask for (and the default)
    max_request_bytes: int = 1_000_000
    max_waiting: int = 64  # requests queued behind those decoding
    max_batch: int = 64  # requests decoded together (runtime/batch_engine.py)


class OpenAIRequest(BaseModel):
    # OpenAI clients send fields we do not use (user, logprobs: null, ...): ignored, but the ones that would
    # change the answer are checked in `_check_supported`
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


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant"]
    content: str


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


def stops(request: OpenAIRequest) -> tuple[str, ...]:
    return (request.stop,) if isinstance(request.stop, str) else tuple(request.stop or ())


def chat_ids(decoder: Decoder, messages: list[ChatMessage]) -> list[int]:
    try:
        return decoder.tokenizer.apply_chat_template([m.model_dump() for m in messages], tokenize=True,
                                                     add_generation_prompt=True, return_dict=False)
    except Exception as error:  # a template that rejects the roles or their order
        raise RequestError(400, f"the model's chat template refused these messages: {error}", "messages") from None


