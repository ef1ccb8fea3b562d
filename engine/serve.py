"""`python -m engine.serve`: run the built-in engine behind its SGLang-compatible HTTP server.

Flags mirror SGLang's (`--model-path`, `--tp-size`, `--speculative-algorithm`,
`--mamba-track-interval`, ...). A bad value exits 2 with a message naming the
flag. Once ready it prints one line, `specgate engine serving on http://HOST:PORT`
(with `--port 0` the port is the one the OS picked). SIGTERM/SIGINT: new
requests get 503, in-flight ones may finish for `--shutdown-timeout` seconds and
are then aborted, and the process exits 0. If the engine loop dies (it raised,
it stalled past `--watchdog-timeout`, a tensor-parallel rank died) in-flight
requests get 503 and the process exits 3, so that its supervisor restarts it.

Secrets never need the command line: the API key can come from `--api-key-file`
or the SPECGATE_API_KEY environment variable, and a `--tp-rendezvous` server
reads the rank group's shared secret from SPECGATE_TP_SECRET. A `--host` that is
not a loopback address needs a key, or `--allow-unauthenticated` (exit 2 otherwise).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from engine.config import EngineConfig
from engine.server.config import ServerConfig, build_parser, configs_from_args, is_loopback

log = logging.getLogger("specgate.serve")

API_KEY_ENV = "SPECGATE_API_KEY"
TP_SECRET_ENV = "SPECGATE_TP_SECRET"
EXIT_ENGINE_DEAD = 3
DEATH_GRACE_S = 3.0  # after an engine death, time for in-flight requests to send their 503


def build_engine(cfg: EngineConfig, server: ServerConfig, parser: argparse.ArgumentParser,
                 tp_secret: bytes | None = None):
    """The AsyncEngine for cfg; tensor parallelism goes through engine.tp.local."""
    from engine.server.liveness import LoopFault

    liveness = dict(heartbeat_timeout=server.heartbeat_timeout, watchdog_timeout=server.watchdog_timeout,
                    loop_fault=LoopFault.parse(server.test_loop_fault) if server.test_loop_fault else None)
    try:
        if cfg.tp_size > 1:
            from engine.tp.local import build_engine as build_tp_engine

            return build_tp_engine(cfg, server.tp_rendezvous, tp_secret, **liveness)
        from engine.server.async_engine import AsyncEngine

        return AsyncEngine(cfg, **liveness)
    except ValueError as e:  # weights that do not load, an unknown --model-path
        parser.error(str(e))


def resolve_api_key(server: ServerConfig, environ, parser: argparse.ArgumentParser) -> str | None:
    """--api-key, else the first line of --api-key-file, else $SPECGATE_API_KEY, else None."""
    if server.api_key:
        return server.api_key
    if server.api_key_file:
        try:
            with open(server.api_key_file, encoding="utf-8") as f:
                key = f.readline().strip()
        except OSError as e:
            parser.error(f"--api-key-file {server.api_key_file}: cannot read ({e.strerror})")
        if not key:
            parser.error(f"--api-key-file {server.api_key_file}: the first line is empty")
        return key
    return environ.get(API_KEY_ENV) or None


def check_exposure(server: ServerConfig, api_key: str | None, parser: argparse.ArgumentParser) -> None:
    """A server reachable from other machines needs an API key, or --allow-unauthenticated (then a warning)."""
    if api_key or is_loopback(server.host):
        return
    if not server.allow_unauthenticated:
        parser.error(f"--host {server.host} is not a loopback address and no API key is set, so anyone who can "
                     f"reach it could generate: give a key (--api-key-file FILE, or the {API_KEY_ENV} environment "
                     "variable, or --api-key KEY), or bind 127.0.0.1, or pass --allow-unauthenticated to serve it "
                     "without a key anyway")
    log.warning("serving --host %s without an API key (--allow-unauthenticated): anyone who can reach it can "
                "generate", server.host)


def connection_limit(wanted: int) -> int:
    """`wanted`, lowered so that open connections (the cap and the overflow reserve that keeps /health answering,
    engine/server/limits.py) can never exhaust the process's open-file limit."""
    from engine.server.limits import OVERFLOW_RESERVE

    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, ValueError, OSError):
        return wanted
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(8, min(wanted, soft - 64 - OVERFLOW_RESERVE))


async def serve(engine, server: ServerConfig, api_key: str | None = None) -> int:
    """Serve until SIGTERM/SIGINT (then drain, 0) or until the engine dies (then 3); return the exit status."""
    from aiohttp import web

    from engine.server.app import drain, health_answer, make_app
    from engine.server.limits import CappedSite, compact_bad_request_logs
    from engine.server.state import STATE

    app = make_app(engine, api_key=api_key, max_body_bytes=server.max_body_bytes,
                   served_model_name=server.served_model_name, client_timeout=server.client_timeout)
    # handler_cancellation: a client that disconnects cancels its handler, which aborts its request
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=2.0,
                           keepalive_timeout=server.keepalive_timeout)
    await runner.setup()
    limit = connection_limit(server.max_connections)
    if limit < server.max_connections:
        log.warning("--max-connections lowered to %d (the open-file limit)", limit)
    compact_bad_request_logs()
    try:
        await CappedSite(runner, server.host, server.port, limit, lambda: health_answer(app[STATE])).start()
    except OSError as e:
        print(f"error: cannot listen on {server.host}:{server.port}: {e}", file=sys.stderr)
        await runner.cleanup()
        return 1
    port = runner.addresses[0][1]
    host = f"[{server.host}]" if ":" in server.host else server.host
    stop, died = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    engine.on_death(lambda _msg: loop.call_soon_threadsafe(died.set))
    print(f"specgate engine serving on http://{host}:{port}", flush=True)
    waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(died.wait())]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for w in waits:
        w.cancel()
    if died.is_set():
        log.error("engine died (%s): in-flight requests get 503; exiting with status %d so that a supervisor "
                  "restarts the server", engine.health_error, EXIT_ENGINE_DEAD)
        state = app[STATE]
        state.draining = True
        deadline = loop.time() + DEATH_GRACE_S
        while state.inflight and loop.time() < deadline:
            await asyncio.sleep(0.05)
        await runner.cleanup()
        return EXIT_ENGINE_DEAD
    log.info("shutting down: draining in-flight requests (up to %.1f s)", server.shutdown_timeout)
    aborted = await drain(app, server.shutdown_timeout)
    if aborted:
        log.info("aborted %d request(s) still running after --shutdown-timeout", aborted)
    await runner.cleanup()
    return 0


def main(argv: list[str] | None = None, environ=None) -> int:
    environ = os.environ if environ is None else environ
    parser = build_parser(__doc__)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg, server = configs_from_args(args, parser)
    api_key = resolve_api_key(server, environ, parser)
    check_exposure(server, api_key, parser)
    tp_secret = environ.get(TP_SECRET_ENV, "").encode() or None
    if server.tp_rendezvous and tp_secret is None:
        parser.error(f"--tp-rendezvous needs the rank group's shared secret in ${TP_SECRET_ENV} (the ranks "
                     "authenticate each other with it)")
    engine = build_engine(cfg, server, parser, tp_secret)
    code = 1
    try:
        code = asyncio.run(serve(engine, server, api_key))
        return code
    finally:
        if code == EXIT_ENGINE_DEAD:  # the loop (or a collective) may be stuck: leave without joining it
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        engine.shutdown()


if __name__ == "__main__":
    sys.exit(main())
