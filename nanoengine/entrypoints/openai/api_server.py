"""The OpenAI-compatible HTTP server: `python -m nanoengine serve` (vllm/entrypoints/openai/api_server.py).

FastAPI and uvicorn, as vLLM's server: /v1/models, /v1/completions and /v1/chat/completions (streamed as
server-sent events, or not), /health, and /metrics in Prometheus' text format under vLLM's metric names. Beyond
vLLM: /engine_state, the engine's state between two steps as JSON (EngineState.to_json), and /live, a page that
redraws it while clients stream (entrypoints/openai/live.py).

`build_app(llm)` serves any LLM, the engine's own or one built with replaced parts: the server holds no engine
code. It binds to 127.0.0.1 unless told otherwise; with an API key every /v1 route wants
`Authorization: Bearer <key>`, as vLLM's --api-key does, and the others do not (vLLM 0.33 guards the /v1, /v2,
/inference and /cohere prefixes only, leaving /health, /metrics, /load and /server_info open). /engine_state and
/live are of those others, as /metrics is, so a browser opens the page without a key: they show block ids, token
counts and request ids, never a prompt or a completion.

The server never dies of a request. A bad one gets OpenAI's error JSON, {"error": {"message", "type", "param",
"code"}}: 400 naming the field for malformed JSON, a wrong type or an invalid sampling value (the engine's own
checks: InvalidRequestError names the argument), a prompt too long for max_model_len, or a field nanoengine does
not serve yet; 404 for an unknown model name, as vLLM answers; 413 for a body over max_request_body_bytes; 401
without the key. Fields the API does not know are ignored, as vLLM ignores them. A client that disconnects has
its requests aborted before the engine's next step, so their blocks are free for it.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nanoengine.engine.async_llm import AsyncLLM
from nanoengine.entrypoints.llm import LLM
from nanoengine.entrypoints.openai.live import LIVE_PAGE, LiveView, plain_view, summary_html
from nanoengine.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList
from nanoengine.entrypoints.openai.serving import OpenAIServing, OpenAIServingError, PendingResponse
from nanoengine.metrics.loggers import PrometheusStatLogger

MAX_REQUEST_BODY_BYTES = 4 * 2**20  # far above any prompt max_model_len allows; a bigger body is refused unread
# Segments of a pydantic error location that are its own schema's names, not the request's fields.
_INTERNAL_LOC = re.compile(r"[\[\](){}]|^(str|int|float|bool|list|dict|none|union|function-\w+|json-or-python)$")


def default_model_name(llm: LLM) -> str:
    """The GGUF's file name without .gguf, or "nanoengine" for a model given ready-made."""
    path = llm.engine.config.model_config.model_path
    return path.stem if path is not None else "nanoengine"


def build_app(
    llm: LLM,
    *,
    served_model_name: str | None = None,
    api_key: str | None = None,
    max_request_body_bytes: int = MAX_REQUEST_BODY_BYTES,
    live_view: LiveView | None = None,
) -> FastAPI:
    """The server's app over `llm`: its AsyncLLM starts with the app and shuts down (aborting what runs) with it.

    live_view draws /live's pictures from each EngineState (None: the engine's plain tables, plain_view); the page
    shows its HTML under the state's summary line."""
    name = served_model_name or default_model_name(llm)
    registry = CollectorRegistry()
    async_llm = AsyncLLM(llm, stat_loggers=[PrometheusStatLogger(registry, name)])
    serving = OpenAIServing(async_llm, name)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await async_llm.shutdown()

    app = FastAPI(title="nanoengine", lifespan=lifespan)
    app.state.async_llm, app.state.registry = async_llm, registry
    _add_error_handlers(app)
    if api_key is not None:
        app.add_middleware(_AuthenticationMiddleware, api_key=api_key)
    app.add_middleware(_BodySizeLimitMiddleware, max_bytes=max_request_body_bytes)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/engine_state")
    async def engine_state() -> JSONResponse:
        return JSONResponse((await async_llm.get_engine_state()).to_json())

    @app.get("/live")
    async def live() -> HTMLResponse:
        return HTMLResponse(LIVE_PAGE)

    @app.get("/live/view")
    async def live_fragment() -> HTMLResponse:
        state = await async_llm.get_engine_state()
        return HTMLResponse(summary_html(state) + (live_view or plain_view)(state))

    @app.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=name, max_model_len=llm.max_model_len)])

    @app.post("/v1/completions")
    async def completions(request: CompletionRequest, raw_request: Request) -> Response:
        return await _respond(serving.create_completion(request), raw_request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: ChatCompletionRequest, raw_request: Request) -> Response:
        return await _respond(serving.create_chat_completion(request), raw_request)

    return app


