"""`ppdkit serve`: an OpenAI-compatible HTTP server (FastAPI + uvicorn) over the bundled decoder.

POST /v1/chat/completions and /v1/completions (streamed as server-sent events with "stream": true), GET
/v1/models, /health and /metrics (Prometheus text: requests, tokens, tokens/s, tokens per step). Beside
OpenAI's fields a request may name the decoding `method` (default: the server's, `auto` unless told).
temperature defaults to 0: greedy decoding, the base model's own tokens, which every method reproduces.
`stop` (up to 4 strings) ends the answer before the first of them, and the decoding with it; a streamed
answer holds back text that may begin a stop sequence until it is sure. A streaming client that leaves
stops its decode at the next step.

Requests are decoded together by continuous batching (runtime/batching/batch_engine.py): they join and leave the batch
at every step, each with its own method's draft, and each answer is token for token the one `Decoder.generate` gives
it alone. The engine decodes in a thread of its own, so the server keeps answering /health while it works; at most
`max_batch` requests decode at once and `max_waiting` wait, later ones get 503. Where the native CPU kernels do not
run (another device) requests are decoded one at a time, in one thread. Bad requests get 400 (413 when too large)
in OpenAI's error shape, saying what is wrong. Binds to 127.0.0.1 unless told otherwise.
"""

import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable

from ppdkit.runtime.auto import AUTO
from ppdkit.runtime.batching.batch_engine import decoding_engine
from ppdkit.runtime.decoder import Decoder, GenerateResult
from ppdkit.runtime.generate_options import GenerateOptions

from .metrics import ServerStats
from .requests import (ChatRequest, CompletionRequest, OpenAIRequest, RequestError, ServeLimits, chat_ids,
                       generate_options, stops)
from .text_pieces import TextPieces


class Answer:
    """One admitted request's answer in OpenAI's shapes: the whole body, or its server-sent events."""

    def __init__(self, name: str, chat: bool, prompt_tokens: int, options: GenerateOptions, eos: set[int]):
        self.name, self.chat, self.prompt_tokens, self.options, self.eos = name, chat, prompt_tokens, options, eos
        self.id, self.created = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}", int(time.time())

    def finish_reason(self, result: GenerateResult, pieces: TextPieces) -> str:
        ended = pieces.stopped or result.tokens[-1] in self.eos
        return "length" if len(result.tokens) >= self.options.max_new_tokens and not ended else "stop"

    def usage(self, result: GenerateResult) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": len(result.tokens),
                "total_tokens": self.prompt_tokens + len(result.tokens)}

    @staticmethod
    def extras(result: GenerateResult) -> dict:
        return {"method": result.method, "steps": result.steps, "tokens_per_step": round(
            result.mean_accepted_per_step, 4), "tokens_per_second": round(len(result.tokens) / result.seconds, 2)}

    def body(self, text: str, result: GenerateResult, pieces: TextPieces) -> dict:
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}} if self.chat
                  else {"index": 0, "text": text, "logprobs": None})
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion", "created": self.created,
                "model": self.name, "choices": [{**choice, "finish_reason": self.finish_reason(result, pieces)}],
                "usage": self.usage(result), "ppdkit": self.extras(result)}

    def chunk(self, text: str | None, reason: str | None = None, first: bool = False, **more) -> str:
        if self.chat:
            delta = {"role": "assistant", "content": ""} if first else ({"content": text} if text is not None else {})
            choice = {"index": 0, "delta": delta, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": reason, "logprobs": None}
        body = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.name, "choices": [choice], **more}
        return f"data: {json.dumps(body)}\n\n"

    async def events(self, queue: asyncio.Queue, job: asyncio.Future, pieces: TextPieces) -> AsyncIterator[str]:
        """The pieces as the decode gives them out, then the finish with usage, then [DONE]."""
        if self.chat:
            yield self.chunk(None, first=True)
        while (piece := await queue.get()) is not None:
            yield self.chunk(piece)
        try:
            result = job.result()
        except RequestError as e:
            yield f"data: {json.dumps({'error': {'message': e.message, 'type': 'invalid_request_error'}})}\n\n"
            return
        if rest := pieces.rest():
            yield self.chunk(rest)
        yield self.chunk(None, self.finish_reason(result, pieces), usage=self.usage(result), ppdkit=self.extras(result))
        yield "data: [DONE]\n\n"


