"""SGLang-compatible HTTP server over an AsyncEngine (DESIGN.md 3.1); `make_app` builds the aiohttp app.

Native endpoints live here; the OpenAI-compatible ones in openai.py.
Validation is in validate.py, answer shapes in format.py.
Every error is `{"error": {"message": ...}}` with a 4xx status naming the
field, or 5xx for the server's own failures; a handler exception never takes
the server down. A refused request is logged in one short line (method, path,
status, the first 200 characters of the message), never with its body.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time

from aiohttp import web

from engine.server.format import GenerateStream, generate_answer, sse
from engine.server.generate_params import parse_generate
from engine.server.metrics import peer_spec_metrics
from engine.server.metrics import render as render_metrics
from engine.server.openai import add_openai_routes
from engine.server.state import (
    STATE,
    ClientGone,
    ServerState,
    final_output,
    generation,
    read_json,
    state_of,
    stream_events,
)
from engine.server.validate import ApiError

log = logging.getLogger("specgate.server")

DEFAULT_MAX_BODY_BYTES = 1 << 20
DEFAULT_CLIENT_TIMEOUT = 60.0
LOGGED_MESSAGE_CHARS = 200
OPEN_PATHS = {"/health"}  # answered without the API key (load balancers, the harness's health probe)
VERSION = "specgate-0.1.0"


def json_error(request: web.Request, err: ApiError) -> web.Response:
    """The JSON error answer; logged in one line (a bad body is never echoed into the log)."""
    level = logging.WARNING if err.status >= 500 else logging.INFO
    log.log(level, "%s %s -> %d: %s", request.method, request.path[:100], err.status,
            err.message[:LOGGED_MESSAGE_CHARS])
    headers = {"WWW-Authenticate": "Bearer"} if err.status == 401 else None
    return web.json_response(err.body(), status=err.status, headers=headers)


# --- middlewares (outermost first) ------------------------------------------------------------------
@web.middleware
async def errors_middleware(request: web.Request, handler):
    """Every failure becomes a JSON error; unexpected exceptions are logged and answered 500."""
    try:
        return await handler(request)
    except ApiError as e:
        return json_error(request, e)
    except ClientGone:
        return web.Response(status=499, text="client closed the connection")
    except web.HTTPException as e:
        if e.status < 400:
            raise
        field = "body" if e.status == 413 else None
        return json_error(request, ApiError(e.status, f"{request.method} {request.path[:100]}: {e.reason}", field))
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001 - the server must outlive any one bad request
        log.exception("unhandled error in %s %s", request.method, request.path[:100])
        return json_error(request, ApiError(500, f"internal server error: {type(e).__name__}: {str(e)[:200]}"))


@web.middleware
async def drain_middleware(request: web.Request, handler):
    if state_of(request).draining and request.path not in OPEN_PATHS:
        raise ApiError(503, "server: shutting down, not accepting new requests")
    return await handler(request)


@web.middleware
async def auth_middleware(request: web.Request, handler):
    key = state_of(request).api_key
    if key and request.path not in OPEN_PATHS:
        given = request.headers.get("Authorization", "")
        if not given:
            raise ApiError(401, "Authorization: missing API key (send 'Authorization: Bearer <key>')",
                           "Authorization")
        # aiohttp decodes header bytes that are not UTF-8 as surrogates; compare the raw bytes back
        if not hmac.compare_digest(given.encode("utf-8", "surrogateescape"), f"Bearer {key}".encode()):
            raise ApiError(401, "Authorization: wrong API key", "Authorization")
    return await handler(request)


# --- native endpoints -------------------------------------------------------------------------------
async def handle_generate(request: web.Request) -> web.StreamResponse:
    t0 = time.perf_counter()
    state = state_of(request)
    call = parse_generate(await read_json(request), state.limits)

    async with generation(request, call.req) as (first, agen):
        if call.stream:
            chunks = GenerateStream(call, state.speculative)
            return await stream_events(request, first, agen,
                                       lambda out: [sse(chunks.chunk(out, time.perf_counter() - t0))])
        out = await final_output(request, first, agen)
        return web.json_response(generate_answer(out, call, time.perf_counter() - t0, state.speculative))


def health_answer(state: ServerState) -> tuple[int, dict]:
    """(status, body) of GET /health; also what connections past --max-connections get (limits.py)."""
    if state.draining:
        return 503, {"status": "draining", "error": {"message": "server: shutting down"}}
    problem = state.engine.health_problem()
    if problem is not None:
        return 503, {"status": "error", "error": {"message": f"engine: {problem}"}}
    return 200, {"status": "ok"}


async def handle_health(request: web.Request) -> web.Response:
    status, body = health_answer(state_of(request))
    return web.json_response(body, status=status)


async def handle_server_info(request: web.Request) -> web.Response:
    state = state_of(request)
    info = await state.engine_call(state.engine.server_info)
    info.update(
        version=VERSION, served_model_name=state.served.name, api_key_required=bool(state.api_key),
        max_body_bytes=state.max_body_bytes, draining=state.draining,
        incremental_streaming_output=True,  # streamed /generate chunks carry only what is new (format.py)
        # SGLang reports the running accept length here
        internal_states=[{"avg_spec_accept_length": info.get("avg_accept_length", 0.0)}],
        **tokenizer_info(state),
    )
    return web.json_response(info)


def tokenizer_info(state: ServerState) -> dict:
    """The tokenizer keys of /server_info and /model_info: `tokenizer_path` is the directory holding tokenizer.json
    and tokenizer_config.json (a tokenizer loader takes a directory, as SGLang's tokenizer_path is one)."""
    return {"tokenizer": "byte", "tokenizer_path": state.served.tokenizer_dir}


async def handle_model_info(request: web.Request) -> web.Response:
    state = state_of(request)
    cfg = state.cfg
    return web.json_response({
        "model_path": cfg.model_path, "served_model_name": state.served.name, **tokenizer_info(state),
        "is_generation": True, "model_type": "specgate-hybrid",
        "model_preset": cfg.model_preset if cfg.model_path == "random" else None,
        "vocab_size": state.limits.vocab_size, "max_context_length": state.limits.max_context,
        "preferred_sampling_params": None, "weight_version": "default",
    })


async def flush(request: web.Request, busy_status: int) -> web.Response:
    """Flush the prefix cache; `busy_status` while any request runs or waits."""
    state = state_of(request)
    name = request.path.lstrip("/")
    busy = f"{name}: requests are running; the cache is flushed only when the server is idle"
    if state.inflight or state.engine.num_active():
        raise ApiError(busy_status, busy)
    if not await state.engine_call(state.engine.flush_cache):
        raise ApiError(busy_status, busy)
    return web.json_response({"status": "ok", "message": "Cache flushed."})


async def handle_flush_cache(request: web.Request) -> web.Response:
    return await flush(request, 400)  # SGLang's status for a busy server


async def handle_reset_prefix_cache(request: web.Request) -> web.Response:
    """vLLM's name for it (AIPerf's --reset-kv-cache); busy is a 409, which AIPerf retries."""
    return await flush(request, 409)


async def handle_metrics(request: web.Request) -> web.Response:
    """Prometheus text; with the engine dead or stalled, only the server's own metrics (`healthy` 0)."""
    state = state_of(request)
    healthy = state.engine.health_problem() is None
    stats = await state.engine_call(state.engine.stats) if healthy else {}
    server = {"inflight": len(state.inflight), "disconnects": state.disconnects,
              "healthy": int(healthy), "draining": int(state.draining)}
    cfg = state.cfg
    peer = peer_spec_metrics(stats, state.served.name, cfg.speculative_num_draft_tokens - 1) \
        if state.speculative else []
    return web.Response(body=render_metrics(stats, server, peer).encode(),
                        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


def make_app(async_engine, api_key: str | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
             served_model_name: str | None = None, client_timeout: float = DEFAULT_CLIENT_TIMEOUT) -> web.Application:
    """The aiohttp application serving `async_engine` (an AsyncEngine).

    `served_model_name`: the model id (default: the weights directory, served_model.py). `client_timeout`: seconds
    a client may take to send its body or to take one streamed chunk.
    """
    app = web.Application(middlewares=[errors_middleware, drain_middleware, auth_middleware],
                          client_max_size=max_body_bytes)
    app[STATE] = ServerState(async_engine, api_key, max_body_bytes, served_model_name, client_timeout)
    app.router.add_post("/generate", handle_generate)
    app.router.add_get("/health", handle_health)
    app.router.add_get("/server_info", handle_server_info)
    app.router.add_get("/get_server_info", handle_server_info)  # SGLang's older name
    app.router.add_get("/model_info", handle_model_info)
    app.router.add_get("/get_model_info", handle_model_info)
    app.router.add_route("POST", "/flush_cache", handle_flush_cache)
    app.router.add_get("/flush_cache", handle_flush_cache)
    app.router.add_route("POST", "/reset_prefix_cache", handle_reset_prefix_cache)
    app.router.add_get("/reset_prefix_cache", handle_reset_prefix_cache)
    app.router.add_get("/metrics", handle_metrics)
    add_openai_routes(app)
    return app


async def drain(app: web.Application, timeout: float) -> int:
    """Graceful shutdown: refuse new requests, let in-flight ones finish for `timeout` s, then abort them.

    Returns how many requests had to be aborted.
    """
    state = app[STATE]
    state.draining = True
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while state.inflight and loop.time() < deadline:
        await asyncio.sleep(0.05)
    aborted = list(state.inflight.values())
    for rid in aborted:
        state.engine.abort(rid)
    grace = loop.time() + 5.0  # aborted requests still send their (abort) answers
    while state.inflight and loop.time() < grace:
        await asyncio.sleep(0.05)
    return len(aborted)
