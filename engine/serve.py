"""`python -m engine.serve`: run the built-in engine behind its SGLang-compatible HTTP server.

Flags mirror SGLang's (`--model-path`, `--tp-size`, `--speculative-algorithm`,
`--mamba-track-interval`, ...). A bad value exits 2 with a message naming the
flag. Once ready it prints one line, `specgate engine serving on http://HOST:PORT`
(with `--port 0` the port is the one the OS picked). SIGTERM/SIGINT: new
requests get 503, in-flight ones may finish for `--shutdown-timeout` seconds and
are then aborted, and the process exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from engine.config import EngineConfig
from engine.server.config import ServerConfig, build_parser, configs_from_args

log = logging.getLogger("specgate.serve")


def build_engine(cfg: EngineConfig, parser: argparse.ArgumentParser, rendezvous: str | None = None):
    """The AsyncEngine for cfg; tensor parallelism goes through engine.tp.local."""
    try:
        if cfg.tp_size > 1:
            from engine.tp.local import build_engine as build_tp_engine

            return build_tp_engine(cfg, rendezvous)
        from engine.server.async_engine import AsyncEngine

        return AsyncEngine(cfg)
    except ValueError as e:  # weights that do not load, an unknown --model-path
        parser.error(str(e))


async def serve(engine, server: ServerConfig) -> int:
    """Serve until SIGTERM/SIGINT, then drain and return the exit status."""
    from aiohttp import web

    from engine.server.app import drain, make_app

    app = make_app(engine, api_key=server.api_key, max_body_bytes=server.max_body_bytes)
    # handler_cancellation: a client that disconnects cancels its handler, which aborts its request
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, server.host, server.port).start()
    except OSError as e:
        print(f"error: cannot listen on {server.host}:{server.port}: {e}", file=sys.stderr)
        await runner.cleanup()
        return 1
    port = runner.addresses[0][1]
    host = f"[{server.host}]" if ":" in server.host else server.host
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"specgate engine serving on http://{host}:{port}", flush=True)
    await stop.wait()
    log.info("shutting down: draining in-flight requests (up to %.1f s)", server.shutdown_timeout)
    aborted = await drain(app, server.shutdown_timeout)
    if aborted:
        log.info("aborted %d request(s) still running after --shutdown-timeout", aborted)
    await runner.cleanup()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(__doc__)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg, server = configs_from_args(args, parser)
    engine = build_engine(cfg, parser, server.tp_rendezvous)
    try:
        return asyncio.run(serve(engine, server))
    finally:
        engine.shutdown()


if __name__ == "__main__":
    sys.exit(main())
