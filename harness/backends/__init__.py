"""Backends: how the harness talks to a serving engine, one module per protocol, one interface.

`Backend` is all the driver, the pools and the run use: `probe` (settings and
capabilities of an endpoint, once, before anything is written), `payload` and
`generate` (one request; the driver sets `payload["rid"]` before each send),
`health`, `flush` and `counters` (/metrics); it lives in `base.py`, which every
backend module imports (never this package, so the registry below can import
them all). `sglang.py` speaks SGLang's native API (the built-in engine's too),
`openai.py` the OpenAI completions API (vLLM and other OpenAI-compatible
servers); a third protocol is a new module and one entry in REGISTRY.

A probe returns the server's settings under SGLang's server-args names (what
harness/targets/ read), plus `specgate_probe`: which backend, where settings
came from, and `unknown`, the list of what this server cannot report (spec_trace,
flush, candidate logprobs, ...), which narrows the report (DESIGN.md 3.6).

Failures split in two: `ReplicaFailure` (the replica is gone or broken:
connection error, 5xx, a stream cut short) is worth re-sending elsewhere;
`RequestError` (4xx, timeout, abort, a failed probe) is the request's own answer.
"""

from __future__ import annotations

from harness.backends.base import PROBE_KEY, Backend, ReplicaFailure, RequestError, probe_record
from harness.backends.openai import OpenAIBackend
from harness.backends.sglang import SGLangBackend

__all__ = ["BACKENDS", "PROBE_KEY", "Backend", "ReplicaFailure", "RequestError", "make_backend", "narrowed",
           "probe_record"]
REGISTRY: dict[str, type[Backend]] = {"sglang": SGLangBackend, "openai": OpenAIBackend}
BACKENDS = tuple(REGISTRY)


def make_backend(name: str, api_key: str | None = None, tokenizer: str | None = None,
                 defaults: dict | None = None) -> Backend:
    """The backend called `name` (one of BACKENDS); `defaults`: the run's intervals and block size."""
    if name not in REGISTRY:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    return REGISTRY[name](api_key, tokenizer, defaults)


def narrowed(server_infos: dict[str, dict]) -> dict[str, list[str]]:
    """Pool name -> what its server cannot report, from the pools' probed server info (for config.json)."""
    return {name: list((info.get(PROBE_KEY) or {}).get("unknown", [])) for name, info in server_infos.items()}
