"""What every server handler shares: the ServerState, body reading, and running one generation.

`generation` is the one place a request enters and leaves the engine: it
registers the request as in flight (for /flush_cache and graceful shutdown),
turns engine refusals into 4xx errors, and always closes the engine stream,
which aborts the request if its client went away before it finished.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from aiohttp import web

from engine.io_struct import GenerateOutput, GenerateRequest
from engine.scheduler import CapacityError
from engine.server.async_engine import EngineDeadError
from engine.server.format import SSE_DONE, sse
from engine.server.served_model import served_model
from engine.server.validate import ApiError, Limits, parse_body

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class ClientGone(Exception):
    """The client closed its connection; there is no one left to answer."""


class ServerState:
    """Per-app state: the engine, its limits, requests in flight, shutdown flag."""

    def __init__(self, engine, api_key: str | None, max_body_bytes: int, served_model_name: str | None = None,
                 client_timeout: float = 60.0):
        self.engine = engine
        self.cfg = engine.cfg
        mc = engine.model_config
        self.limits = Limits(vocab_size=mc.vocab_size, max_context=mc.max_position_embeddings)
        self.speculative = self.cfg.speculative_algorithm != "NONE"
        self.served = served_model(self.cfg, served_model_name)
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.client_timeout = client_timeout
        self.inflight: dict[int, str] = {}  # serial -> rid
        self._serial = itertools.count()
        self.disconnects = 0
        self.draining = False
        self.started = time.time()

    async def engine_call(self, fn: Callable):
        """Run a blocking AsyncEngine query (stats, flush...) off the event loop; 503 if the engine is gone."""
        problem = self.engine.health_problem()
        if problem is not None:
            raise ApiError(503, f"engine: not serving ({problem})")
        try:
            return await asyncio.to_thread(fn)
        except TimeoutError:
            raise ApiError(503, "engine: the engine loop did not answer in time") from None


STATE = web.AppKey("specgate_state", ServerState)


def state_of(request: web.Request) -> ServerState:
    return request.app[STATE]


async def read_json(request: web.Request) -> dict:
    """The body as a JSON object; 413 past the size limit, 408 if it does not arrive within the client timeout,
    400 if it is not a JSON object."""
    state = state_of(request)
    limit = state.max_body_bytes
    too_large = ApiError(413, f"body: larger than the limit of {limit} bytes (--max-body-bytes)", "body")
    if request.content_length is not None and request.content_length > limit:
        raise too_large
    try:
        raw = await asyncio.wait_for(request.read(), state.client_timeout)
    except web.HTTPRequestEntityTooLarge:
        raise too_large from None
    except asyncio.TimeoutError:
        raise ApiError(408, f"body: not received within {state.client_timeout:g}s (--client-timeout)",
                       "body") from None
    if len(raw) > limit:
        raise too_large
    return parse_body(raw)


def client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


async def next_output(agen: AsyncIterator[GenerateOutput]) -> GenerateOutput:
    try:
        return await anext(agen)
    except EngineDeadError as e:
        raise ApiError(503, f"engine: {e}") from None


@asynccontextmanager
async def generation(request: web.Request, req: GenerateRequest):
    """Submit req; yields (first output, stream of later outputs). Leaving early aborts the request."""
    state = state_of(request)
    serial = next(state._serial)
    state.inflight[serial] = req.rid
    agen = state.engine.generate_stream(req)
    try:
        try:
            first = await anext(agen)
        except CapacityError as e:
            msg = str(e)
            raise ApiError(400, msg if "max_new_tokens" in msg else f"max_new_tokens: {msg}") from None
        except ValueError as e:  # the engine's message names the field (input_ids, rid, ...)
            raise ApiError(400, str(e)) from None
        except EngineDeadError as e:
            raise ApiError(503, f"engine: {e}") from None
        yield first, agen
    except (asyncio.CancelledError, ClientGone, ConnectionResetError):
        state.disconnects += 1
        raise
    finally:
        await agen.aclose()
        del state.inflight[serial]


async def final_output(request: web.Request, first: GenerateOutput, agen) -> GenerateOutput:
    """Wait for the finished output; notices a closed connection between engine steps."""
    out = first
    while not out.finished:
        if client_gone(request):
            raise ClientGone
        out = await next_output(agen)
    return out


async def stream_events(request: web.Request, first: GenerateOutput, agen,
                        events: Callable[[GenerateOutput], list[bytes]]) -> web.StreamResponse:
    """Answer with server-sent events: events(out) for every output update, then `data: [DONE]`.

    If the engine dies mid-stream the status line (200) is already sent: the error goes in-band, as SGLang
    does, with its 5xx `code` so that a client knows to retry elsewhere. A client that takes no chunk for the
    client timeout is treated as gone.
    """
    resp = web.StreamResponse(headers=SSE_HEADERS)
    await resp.prepare(request)
    timeout = state_of(request).client_timeout

    async def write(data: bytes) -> None:
        try:
            await asyncio.wait_for(resp.write(data), timeout)
        except asyncio.TimeoutError:
            raise ClientGone from None

    out = first
    try:
        while True:
            for event in events(out):
                await write(event)
            if out.finished:
                break
            try:
                out = await next_output(agen)
            except ApiError as e:
                await write(sse(e.body()))
                break
        await write(SSE_DONE)
        await resp.write_eof()
    except ConnectionResetError:
        raise ClientGone from None
    return resp
