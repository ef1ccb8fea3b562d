"""Backends: how the harness talks to a serving engine, one module per protocol.

`sglang.py` speaks SGLang's native API (the built-in engine's too). Every backend
turns an answer into a `records.schema.Generation` and splits failures in two:
`ReplicaFailure` (the replica is gone or broken: connection error, 5xx, a stream
cut short) is worth re-sending elsewhere; `RequestError` (4xx, timeout, abort) is
the request's own answer and is recorded.
"""

from __future__ import annotations


class ReplicaFailure(Exception):
    """The replica could not answer (connection refused or reset, 5xx, truncated stream)."""


class RequestError(Exception):
    """The request itself failed (4xx, timeout, abort); re-sending it elsewhere would not help."""
