"""`ppdkit serve`: an OpenAI-compatible HTTP server (FastAPI + uvicorn) over the bundled decoder.

POST /v1/chat/completions and /v1/completions (streamed as server-sent events with "stream": true), GET
/v1/models, /health and /metrics (Prometheus text: requests, tokens, tokens/s, tokens per step). Beside
OpenAI's fields a request may name the decoding `method` (default: the server's, `auto` unless told).
temperature defaults to 0: greedy decoding, the base model's own tokens, which every method reproduces.
`stop` (up to 4 strings) ends the answer before the first of them, and the decoding with it; a streamed
answer holds back text that may begin a stop sequence until it is sure. A streaming client that leaves
stops its decode at the next step.

Requests are decoded one at a time, in a worker thread (Decoder.generate takes turns: on a CPU two decodes
at once only share its cores), so the server keeps answering /health while it decodes; at most
`max_waiting` requests wait, later ones get 503. Bad requests get 400 (413 when too large) in OpenAI's
error shape, saying what is wrong. Binds to 127.0.0.1 unless told otherwise.
"""

import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from ppdkit.runtime.decoder import Decoder, GenerateResult


@dataclass(frozen=True)
class ServeLimits:
    max_tokens: int = 1024  # the most new tokens a request may ask for (and the default)
    max_request_bytes: int = 1_000_000
    max_waiting: int = 16  # requests queued behind the one decoding


class _Request(BaseModel):
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

    role: str
    content: str


class ChatRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)


class CompletionRequest(_Request):
    prompt: str = Field(min_length=1)


class RequestError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


@dataclass
class ServerStats:
    requests: int = 0
    failed: int = 0
    tokens: int = 0
    steps: int = 0
    seconds: float = 0.0
    waiting: int = 0
    by_method: dict[str, int] = field(default_factory=dict)

    def add(self, result: GenerateResult) -> None:
        self.requests += 1
        self.tokens += len(result.tokens)
        self.steps += len(result.accepted_per_step)
        self.seconds += result.seconds
        self.by_method[result.method] = self.by_method.get(result.method, 0) + 1

    def prometheus(self, model: str) -> str:
        rate = self.tokens / self.seconds if self.seconds else 0.0
        per_step = self.tokens / self.steps if self.steps else 0.0
        lines = [
            "# HELP ppdkit_requests_total Requests decoded.", "# TYPE ppdkit_requests_total counter",
            f'ppdkit_requests_total{{model="{model}"}} {self.requests}',
            "# HELP ppdkit_failed_requests_total Requests refused or failed.", "# TYPE ppdkit_failed_requests_total counter",
            f'ppdkit_failed_requests_total{{model="{model}"}} {self.failed}',
            "# HELP ppdkit_generated_tokens_total New tokens decoded.", "# TYPE ppdkit_generated_tokens_total counter",
            f'ppdkit_generated_tokens_total{{model="{model}"}} {self.tokens}',
            "# HELP ppdkit_decode_seconds_total Time spent decoding.", "# TYPE ppdkit_decode_seconds_total counter",
            f'ppdkit_decode_seconds_total{{model="{model}"}} {self.seconds:.6f}',
            "# HELP ppdkit_tokens_per_second New tokens per second of decoding, over all requests.",
            "# TYPE ppdkit_tokens_per_second gauge", f'ppdkit_tokens_per_second{{model="{model}"}} {rate:.4f}',
            "# HELP ppdkit_tokens_per_step New tokens per model forward, over all requests.",
            "# TYPE ppdkit_tokens_per_step gauge", f'ppdkit_tokens_per_step{{model="{model}"}} {per_step:.4f}',
            "# HELP ppdkit_waiting_requests Requests queued behind the one decoding.",
            "# TYPE ppdkit_waiting_requests gauge", f'ppdkit_waiting_requests{{model="{model}"}} {self.waiting}',
            "# HELP ppdkit_requests_by_method_total Requests decoded, by the method that ran.",
            "# TYPE ppdkit_requests_by_method_total counter",
        ]
        lines += [f'ppdkit_requests_by_method_total{{model="{model}",method="{m}"}} {n}'
                  for m, n in sorted(self.by_method.items())]
        return "\n".join(lines) + "\n"


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


