"""A fake SGLang-compatible server for the harness tests: deterministic, instant, no model.

Output token i of a request is `(sum(input_ids) + 7 * i) % 256`, so the same input
always gives the same output on every replica. A prefix "cache" remembers finished
sequences as SGLang's radix cache does (the prompt and every output token but the last,
whose KV is never computed): a request sharing a prefix of length L with one gets
`cached_tokens = min(L, len(input_ids) - 1) // interval * interval`. `--inject-fault NAME`
corrupts the output of requests that hit the cache, which is what the harness must detect.

The wire format is a real SGLang's (0.5.23, checked by tests/harness/test_sglang_contract.py,
which runs the same contract on this stub and on the real server): /generate answers and
stream chunks with SGLang's meta_info keys, logprob entries `[logprob, token_id, null]`, the
same error bodies (a schema error as `{"object": "error", "message", "type": "Bad Request",
"param", "code"}`, a refused request as `{"error": {"message"}}`, in a stream as an in-band
`data: {"error": {"message", "type", "code", "retryable"}}` chunk), an empty 200 /health,
/model_info, and `speculative_algorithm: null` for a server without speculation. What only
the fake has: `fake`, `inject_fault` and `tokenizer: byte` in /server_info, spec_trace; what it
leaves out: SGLang's other server args and `internal_states`.

Test-only flags: `--token-delay` (seconds per streamed token), `--rid-log FILE` (append every received rid),
`--pid-dir DIR` (write `<role>-i<interval>-<port>.pid`: its pid, and a `.nice` file beside it: its niceness),
`--top-k-max K` (cap on top logprobs, to fail the capability probe), `--no-spec-trace`, `--fail-first N`
(answer the first N /generate requests with HTTP 503), `--context-length N` (prompt + max_new_tokens above it
are refused, as SGLang refuses them), `--server-info-json FILE` (answer the settings endpoints with a recorded
payload instead of the fake's own), `--info-paths` (which of /server_info, /get_server_info exist; both by
default, as in SGLang), `--v1-models` (also answer GET /v1/models, as an OpenAI-compatible server does),
`--incremental` (stream only what is new in each chunk and say so in /server_info, as the built-in engine
does), `--metrics` (serve GET /metrics with a `specgate_cached_tokens_total` counter only: the eviction
counters stay unexposed), `--no-text` (answers carry ids but no text, so the harness decodes them),
`--tokenizer-path PATH` (report PATH as the served tokenizer instead of `tokenizer: byte`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path

from aiohttp import web

TOP1_LOGPROB = -0.05
TOP2_GAP = 2.0  # top-1/top-2 margin: far above the 0.5 threshold, so a mismatch is "hard"


def fake_tokens(input_ids: list[int], n: int, fault: bool) -> list[int]:
    """The deterministic continuation of `input_ids`; shifted by one when `fault` is set."""
    base = sum(input_ids)
    return [(base + 7 * i + (1 if fault else 0)) % 256 for i in range(n)]


def spec_trace(prompt_len: int, n: int, block: int, interval: int) -> list[list[int]]:
    """Verify steps `[pre_len, commit_len, tracked_step]` committing 1..block tokens in turn."""
    trace, pre, k = [], prompt_len, 0
    while pre < prompt_len + n:
        commit = min(1 + k % block, prompt_len + n - pre)
        post = pre + commit
        step = -1
        if pre // interval != post // interval:
            ith = max(post // interval * interval - pre - 1, 0)
            step = ith if ith < commit else -1
        trace.append([pre, commit, step])
        pre, k = post, k + 1
    return trace


class FakeServer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.cache: list[list[int]] = []  # finished sequences (input + output but its last token)
        self.running = 0
        self.failures_left = args.fail_first
        self.spec = args.speculative_algorithm == "DFLASH"
        self.cached_total = 0

    def info(self) -> dict:
        a = self.args
        return {
            "model_path": a.model_path, "tp_size": a.tp_size,
            # SGLang reports no speculation as null, and no draft width then
            "speculative_algorithm": a.speculative_algorithm if self.spec else None,
            "speculative_num_draft_tokens": a.speculative_num_draft_tokens if self.spec else None,
            "mamba_radix_cache_strategy": a.mamba_radix_cache_strategy,
            "mamba_track_interval": a.mamba_track_interval, "page_size": a.page_size,
            "disable_radix_cache": a.disable_radix_cache, "inject_fault": a.inject_fault,
            "fake": True, "incremental_streaming_output": a.incremental, "status": "ready", "version": "fake",
            **({"tokenizer_path": a.tokenizer_path} if a.tokenizer_path else {"tokenizer": "byte"}),
        }

    def cached_len(self, ids: list[int], limit: int | None = None) -> int:
        """The matched prefix at whole intervals, no deeper than `limit` (SGLang's logprob_start_len cap)."""
        if self.args.disable_radix_cache:
            return 0
        best = 0
        for seq in self.cache:
            n = 0
            for a, b in zip(seq, ids, strict=False):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        interval = self.args.mamba_track_interval
        return min(best, len(ids) - 1, len(ids) if limit is None else limit) // interval * interval

    def prompt_logprobs(self, ids: list[int], start: int, cached: int, fault: bool) -> list:
        """SGLang's input_token_logprobs from `start`: null where the position before the token was cached (or
        for the first token); a faulty restore moves the first 4 tokens past the checkpoint by 1."""
        return [[None if p <= cached or p == 0 else TOP1_LOGPROB - (1.0 if fault and p <= cached + 4 else 0.0),
                 ids[p], None] for p in range(start, len(ids))]

    def snapshot(self, rid: str, ids: list[int], out: list[int], cached: int, done: bool, n: int,
                 top_k: int | None, start: int = -1) -> dict:
        """An answer (or cumulative stream chunk) with SGLang's meta_info; logprobs only when asked for
        (`top_k` None: return_logprob off), at most --top-k-max of them per token."""
        meta = {
            "id": rid, "finish_reason": {"type": "length", "length": n} if done else None, "prompt_tokens": len(ids),
            "weight_version": "default", "num_retractions": 0, "reasoning_tokens": 0,
            "completion_tokens": len(out), "cached_tokens": cached,
            "cached_tokens_details": {"device": cached, "host": 0} if cached else None, "dp_rank": None,
        }
        if top_k is not None:
            k = min(top_k, self.args.top_k_max)
            meta.update({
                # logprob_start_len: the prompt's from there (-1, its default: none)
                "input_token_logprobs": self.prompt_logprobs(ids, start, cached, self.faulty(cached))
                if start >= 0 else [],
                "input_top_logprobs": [None] * (len(ids) - start) if start >= 0 else [],
                "output_token_logprobs": [[TOP1_LOGPROB, t, None] for t in out],
                "output_token_logprobs_length": len(out),
                "output_top_logprobs": [
                    [[TOP1_LOGPROB, t, None], [TOP1_LOGPROB - TOP2_GAP, (t + 1) % 256, None]][:k] for t in out
                ],
            })
        if done:
            meta["e2e_latency"] = 0.0
        if self.spec:
            trace = spec_trace(len(ids), len(out), self.args.speculative_num_draft_tokens,
                               self.args.mamba_track_interval)
            meta["spec_verify_ct"] = len(trace)
            meta["spec_accept_length"] = len(out) / len(trace) if trace else 0.0
            if not self.args.no_spec_trace:
                meta["spec_trace"] = trace
        text = "" if self.args.no_text else bytes(out).decode("latin-1")
        return {"text": text, "output_ids": list(out), "meta_info": meta}

    def faulty(self, cached: int) -> bool:
        """--inject-fault: a restore gives wrong tokens (and a moved restore window)."""
        return bool(self.args.inject_fault) and cached > 0

    def _authorized(self, request: web.Request) -> bool:
        key = self.args.api_key
        return key is None or request.headers.get("Authorization") == f"Bearer {key}"

    async def health(self, request: web.Request) -> web.Response:
        return web.Response()  # SGLang's /health: 200 with an empty body

    async def server_info(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return unauthorized()
        if self.args.server_info_json:
            return json_response(json.loads(Path(self.args.server_info_json).read_text()))
        return json_response(self.info())

    async def model_info(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return unauthorized()
        return json_response({"model_path": self.args.model_path, "served_model_name": self.args.model_path,
                                  "tokenizer_path": self.args.tokenizer_path or self.args.model_path,
                                  "is_generation": True, "model_type": "fake", "architectures": ["FakeForCausalLM"]})

    async def models(self, request: web.Request) -> web.Response:
        return json_response({"object": "list", "data": [{"id": self.args.model_path, "object": "model"}]})

    async def metrics(self, request: web.Request) -> web.Response:
        if not self.args.metrics:
            return web.Response(status=404, text="not found")
        return web.Response(text="# HELP specgate_cached_tokens_total Prompt tokens served from the radix cache.\n"
                                 "# TYPE specgate_cached_tokens_total counter\n"
                                 f"specgate_cached_tokens_total {float(self.cached_total)}\n")

    async def flush_cache(self, request: web.Request) -> web.Response:
        if not self._authorized(request):  # SGLang's /flush_cache takes the API key too (admin-optional)
            return unauthorized()
        if self.running:
            return web.Response(status=400, text="Flush cache failed.\n")
        self.cache.clear()
        return web.Response(text=FLUSHED)

    def refusal(self, ids: list[int], n: int) -> str | None:
        """Why SGLang's tokenizer manager would refuse this request (a ValueError there), or None."""
        if not ids:
            return "input_ids cannot be empty."
        total = len(ids) + n
        if total > self.args.context_length:
            return (f"Requested token count exceeds the model's maximum context length of {self.args.context_length}"
                    f" tokens. You requested a total of {total} tokens: {len(ids)} tokens from the input messages and "
                    f"{n} tokens for the completion. Please reduce the number of tokens in the input messages or the "
                    "completion to fit within the limit.")
        return None

    async def generate(self, request: web.Request) -> web.StreamResponse:
        if not self._authorized(request):
            return unauthorized()
        try:
            body = await request.json()
        except ValueError:
            return schema_error("[{'type': 'json_invalid', 'loc': ('body', 1), 'msg': 'JSON decode error'}]")
        ids = body.get("input_ids") if isinstance(body, dict) else None
        if not isinstance(ids, list):
            return schema_error(f"[{{'type': 'value_error', 'loc': ('body', 'input_ids'), 'msg': 'Value error, must "
                                f"be list or null; got {type(ids).__name__}'}}]")
        rid = str(body.get("rid", ""))
        if self.args.rid_log:
            with open(self.args.rid_log, "a") as f:
                f.write(rid + "\n")
        if self.failures_left > 0:
            self.failures_left -= 1
            return json_response({"error": {"message": "injected failure"}}, status=503)
        n = int(body.get("sampling_params", {}).get("max_new_tokens", 16))
        top_k = int(body.get("top_logprobs_num") or 0) if body.get("return_logprob") else None
        if (refused := self.refusal(ids, n)) is not None:
            if not body.get("stream"):
                return json_response({"error": {"message": refused}}, status=400)
            return await self.stream_refusal(request, refused)
        start = int(body.get("logprob_start_len", -1)) if top_k is not None else -1
        cached = self.cached_len(ids, start if start >= 0 else None)
        self.cached_total += cached
        out = fake_tokens(ids, n, fault=self.faulty(cached))
        self.running += 1
        try:
            if not body.get("stream"):
                if self.args.token_delay:
                    await asyncio.sleep(self.args.token_delay * n)
                self.cache.append(ids + out[:-1])
                return json_response(self.snapshot(rid, ids, out, cached, True, n, top_k, start))
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for i in range(1, n + 1):
                if self.args.token_delay:
                    await asyncio.sleep(self.args.token_delay)
                chunk = self.snapshot(rid, ids, out[:i], cached, i == n, n, top_k, start)
                if self.args.incremental:
                    chunk = incremental(chunk, i - 1)
                await resp.write(b"data: " + compact(chunk) + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            self.cache.append(ids + out[:-1])
            return resp
        finally:
            self.running -= 1

    async def stream_refusal(self, request: web.Request, message: str) -> web.StreamResponse:
        """SGLang's answer to a refused streamed request: HTTP 200, one in-band error chunk, [DONE]."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        err = {"error": {"message": message, "type": "invalid_request_error", "code": 400, "retryable": False}}
        await resp.write(b"data: " + compact(err) + b"\n\ndata: [DONE]\n\n")
        return resp


def compact(obj) -> bytes:
    """JSON as SGLang writes it (orjson: no spaces after separators)."""
    return json.dumps(obj, separators=(",", ":")).encode()


def json_response(obj, status: int = 200) -> web.Response:
    """A JSON response in SGLang's compact form."""
    return web.Response(body=compact(obj), status=status, content_type="application/json")


FLUSHED = ("Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, "
           "the operation will not be performed.)\n")


def unauthorized() -> web.Response:
    """SGLang's answer to a missing or wrong API key."""
    return json_response({"error": "Unauthorized"}, status=401)


def schema_error(errors: str) -> web.Response:
    """SGLang's answer to a /generate body its request schema rejects (FastAPI's validation, OpenAI-shaped)."""
    return json_response({"object": "error", "message": f"1 validation error:\n  {errors}", "type": "Bad Request",
                              "param": None, "code": 400}, status=400)


def incremental(snapshot: dict, sent: int) -> dict:
    """The cumulative `snapshot` cut to what is new after `sent` tokens (SGLang's incremental streaming)."""
    meta = dict(snapshot["meta_info"])
    for key in ("output_token_logprobs", "output_top_logprobs"):
        if key in meta:
            meta[key] = meta[key][sent:]
    if "spec_trace" in meta and meta["finish_reason"] is None:  # its synthetic steps: all in the last chunk
        meta["spec_trace"] = []
    return {"text": snapshot["text"][sent:], "output_ids": snapshot["output_ids"][sent:], "meta_info": meta}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-path", default="default")
    p.add_argument("--model-preset", default="small")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--speculative-algorithm", default="NONE", choices=["NONE", "DFLASH"])
    p.add_argument("--speculative-num-draft-tokens", type=int, default=8)
    p.add_argument("--mamba-radix-cache-strategy", default="extra_buffer")
    p.add_argument("--mamba-track-interval", type=int, default=256)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--disable-radix-cache", action="store_true")
    p.add_argument("--max-running-requests", type=int, default=16)
    p.add_argument("--inject-fault", default=None)
    p.add_argument("--api-key", default=os.environ.get("SPECGATE_API_KEY"))  # how built-in replicas get it
    p.add_argument("--token-delay", type=float, default=0.0)
    p.add_argument("--rid-log", default=None)
    p.add_argument("--pid-dir", default=None)
    p.add_argument("--top-k-max", type=int, default=2)
    p.add_argument("--no-spec-trace", action="store_true")
    p.add_argument("--fail-first", type=int, default=0)
    p.add_argument("--context-length", type=int, default=1 << 20)
    p.add_argument("--server-info-json", default=None)
    p.add_argument("--info-paths", default="/server_info,/get_server_info")  # both, as SGLang 0.5.23
    p.add_argument("--v1-models", action="store_true")
    p.add_argument("--incremental", action="store_true")
    p.add_argument("--metrics", action="store_true")
    p.add_argument("--no-text", action="store_true")
    p.add_argument("--tokenizer-path", default=None)
    return p.parse_args(argv)


def make_app(args: argparse.Namespace) -> web.Application:
    server = FakeServer(args)
    app = web.Application()
    app.router.add_get("/health", server.health)
    for path in filter(None, args.info_paths.split(",")):
        app.router.add_get(path, server.server_info)
    if args.v1_models:
        app.router.add_get("/v1/models", server.models)
    app.router.add_post("/flush_cache", server.flush_cache)
    app.router.add_get("/flush_cache", server.flush_cache)
    app.router.add_get("/model_info", server.model_info)
    app.router.add_post("/generate", server.generate)
    app.router.add_get("/metrics", server.metrics)
    return app


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.pid_dir:
        role = "candidate" if args.speculative_algorithm == "DFLASH" else "reference"
        name = f"{role}-i{args.mamba_track_interval}-{args.port}.pid"
        Path(args.pid_dir, name).write_text(str(os.getpid()))
        Path(args.pid_dir, name).with_suffix(".nice").write_text(str(os.nice(0)))
    web.run_app(make_app(args), host=args.host, port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
