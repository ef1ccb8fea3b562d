"""The harness's two failures, below every other harness module so that any of them can raise either."""

from __future__ import annotations


class ConfigError(ValueError):
    """A setting is missing, malformed or inconsistent; the message names it."""


class HarnessError(RuntimeError):
    """The harness cannot go on (cluster, replicas, endpoints); exit status 2."""