def _check_supported(request: _Request, decoder: Decoder, limits: ServeLimits, default_method: str) -> tuple[int, str]:
    """(max new tokens, method) of a request, or RequestError(400) naming what cannot be served."""
    if request.n != 1:
        raise RequestError(400, f"n={request.n}: this server returns one choice per request; send n=1", "n")
    if len(_stops(request)) > MAX_STOPS or "" in _stops(request):
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
    return asked, method


MAX_STOPS = 4  # as OpenAI's API


def _stops(request: _Request) -> tuple[str, ...]:
    return (request.stop,) if isinstance(request.stop, str) else tuple(request.stop or ())


def _chat_ids(decoder: Decoder, messages: list[ChatMessage]) -> list[int]:
    try:
        return decoder.tokenizer.apply_chat_template([m.model_dump() for m in messages], tokenize=True,
                                                     add_generation_prompt=True, return_dict=False)
    except Exception as error:  # a template that rejects the roles or their order
        raise RequestError(400, f"the model's chat template refused these messages: {error}", "messages") from None


def create_app(decoder: Decoder, name: str, default_method: str = "auto", limits: ServeLimits = ServeLimits()):
    """The FastAPI app serving `decoder` under the model name `name`."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from starlette.concurrency import run_in_threadpool

    app = FastAPI(title="ppdkit", description=f"{name} on ppdkit's lossless decoder", docs_url=None, redoc_url=None)
    stats = ServerStats()
    waiting = threading.Semaphore(limits.max_waiting + 1)  # the one decoding and those queued behind it

    def error(status: int, message: str, param: str | None = None) -> JSONResponse:
        stats.failed += 1
        kind = "invalid_request_error" if status < 500 else "server_error"
        return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": None}}, status)

    @app.exception_handler(RequestError)
    async def _request_error(_, exc: RequestError):
        return error(exc.status, exc.message, exc.param)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_, exc: RequestValidationError):
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'] if p != 'body') or 'body'}: {e['msg']}"
                             for e in exc.errors())
        return error(400, f"invalid request: {problems}")

    @app.middleware("http")
    async def _size_cap(request: Request, call_next):
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > limits.max_request_bytes:
            return error(413, f"the request has {size} bytes, above this server's cap of {limits.max_request_bytes} "
                              "(ppdkit serve --max-request-bytes)")
        return await call_next(request)

    def decode(ids: list[int], max_tokens: int, method: str, request: _Request, pieces: TextPieces,
               on_piece: Callable[[str], None], cancelled: threading.Event) -> GenerateResult:
        """Runs in a worker thread; waits its turn behind the request decoding. The answer's text goes to
        `on_piece` as `pieces` gives it out; decoding ends early at a stop sequence or once `cancelled` is set."""

        def stream(tokens: list[int]) -> None:
            if piece := pieces.add(tokens):
                on_piece(piece)

        try:
            result = decoder.generate(ids, max_tokens, method, stream=stream, temperature=request.temperature,
                                      seed=request.seed, should_stop=lambda: pieces.stopped or cancelled.is_set())
        except ValueError as e:  # a prompt that does not fit, a method this decoder cannot run
            raise RequestError(400, str(e)) from None
        finally:
            stats.waiting -= 1
            waiting.release()
        stats.add(result)
        return result

    def admit() -> None:
        if not waiting.acquire(blocking=False):
            raise RequestError(503, f"{limits.max_waiting} requests are already waiting; try again shortly")
        stats.waiting += 1

    def finish_reason(result: GenerateResult, max_tokens: int, pieces: TextPieces) -> str:
        ended = pieces.stopped or result.tokens[-1] in decoder.eos_ids()
        return "length" if len(result.tokens) >= max_tokens and not ended else "stop"

    def extras(result: GenerateResult) -> dict:
        return {"method": result.method, "steps": result.steps, "tokens_per_step": round(
            result.mean_accepted_per_step, 4), "tokens_per_second": round(len(result.tokens) / result.seconds, 2)}

    async def respond(ids: list[int], request: _Request, chat: bool):
        max_tokens, method = _check_supported(request, decoder, limits, default_method)
        try:  # a prompt too long for the model gets its 400 before a stream starts
            decoder.fit_prompt(ids, max_tokens, method, None)
        except ValueError as e:
            raise RequestError(400, str(e), "messages" if chat else "prompt") from None
        admit()
        rid, created = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}", int(time.time())
        kind = "chat.completion" if chat else "text_completion"
        pieces, cancelled = TextPieces(decoder.tokenizer, _stops(request)), threading.Event()
        if not request.stream:
            parts: list[str] = []
            result = await run_in_threadpool(decode, ids, max_tokens, method, request, pieces, parts.append, cancelled)
            text = "".join(parts) + pieces.rest()
            choice = ({"index": 0, "message": {"role": "assistant", "content": text}} if chat
                      else {"index": 0, "text": text, "logprobs": None})
            return {"id": rid, "object": kind, "created": created, "model": name,
                    "choices": [{**choice, "finish_reason": finish_reason(result, max_tokens, pieces)}],
                    "usage": {"prompt_tokens": len(ids), "completion_tokens": len(result.tokens),
                              "total_tokens": len(ids) + len(result.tokens)}, "ppdkit": extras(result)}
        # decoding starts now, not when the client first reads: an admitted request always ends and frees its turn
        loop, queue = asyncio.get_running_loop(), asyncio.Queue()

        def on_piece(piece: str) -> None:  # in the decoding thread
            loop.call_soon_threadsafe(queue.put_nowait, piece)

        job = asyncio.ensure_future(run_in_threadpool(decode, ids, max_tokens, method, request, pieces, on_piece,
                                                      cancelled))
        job.add_done_callback(lambda _: queue.put_nowait(None))
        return StreamingResponse(_events(queue, job, pieces, cancelled, len(ids), chat, max_tokens, rid, created),
                                 media_type="text/event-stream")

    async def _events(queue: asyncio.Queue, job: asyncio.Future, pieces: TextPieces, cancelled: threading.Event,
                      prompt_tokens: int, chat: bool, max_tokens: int, rid: str, created: int) -> AsyncIterator[str]:
        try:
            async for event in _answer_events(queue, job, pieces, prompt_tokens, chat, max_tokens, rid, created):
                yield event
        finally:  # the stream ended, or its client left: a decode still running stops at its next step
            cancelled.set()

    async def _answer_events(queue: asyncio.Queue, job: asyncio.Future, pieces: TextPieces, prompt_tokens: int,
                             chat: bool, max_tokens: int, rid: str, created: int) -> AsyncIterator[str]:
        kind = "chat.completion.chunk" if chat else "text_completion"

        def chunk(delta_text: str | None, reason: str | None = None, first: bool = False, **more) -> str:
            if chat:
                delta = {"role": "assistant", "content": ""} if first else (
                    {"content": delta_text} if delta_text is not None else {})
                choice = {"index": 0, "delta": delta, "finish_reason": reason}
            else:
                choice = {"index": 0, "text": delta_text or "", "finish_reason": reason, "logprobs": None}
            body = {"id": rid, "object": kind, "created": created, "model": name, "choices": [choice], **more}
            return f"data: {json.dumps(body)}\n\n"

        if chat:
            yield chunk(None, first=True)
        while (piece := await queue.get()) is not None:
            yield chunk(piece)
        try:
            result = job.result()
        except RequestError as e:
            yield f"data: {json.dumps({'error': {'message': e.message, 'type': 'invalid_request_error'}})}\n\n"
            return
        if rest := pieces.rest():
            yield chunk(rest)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(result.tokens),
                 "total_tokens": prompt_tokens + len(result.tokens)}
        yield chunk(None, finish_reason(result, max_tokens, pieces), usage=usage, ppdkit=extras(result))
        yield "data: [DONE]\n\n"

    @app.post("/v1/chat/completions")
    async def chat_completions(request: ChatRequest):
        return await respond(_chat_ids(decoder, request.messages), request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: CompletionRequest):
        return await respond(decoder.tokenizer(request.prompt, add_special_tokens=False)["input_ids"], request,
                             chat=False)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "ppdkit",
                                            "methods": decoder.methods()}]}

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": name, "default_method": default_method, "methods": decoder.methods(),
                "waiting": stats.waiting}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(stats.prometheus(name), media_type="text/plain; version=0.0.4")

    return app


def serve(decoder: Decoder, name: str, host: str, port: int, default_method: str, limits: ServeLimits) -> None:
    """Serve until interrupted (uvicorn's access log off: our own line says where)."""
    import uvicorn

    app = create_app(decoder, name, default_method, limits)
    print(f"serving {name} on http://{host}:{port}/v1 (methods: {', '.join(decoder.methods())}; default "
          f"{default_method}); Ctrl-C stops", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