class DecodeQueue:
    """Admitted requests handed to the decoding engine (a BatchEngine, or one answer at a time where the native kernels
    do not run), at most `limits.max_batch` decoding and `limits.max_waiting` waiting; what they made is counted in
    `stats`."""

    def __init__(self, decoder: Decoder, limits: ServeLimits, stats: ServerStats):
        self.decoder, self.limits, self.stats = decoder, limits, stats
        self.engine = decoding_engine(decoder, limits.max_batch)
        self._places = threading.Semaphore(limits.max_batch + limits.max_waiting)  # decoding, and waiting behind

    def admit(self) -> None:
        if not self._places.acquire(blocking=False):
            raise RequestError(503, f"{self.limits.max_batch} requests are decoding and {self.limits.max_waiting} "
                                    "waiting already; try again shortly")
        self.stats.waiting += 1

    async def decode(self, ids: list[int], options: GenerateOptions, pieces: TextPieces,
                     on_piece: Callable[[str], None], cancelled: threading.Event) -> GenerateResult:
        """After `admit`: the request's answer, decoded among the others. Its text goes to `on_piece` (on the
        engine's thread) as `pieces` gives it out; decoding ends early at a stop sequence or once `cancelled` is
        set."""

        def stream(tokens: list[int]) -> None:
            if piece := pieces.add(tokens):
                on_piece(piece)

        try:
            future = self.engine.submit(ids, options, stream, lambda: pieces.stopped or cancelled.is_set())
            result = await asyncio.wrap_future(future)
        except ValueError as e:  # a prompt that does not fit, a method this decoder cannot run
            raise RequestError(400, str(e)) from None
        finally:
            self.stats.waiting -= 1
            self._places.release()
        self.stats.add(result)
        return result


class Service:
    """What the routes answer with: one decoder under a model name, its default method, limits and queue."""

    def __init__(self, decoder: Decoder, name: str, default_method: str, limits: ServeLimits):
        self.decoder, self.name, self.default_method, self.limits = decoder, name, default_method, limits
        self.stats = ServerStats()
        self.queue = DecodeQueue(decoder, limits, self.stats)

    async def respond(self, ids: list[int], request: OpenAIRequest, chat: bool):
        """The answer's body, or a stream of its events; RequestError for what cannot be served."""
        from fastapi.responses import StreamingResponse

        options = generate_options(request, self.decoder, self.limits, self.default_method)
        try:  # a prompt too long for the model gets its 400 before a stream starts
            self.decoder.fit_prompt(ids, options.max_new_tokens, options.method, None)
        except ValueError as e:
            raise RequestError(400, str(e), "messages" if chat else "prompt") from None
        self.queue.admit()
        answer = Answer(self.name, chat, len(ids), options, self.decoder.eos_ids())
        pieces, cancelled = TextPieces(self.decoder.tokenizer, stops(request)), threading.Event()
        if not request.stream:
            parts: list[str] = []
            result = await self.queue.decode(ids, options, pieces, parts.append, cancelled)
            return answer.body("".join(parts) + pieces.rest(), result, pieces)
        # decoding starts now, not when the client first reads: an admitted request always ends and frees its turn
        loop, given = asyncio.get_running_loop(), asyncio.Queue()

        def on_piece(piece: str) -> None:  # in the decoding thread
            loop.call_soon_threadsafe(given.put_nowait, piece)

        job = asyncio.ensure_future(self.queue.decode(ids, options, pieces, on_piece, cancelled))
        job.add_done_callback(lambda _: given.put_nowait(None))

        async def events() -> AsyncIterator[str]:
            try:
                async for event in answer.events(given, job, pieces):
                    yield event
            finally:  # the stream ended, or its client left: a decode still running stops at its next step
                cancelled.set()

        return StreamingResponse(events(), media_type="text/event-stream")


def _answer_errors_in_openai_shape(app, stats: ServerStats, limits: ServeLimits) -> None:
    """RequestError, an invalid body and a body above the size cap become OpenAI's error JSON, counted as failed."""
    from fastapi import Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

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


def create_app(decoder: Decoder, name: str, default_method: str = "auto", limits: ServeLimits = ServeLimits()):
    """The FastAPI app serving `decoder` under the model name `name`."""
    from fastapi import FastAPI
    from fastapi.responses import PlainTextResponse

    app = FastAPI(title="ppdkit", description=f"{name} on ppdkit's lossless decoder", docs_url=None, redoc_url=None)
    service = Service(decoder, name, default_method, limits)
    _answer_errors_in_openai_shape(app, service.stats, limits)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: ChatRequest):
        return await service.respond(chat_ids(decoder, request.messages), request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: CompletionRequest):
        return await service.respond(decoder.tokenizer(request.prompt, add_special_tokens=False)["input_ids"],
                                     request, chat=False)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "ppdkit",
                                            "methods": decoder.methods()}]}

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": name, "default_method": default_method, "methods": decoder.methods(),
                "waiting": service.stats.waiting}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(service.stats.prometheus(name, service.queue.engine), media_type="text/plain; version=0.0.4")

    return app


def serve(decoder: Decoder, name: str, host: str, port: int, default_method: str, limits: ServeLimits) -> None:
    """Serve until interrupted (uvicorn's access log off: our own line says where)."""
    import uvicorn

    app = create_app(decoder, name, default_method, limits)
    # auto's trial now rather than in the first request's time
    runs = f" (runs {decoder.fastest_method()})" if default_method == AUTO else ""
    print(f"serving {name} on http://{host}:{port}/v1 (methods: {', '.join(decoder.methods())}; default "
          f"{default_method}{runs}; up to {limits.max_batch} requests decoded together); Ctrl-C stops", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
