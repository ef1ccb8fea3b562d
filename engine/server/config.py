"""The server's own settings and the `python -m engine.serve` command line.

The flags are built from the fields of EngineConfig and ServerConfig (each field
carries its help and group), so a setting is declared once. `to_argv` is the
inverse, used by the harness to start replicas with a given EngineConfig.
"""

from __future__ import annotations

import argparse
import ipaddress
import re
import socket
from dataclasses import MISSING, dataclass, fields

from engine.config import EngineConfig, setting
from engine.faults import FAULTS, check_fault_name
from engine.server.liveness import LoopFault


@dataclass(frozen=True)
class ServerConfig:
    """How the HTTP server listens and shuts down (not part of the engine's behaviour)."""

    host: str = setting("127.0.0.1", "address to bind (0.0.0.0 exposes it to the network)", "http server")
    port: int = setting(30000, "port to bind (0: any free port, printed)", "http server")
    served_model_name: str | None = setting(None, "the model id /v1/models lists and answers carry (default: the "
                                            "weights directory's absolute path, as vLLM's, where tools find "
                                            "tokenizer.json; for random weights the byte tokenizer's directory)",
                                            "http server")
    api_key: str | None = setting(None, "require 'Authorization: Bearer KEY' on every endpoint except /health "
                                  "(visible in the process list: prefer --api-key-file or the SPECGATE_API_KEY "
                                  "environment variable)", "http server")
    api_key_file: str | None = setting(None, "read the API key from this file (first line; keep it mode 0600)",
                                       "http server")
    allow_unauthenticated: bool = setting(False, "serve a --host that is not a loopback address without an API key "
                                          "(anyone who can reach it may generate); without this flag such a "
                                          "server refuses to start", "http server")
    max_body_bytes: int = setting(1 << 20, "largest accepted request body; larger ones get 413", "http server")
    shutdown_timeout: float = setting(10.0, "on SIGTERM, seconds in-flight requests may run before they are "
                                      "aborted", "http server")
    keepalive_timeout: float = setting(15.0, "seconds an idle connection (also one that has not sent a whole "
                                       "request yet) stays open", "http server")
    client_timeout: float = setting(60.0, "seconds a client may take to send its request body, or to take one "
                                    "streamed chunk, before it is treated as gone", "http server")
    max_connections: int = setting(512, "connections served at once (lowered to fit the open-file limit); past "
                                   "it GET /health is still answered, other requests get 503 and are closed",
                                   "http server")
    heartbeat_timeout: float = setting(5.0, "/health answers 503 once the engine loop has shown no sign of life "
                                       "for this many seconds", "liveness")
    watchdog_timeout: float = setting(60.0, "the server fails its requests and exits (status 3) once the engine "
                                      "loop has shown no sign of life for this many seconds", "liveness")
    test_loop_fault: str | None = setting(None, "test aid: raise-after:N or hang-after:N", "testing")
    tp_rendezvous: str | None = setting(
        None, "with --tp-size N: do not start ranks 1..N-1 here; listen on HOST:PORT for rank workers started "
        "elsewhere (the harness's Ray rank actors); the server exits if a rank dies", "tensor parallelism")


def is_loopback(host: str) -> bool:
    """True when every address `host` names is a loopback one (localhost, 127.0.0.0/8, ::1).

    A name is resolved; one that does not resolve, and the empty host (every interface), are not loopback.
    """
    name = host.strip().removeprefix("[").removesuffix("]")
    if not name:
        return False
    try:
        addrs = [ipaddress.ip_address(name)]
    except ValueError:
        if name.lower() == "localhost":
            return True
        try:
            infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
        except (OSError, UnicodeError):
            return False
        addrs = [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]
    # an IPv4-mapped IPv6 address (::ffff:127.0.0.1) is as loopback as the IPv4 address it maps
    addrs = [(a.ipv4_mapped or a) if isinstance(a, ipaddress.IPv6Address) else a for a in addrs]
    return bool(addrs) and all(a.is_loopback for a in addrs)