async def _respond(result: AsyncIterator[str] | PendingResponse, raw_request: Request) -> Response:
    """A stream as server-sent events (Starlette cancels it when the client disconnects), or the whole response,
    awaited against the client's disconnect (vLLM's with_cancellation): either way the generators are closed and
    their requests aborted."""
    if not isinstance(result, PendingResponse):
        return StreamingResponse(result, media_type="text/event-stream")
    handler = asyncio.ensure_future(result.response)
    disconnect = asyncio.ensure_future(_wait_for_disconnect(raw_request))
    done, _ = await asyncio.wait([handler, disconnect], return_when=asyncio.FIRST_COMPLETED)
    disconnect.cancel()
    if handler in done:
        return JSONResponse(handler.result().model_dump())
    handler.cancel()
    await asyncio.gather(handler, return_exceptions=True)
    await result.close()
    return Response(status_code=499)  # nobody reads it: the client is gone (nginx's "client closed request")


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _error(status: HTTPStatus, message: str, param: str | None = None, type: str | None = None) -> JSONResponse:
    error = OpenAIServingError(message, param=param, status=status, type=type or "")
    return JSONResponse(error.to_response().model_dump(), status_code=status)


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OpenAIServingError)
    async def refused(request: Request, exc: OpenAIServingError) -> JSONResponse:
        return JSONResponse(exc.to_response().model_dump(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        parts = [str(p) for p in first.get("loc", ())[1:] if not _INTERNAL_LOC.search(str(p))]
        param = ".".join(parts) or "body"
        reasons = "; ".join(f"{'.'.join(map(str, e.get('loc', ())[1:])) or 'body'}: {e.get('msg')}" for e in errors[:5])
        return _error(HTTPStatus.BAD_REQUEST, f"{len(errors)} validation error(s): {reasons}"[:1000], param)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(HTTPStatus(exc.status_code), str(exc.detail))

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> JSONResponse:
        return _error(HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(exc).__name__}: {exc}", type="InternalServerError")


class _AuthenticationMiddleware:
    """Every /v1 route wants `Authorization: Bearer <api_key>` (vLLM's AuthenticationMiddleware)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app, self.expected = app, f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1") and scope["method"] != "OPTIONS":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not secrets.compare_digest(given, self.expected):
                response = _error(HTTPStatus.UNAUTHORIZED, "Unauthorized: give the API key as a Bearer token.")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _BodyTooLarge(Exception):
    pass


class _BodySizeLimitMiddleware:
    """Refuse a body over max_bytes with 413, whether its Content-Length says so or it only turns out so."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = _error(
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            f"The request body is over the server's limit of {self.max_bytes} bytes.",
            type="RequestEntityTooLarge",
        )
        length = dict(scope["headers"]).get(b"content-length", b"0")
        if not length.isdigit() or int(length) > self.max_bytes:
            await too_large(scope, receive, send)
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                raise _BodyTooLarge
            return message

        try:
            await self.app(scope, counting_receive, send)
        except _BodyTooLarge:
            await too_large(scope, receive, send)


def run_server(llm: LLM, *, host: str = "127.0.0.1", port: int = 8000, **app_kwargs: Any) -> None:
    """Serve `llm` until interrupted (Ctrl-C); the first line printed names the live page's URL."""
    import uvicorn

    print(f"nanoengine: the engine's state, live: http://{host}:{port}/live (OpenAI API under /v1)", flush=True)
    uvicorn.run(build_app(llm, **app_kwargs), host=host, port=port, log_level="info")


@dataclass(slots=True, frozen=True)
class BackgroundServer:
    """A server serve_in_thread started: its base URL, its app (app.state.async_llm) and the LLM it serves."""

    url: str
    app: FastAPI
    llm: LLM


@contextmanager
def serve_in_thread(
    llm: LLM, *, host: str = "127.0.0.1", port: int = 0, **app_kwargs: Any
) -> Iterator[BackgroundServer]:
    """The server over `llm` in a thread of its own, with its own event loop, on host:port (0: a free port), for a
    caller that talks to it from the same process (a benchmark, a test, an interactive session); it stops when the
    block ends."""
    import uvicorn

    sock = socket.socket()
    sock.bind((host, port))
    app = build_app(llm, **app_kwargs)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("the server did not start within 30 s")
            time.sleep(0.02)
        yield BackgroundServer(f"http://{host}:{sock.getsockname()[1]}", app, llm)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
