"""OpenAI /v1/completions answers (whole or streamed) as Generations, and token strings back to ids.

Output ids come, in order of preference, from vLLM's `return_token_ids`
(`choices[0].token_ids`), from logprob tokens of the form "token_id:N" (vLLM's
`--return-tokens-as-token-ids`), or from the logprob token strings mapped
through the target's tokenizer (`TokenMap`), which the probe says it did.
`status_json` (one request's status and JSON) is here because openai.py and
openai_probe.py both use it.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field

import aiohttp

from harness.backends.base import ReplicaFailure, RequestError
from records.schema import Generation

TOKEN_ID = re.compile(r"token_id:(\d+)")
BYTES = re.compile(r"\\x([0-9a-fA-F]{2})")
TOP_K = 2  # top logprobs per token kept (the margin test's top-1 / top-2)
UNKNOWN_ID = -1  # a top log-prob alternative whose token id the server did not give


class TokenMap:
    """Logprob token strings -> ids: "token_id:N", else through the target tokenizer (built on first use)."""

    def __init__(self, tokenizer_spec: str | None) -> None:
        self.spec = tokenizer_spec
        self._tok = None
        self._by_text: dict[str, int] | None = None
        self._by_bytes: dict[bytes, int] | None = None

    @property
    def tokenizer(self):
        if self._tok is None and self.spec is not None:
            from protocol.hf_tokenizer import load_tokenizer

            self._tok = load_tokenizer(self.spec)
        return self._tok

    def _tables(self) -> None:
        tok = self.tokenizer
        by_text: dict[str, int] = {}
        ambiguous = set()
        for i in range(tok.vocab_size):
            try:
                text = tok.decode([i], keep_special=True)
            except ValueError:
                continue
            if text in by_text:
                ambiguous.add(text)
            by_text[text] = i
        self._by_text = {t: i for t, i in by_text.items() if t not in ambiguous}
        self._by_bytes = {}
        piece_of = getattr(tok, "id_to_token", None)
        if piece_of is not None:  # byte-level vocabularies: a piece's characters stand for bytes
            from protocol.byte_export import bytes_to_unicode

            char_to_byte = {c: b for b, c in bytes_to_unicode().items()}
            for i in range(tok.vocab_size):
                piece = piece_of(i)
                if piece and all(c in char_to_byte for c in piece):
                    self._by_bytes.setdefault(bytes(char_to_byte[c] for c in piece), i)

    def to_id(self, token: str) -> int | None:
        """The id of a logprob token string, or None when it cannot be told."""
        m = TOKEN_ID.fullmatch(token)
        if m:
            return int(m.group(1))
        if self.spec is None:
            return None
        if self._by_text is None:
            self._tables()
        if token.startswith("bytes:"):  # OpenAI's spelling of a token that is not valid UTF-8 on its own
            raw = bytes(int(h, 16) for h in BYTES.findall(token))
            return self._by_bytes.get(raw)
        return self._by_text.get(token)


@dataclass
class Answer:
    """One completion choice, accumulated over stream chunks (or read whole)."""

    text: list[str] = field(default_factory=list)
    token_ids: list[int] | None = None
    tokens: list[str] = field(default_factory=list)
    token_logprobs: list = field(default_factory=list)
    top_logprobs: list = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict | None = None

    def absorb(self, obj: dict) -> bool:
        """Add one answer object (a whole answer or a stream chunk); True when it carried tokens."""
        if isinstance(obj.get("usage"), dict):
            self.usage = obj["usage"]
        choices = obj.get("choices") or []
        if not choices:
            return False
        choice = choices[0]
        self.text.append(choice.get("text") or "")
        if choice.get("token_ids") is not None:
            self.token_ids = (self.token_ids or []) + [int(t) for t in choice["token_ids"]]
        lp = choice.get("logprobs") or {}
        self.tokens += lp.get("tokens") or []
        self.token_logprobs += lp.get("token_logprobs") or []
        self.top_logprobs += lp.get("top_logprobs") or []
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]
        return bool(choice.get("token_ids") or lp.get("tokens") or choice.get("text"))

    def output_ids(self, tokens: TokenMap) -> list[int]:
        """The generated ids (see the module doc); RequestError when they cannot be told."""
        if self.token_ids is not None:
            return self.token_ids
        ids = [tokens.to_id(t) for t in self.tokens]
        if not self.tokens or None in ids:
            bad = next((t for t, i in zip(self.tokens, ids, strict=True) if i is None), None)
            raise RequestError("the answer carries no token ids (choices[0].token_ids)" +
                               (f" and its logprob token {bad!r} maps to no id" if bad is not None else ""))
        return ids

    def top_entries(self, i: int, ids: list[int], tokens: TokenMap) -> list[list]:
        """Position i's top log-probs, best first, as [[logprob, id], ...] (TOP_K of them).

        The chosen token's entry takes its id from `ids`; an alternative whose string maps to no id keeps its
        log-prob (the margin needs it) with id UNKNOWN_ID.
        """
        chosen = self.tokens[i] if i < len(self.tokens) else None
        pairs = []
        for token, lp in (self.top_logprobs[i] or {}).items():
            if lp is None:
                continue
            tid = ids[i] if token == chosen and i < len(ids) else tokens.to_id(token)
            pairs.append((float(lp), UNKNOWN_ID if tid is None else tid))
        return [[lp, t] for lp, t in sorted(pairs, key=lambda p: -p[0])][:TOP_K]

    def generation(self, tokens: TokenMap, ttft: float | None, itl: float | None, e2e: float) -> Generation:
        ids = self.output_ids(tokens)
        top = [self.top_entries(i, ids, tokens) for i in range(len(self.top_logprobs))]
        usage = self.usage or {}
        details = usage.get("prompt_tokens_details") or {}
        return Generation(
            output_ids=ids, output_text="".join(self.text),
            output_logprobs=[float(lp) for lp in self.token_logprobs if lp is not None],
            output_top_logprobs=top, cached_tokens=int(details.get("cached_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or len(ids)), finish_reason=self.finish_reason,
            spec_verify_ct=None, spec_accept_length=None, spec_trace=None, ttft=ttft, itl=itl, e2e=e2e,
            abort_message="aborted by the server" if self.finish_reason == "abort" else None)


async def status_json(http: aiohttp.ClientSession, method: str, url: str, headers: dict, body=None,
                      timeout: float = 30.0):
    """(status, parsed JSON or None, text head) of one request; ReplicaFailure when the server is unreachable."""
    try:
        async with http.request(method, url, json=body, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            text = await resp.text()
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        raise ReplicaFailure(f"{method} {url} failed: {type(e).__name__}: {e}") from e
    try:
        obj = json.loads(text)
    except ValueError:
        obj = None
    return resp.status, obj, text[:300]