def _port(value: str) -> int:
    port = int(value)
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be in 0..65535, got {port}")
    return port


def _non_negative_float(value: str) -> float:
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


def _positive_float(value: str) -> float:
    x = float(value)
    if not x > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return x


def _loop_fault(value: str) -> str:
    try:
        LoopFault.parse(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value


# flag parsers stricter than the field's type
PARSERS = {"port": _port, "shutdown_timeout": _non_negative_float, "max_body_bytes": _positive_int,
           "inject_fault": _fault, "keepalive_timeout": _positive_float, "client_timeout": _positive_float,
           "max_connections": _positive_int, "heartbeat_timeout": _positive_float,
           "watchdog_timeout": _positive_float, "test_loop_fault": _loop_fault}
METAVARS = {"inject_fault": "NAME", "served_model_name": "NAME", "tp_rendezvous": "HOST:PORT", "api_key_file": "FILE",
            "test_loop_fault": "raise-after:N|hang-after:N"}
# test aids left out of --help (documented in docs/server.md, "Test aids")
HIDDEN = {"test_loop_fault"}


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _add_fields(parser: argparse.ArgumentParser, cls, groups: dict) -> None:
    for f in fields(cls):
        meta = f.metadata
        group = groups.get(meta["group"]) or groups.setdefault(meta["group"], parser.add_argument_group(meta["group"]))
        if f.default is False:
            group.add_argument(flag(f.name), action="store_true", help=meta["help"])
            continue
        kind = PARSERS.get(f.name) or (type(f.default) if f.default is not None and f.default is not MISSING
                                       else str)
        group.add_argument(flag(f.name), type=kind, default=f.default, choices=meta.get("choices"),
                           metavar=METAVARS.get(f.name),
                           help=argparse.SUPPRESS if f.name in HIDDEN else meta["help"])


def build_parser(doc: str = "") -> argparse.ArgumentParser:
    """`python -m engine.serve`'s flags: every EngineConfig and ServerConfig field."""
    p = argparse.ArgumentParser(
        prog="python -m engine.serve", description=doc.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog="faults: " + "; ".join(f"{f.name} ({f.summary})" for f in FAULTS.values()))
    groups: dict = {}
    _add_fields(p, EngineConfig, groups)
    _add_fields(p, ServerConfig, groups)
    return p


def configs_from_args(args: argparse.Namespace,
                      parser: argparse.ArgumentParser) -> tuple[EngineConfig, ServerConfig]:
    """(EngineConfig, ServerConfig) from parsed flags; an invalid combination exits 2 naming the flag."""
    engine_fields = [f.name for f in fields(EngineConfig)]
    try:
        cfg = EngineConfig(**{k: getattr(args, k) for k in engine_fields})
    except ValueError as e:
        msg = str(e)
        for k in engine_fields:  # name the flag, not the dataclass field
            msg = re.sub(rf"\b{k}\b", flag(k), msg)
        parser.error(msg)
    server = ServerConfig(**{f.name: getattr(args, f.name) for f in fields(ServerConfig)})
    if server.tp_rendezvous and cfg.tp_size == 1:
        parser.error("--tp-rendezvous needs --tp-size > 1")
    if server.api_key and server.api_key_file:
        parser.error("--api-key and --api-key-file exclude each other")
    if server.heartbeat_timeout >= server.watchdog_timeout:
        parser.error(f"--heartbeat-timeout ({server.heartbeat_timeout:g}) must be below --watchdog-timeout "
                     f"({server.watchdog_timeout:g})")
    return cfg, server


def to_argv(cfg: EngineConfig, always: tuple[str, ...] = ()) -> list[str]:
    """The engine.serve flags that reproduce `cfg`: settings off their default, and those named in `always`."""
    argv: list[str] = []
    for f in fields(EngineConfig):
        value = getattr(cfg, f.name)
        if value == f.default and f.name not in always:
            continue
        if isinstance(value, bool):
            argv.append(flag(f.name))
        else:
            argv += [flag(f.name), str(value)]
    return argv
