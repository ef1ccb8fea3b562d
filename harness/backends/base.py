"""The backend interface (`Backend`) and its two failures; the registry of backends is harness/backends/__init__.py.

Every backend module imports this one, never the package, so the registry can import them all.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from typing import ClassVar

import aiohttp

from records.schema import Generation

PROBE_KEY = "specgate_probe"  # where a probe's findings sit in the server info (and config.json)


class ReplicaFailure(Exception):
    """The replica could not answer (connection refused or reset, 5xx, truncated stream)."""


class RequestError(Exception):
    """The request itself failed (4xx, timeout, abort); re-sending it elsewhere would not help."""


class Backend(ABC):
    """One serving protocol. Instances hold what probes learned per URL (model names, capabilities)."""

    name = ""

    def __init__(self, api_key: str | None = None, tokenizer: str | None = None, defaults: dict | None = None
                 ) -> None:
        self.api_key = api_key
        self.tokenizer = tokenizer  # --tokenizer: the target's tokenizer, where the protocol needs one
        self.defaults = dict(defaults or {})  # the run's --intervals / --block-size, for what a server hides

    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    @abstractmethod
    async def server_info(self, http: aiohttp.ClientSession, url: str) -> dict:
        """The server's settings under SGLang's names (RequestError naming the URL when unreachable)."""

    @abstractmethod
    async def probe(self, http: aiohttp.ClientSession, url: str, role: str, generate: bool = True) -> dict:
        """server_info checked for `role` ("candidate" / "reference"), with its `specgate_probe` record.

        With `generate`, one short request checks what answers carry. RequestError says what is missing
        and what to do; nothing is written by a probe.
        """

    @abstractmethod
    def payload(self, input_ids: list[int], max_new_tokens: int, stream: bool) -> dict:
        """The request body for greedy, fixed-length generation with logprobs."""

    # why the protocol sends no restore-window probe (window_payload gives None); None where it sends one
    window_unprobed: ClassVar[str | None] = None

    def window_payload(self, input_ids: list[int], start: int) -> dict | None:
        """The body of a restore-window probe (harness/window.py): `input_ids` again, scoring its prompt tokens
        from `start` on without matching deeper than `start`; None where the protocol cannot score a prompt
        without changing what the server caches (vLLM serves requests asking for prompt log-probs uncached)."""
        return None

    @abstractmethod
    async def generate(self, http: aiohttp.ClientSession, url: str, payload: dict, timeout: float,
                       incremental: bool = False) -> Generation:
        """Send `payload` to `url`; the final answer as a Generation (ReplicaFailure / RequestError).

        `incremental`: the server said it streams only what is new in each chunk."""

    async def health(self, http: aiohttp.ClientSession, url: str, timeout: float = 5.0) -> bool:
        """True when GET /health answers 200."""
        try:
            async with http.get(f"{url}/health", timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return False

    @abstractmethod
    async def flush(self, http: aiohttp.ClientSession, url: str, wait: float = 60.0) -> None:
        """Empty the server's prefix cache (a no-op where the server offers no way; the probe says so)."""

    async def counters(self, http: aiohttp.ClientSession, url: str) -> dict[str, float]:
        """Speculation and prefix-cache counters from GET /metrics ({} when there are none)."""
        from harness.backends.metrics import fetch_counters

        return await fetch_counters(http, url, self.headers())


def probe_record(backend: str, unknown: list[str], notes: list[str], **found) -> dict:
    """The `specgate_probe` entry: what a probe found, and what the server cannot report."""
    return {"backend": backend, "unknown": sorted(set(unknown)), "notes": notes, **found}
