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
import importlib
import logging
import re
import signal
import sys

from engine.config import MAMBA_STRATEGIES, SPEC_ALGORITHMS, EngineConfig
from engine.faults import FAULTS, check_fault_name
from engine.model.config import PRESETS

log = logging.getLogger("specgate.serve")
TP_HOOK = "engine.tp_serve"  # a module exposing build_engine(cfg) -> AsyncEngine, for --tp-size > 1


def _port(value: str) -> int:
    port = int(value)
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be in 0..65535, got {port}")
    return port


def _positive_float(value: str) -> float:
    x = float(value)
    if not x >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return x


def _positive_int(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


def _fault(value: str) -> str:
    try:
        check_fault_name(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value


def build_parser() -> argparse.ArgumentParser:
    d = EngineConfig()
    p = argparse.ArgumentParser(
        prog="python -m engine.serve", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog="faults: " + "; ".join(f"{f.name} ({f.summary})" for f in FAULTS.values()))
    m = p.add_argument_group("model")
    m.add_argument("--model-path", default=d.model_path,
                   help="'default' (committed trained weights, else random), 'random' (seeded random weights of "
                        "--model-preset), or a weights directory")
    m.add_argument("--model-preset", default=d.model_preset, choices=sorted(PRESETS),
                   help="architecture used with --model-path random")
    m.add_argument("--seed", type=int, default=d.seed, help="seed for random weights and default sampling seed")
    m.add_argument("--tp-size", type=int, default=d.tp_size, help="tensor-parallel ranks")
    m.add_argument("--device", default=d.device, help="torch device ('cpu', 'cuda', 'cuda:1', ...)")
    m.add_argument("--force-torch-kernels", action="store_true",
                   help="use the torch reference kernels even on CUDA (A/B checks)")
    s = p.add_argument_group("speculative decoding")
    s.add_argument("--speculative-algorithm", default=d.speculative_algorithm, choices=SPEC_ALGORITHMS[::-1],
                   help="DFLASH: block drafts verified in one target forward; NONE: plain decoding")
    s.add_argument("--speculative-num-draft-tokens", type=int, default=d.speculative_num_draft_tokens,
                   help="DFlash block size B (tokens drafted and verified per step)")
    s.add_argument("--drafter-mode", default=d.drafter_mode, choices=["model", "scripted"],
                   help="'model': the DFlash drafter network; 'scripted': drafts copied from the target (test aid)")
    s.add_argument("--scripted-accept", type=int, default=d.scripted_accept,
                   help="scripted drafter: drafts per block that match the target's greedy tokens")
    c = p.add_argument_group("cache and memory")
    c.add_argument("--mamba-radix-cache-strategy", default=d.mamba_radix_cache_strategy, choices=MAMBA_STRATEGIES,
                   help="extra_buffer: checkpoint the linear state every --mamba-track-interval tokens; "
                        "no_buffer: cache only the final state (needs --page-size 1)")
    c.add_argument("--mamba-track-interval", type=int, default=d.mamba_track_interval,
                   help="checkpoint interval I in tokens (a multiple of --page-size, >= the block size)")
    c.add_argument("--page-size", type=int, default=d.page_size, help="KV cache page size in tokens")
    c.add_argument("--disable-radix-cache", action="store_true", help="no prefix cache (the cold path)")
    c.add_argument("--max-running-requests", type=int, default=d.max_running_requests,
                   help="requests in the running batch at once; more wait in the queue")
    c.add_argument("--max-total-tokens", type=int, default=d.max_total_tokens, help="KV pool capacity in tokens")
    c.add_argument("--max-state-slots", type=int, default=d.max_state_slots,
                   help="linear-state pool slots (0: derived from --max-running-requests)")
    c.add_argument("--chunked-prefill-size", type=int, default=d.chunked_prefill_size,
                   help="prompt tokens prefilled per step (all requests together)")
    f = p.add_argument_group("testing")
    f.add_argument("--inject-fault", type=_fault, default=None, metavar="NAME",
                   help="inject a named bug (see the list below) so specgate can prove it detects it")
    t = p.add_argument_group("tensor parallelism")
    t.add_argument("--tp-rendezvous", default=None, metavar="HOST:PORT",
                   help="with --tp-size N: do not start ranks 1..N-1 here; listen on HOST:PORT for rank workers "
                        "started elsewhere (the harness's Ray rank actors); the server exits if a rank dies")
    h = p.add_argument_group("http server")
    h.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 exposes it to the network)")
    h.add_argument("--port", type=_port, default=30000, help="port to bind (0: any free port, printed)")
    h.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on every endpoint except /health")
    h.add_argument("--max-body-bytes", type=_positive_int, default=1 << 20,
                   help="largest accepted request body; larger ones get 413")
    h.add_argument("--shutdown-timeout", type=_positive_float, default=10.0,
                   help="on SIGTERM, seconds in-flight requests may run before they are aborted")
    return p


def config_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> EngineConfig:
    """EngineConfig from parsed flags; an invalid combination exits 2 naming the flag."""
    fields = ("model_path", "model_preset", "seed", "tp_size", "speculative_algorithm",
              "speculative_num_draft_tokens", "drafter_mode", "scripted_accept", "mamba_radix_cache_strategy",
              "mamba_track_interval", "page_size", "disable_radix_cache", "max_running_requests", "max_total_tokens",
              "max_state_slots", "chunked_prefill_size", "inject_fault", "device", "force_torch_kernels")
    try:
        return EngineConfig(**{k: getattr(args, k) for k in fields})
    except ValueError as e:
        msg = str(e)
        for k in fields:  # name the flag, not the dataclass field
            msg = re.sub(rf"\b{k}\b", "--" + k.replace("_", "-"), msg)
        parser.error(msg)


def build_engine(cfg: EngineConfig, parser: argparse.ArgumentParser, rendezvous: str | None = None):
    """The AsyncEngine for cfg; tensor parallelism goes through engine.tp_serve."""
    if rendezvous and cfg.tp_size == 1:
        parser.error("--tp-rendezvous needs --tp-size > 1")
    try:
        if cfg.tp_size > 1:
            return importlib.import_module(TP_HOOK).build_engine(cfg, rendezvous)
        from engine.async_engine import AsyncEngine

        return AsyncEngine(cfg)
    except ValueError as e:  # weights that do not load, an unknown --model-path
        parser.error(str(e))


async def serve(engine, args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT, then drain and return the exit status."""
    from aiohttp import web

    from engine.server import drain, make_app

    app = make_app(engine, api_key=args.api_key, max_body_bytes=args.max_body_bytes)
    # handler_cancellation: a client that disconnects cancels its handler, which aborts its request
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, args.host, args.port).start()
    except OSError as e:
        print(f"error: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        await runner.cleanup()
        return 1
    port = runner.addresses[0][1]
    host = f"[{args.host}]" if ":" in args.host else args.host
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"specgate engine serving on http://{host}:{port}", flush=True)
    await stop.wait()
    log.info("shutting down: draining in-flight requests (up to %.1f s)", args.shutdown_timeout)
    aborted = await drain(app, args.shutdown_timeout)
    if aborted:
        log.info("aborted %d request(s) still running after --shutdown-timeout", aborted)
    await runner.cleanup()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = config_from_args(args, parser)
    engine = build_engine(cfg, parser, args.tp_rendezvous)
    try:
        return asyncio.run(serve(engine, args))
    finally:
        engine.shutdown()


if __name__ == "__main__":
    sys.exit(main())
