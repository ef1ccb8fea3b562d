"""A vLLM-like OpenAI server for the harness tests: /v1/models, /v1/completions, /metrics; no /server_info.

Outputs are the fake server's (tests/harness/fake_server.py): token i of an answer
is `(sum(prompt) + 7 * i) % 256`, and a prefix cache of block `--block-size`
reports `cached_tokens`. What vLLM makes optional is optional here too:
`--return-token-ids` (honour vLLM's return_token_ids), `--tokens-as-ids`
(`--return-tokens-as-token-ids`: logprob tokens "token_id:N"; else byte-token
text as the built-in server spells it), `--prompt-tokens-details`
(`usage.prompt_tokens_details`), `--dev-mode` (POST /reset_prefix_cache),
`--strict` (400 on vLLM's extra fields, as OpenAI itself), `--num-spec-tokens K`
(speculative: spec_decode counters with K positions in /metrics),
`--no-prefix-caching`, `--no-metrics`.
"""

from __future__ import annotations

import argparse
import json

from aiohttp import web

from engine.server.format import token_str
from tests.harness.fake_server import TOP1_LOGPROB, TOP2_GAP, fake_tokens

VENDOR = {"ignore_eos", "return_token_ids", "return_tokens_as_token_ids"}


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class Stub:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.cache: list[list[int]] = []
        self.drafts = self.accepted = 0

    def name(self, t: int) -> str:
        return f"token_id:{t}" if self.args.tokens_as_ids else token_str(t)

    def cached(self, ids: list[int]) -> int:
        if self.args.no_prefix_caching:
            return 0
        best = max((common_prefix(s, ids) for s in self.cache), default=0)
        return min(best, len(ids) - 1) // self.args.block_size * self.args.block_size

    def choice(self, out: list[int], start: int, body: dict, done: bool, n: int, first: bool) -> dict:
        part = out[start:]
        c = {"index": 0, "text": "".join(chr(t) if t < 128 else "?" for t in part),
             "finish_reason": "length" if done and len(out) == n else None}
        if body.get("logprobs") is not None:
            top = [{self.name(t): TOP1_LOGPROB, self.name((t + 1) % 256): TOP1_LOGPROB - TOP2_GAP} for t in part]
            c["logprobs"] = {"tokens": [self.name(t) for t in part], "token_logprobs": [TOP1_LOGPROB] * len(part),
                             "top_logprobs": top, "text_offset": list(range(start, len(out)))}
        if body.get("return_token_ids") and self.args.return_token_ids:
            c["token_ids"] = part
            if first:
                c["prompt_token_ids"] = body["prompt"]
        return c

    def usage(self, ids: list[int], out: list[int], cached: int) -> dict:
        u = {"prompt_tokens": len(ids), "completion_tokens": len(out), "total_tokens": len(ids) + len(out),
             "prompt_tokens_details": None}
        if self.args.prompt_tokens_details:
            u["prompt_tokens_details"] = {"cached_tokens": cached}
        return u

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        extra = sorted(VENDOR & set(body))
        if self.args.strict and extra:
            return web.json_response({"error": {"message": f"Unrecognized request argument: {extra[0]}"}}, status=400)
        ids, n = body["prompt"], int(body.get("max_tokens") or 16)
        cached = self.cached(ids)
        out = fake_tokens(ids, n, fault=False)
        if self.args.num_spec_tokens:
            self.drafts += n // 2
            self.accepted += n // 3
        head = {"id": "cmpl-x", "object": "text_completion", "created": 0, "model": self.args.model}
        self.cache.append(ids + out)
        if not body.get("stream"):
            return web.json_response(dict(head, choices=[self.choice(out, 0, body, True, n, True)],
                                          usage=self.usage(ids, out, cached)))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(n):
            chunk = dict(head, choices=[self.choice(out[:i + 1], i, body, i == n - 1, n, i == 0)])
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        if (body.get("stream_options") or {}).get("include_usage"):
            final = dict(head, choices=[], usage=self.usage(ids, out, cached))
            await resp.write(b"data: " + json.dumps(final).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def metrics(self, request: web.Request) -> web.Response:
        a, m = self.args, f'engine="0",model_name="{self.args.model}"'
        lines = [f'vllm:cache_config_info{{block_size="{a.block_size}",cache_dtype="auto",enable_prefix_caching='
                 f'"{not a.no_prefix_caching}",{m},mamba_block_size="{a.block_size}",mamba_cache_mode="align"}} 1.0',
                 f"vllm:prefix_cache_queries_total{{{m}}} 10.0", f"vllm:prefix_cache_hits_total{{{m}}} 4.0"]
        if a.num_spec_tokens:
            lines += [f"vllm:spec_decode_num_drafts_total{{{m}}} {float(self.drafts)}",
                      f"vllm:spec_decode_num_draft_tokens_total{{{m}}} {float(self.drafts * a.num_spec_tokens)}",
                      f"vllm:spec_decode_num_accepted_tokens_total{{{m}}} {float(self.accepted)}"]
            lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{m},position="{k}"}} 1.0'
                      for k in range(a.num_spec_tokens)]
        return web.Response(text="# HELP vllm:x stub\n" + "\n".join(lines) + "\n")

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.args.model, "object": "model"}]})

    async def reset(self, request: web.Request) -> web.Response:
        self.cache.clear()
        return web.Response(text="OK")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model", default="stub-model")
    p.add_argument("--block-size", type=int, default=16)
    for flag in ("--return-token-ids", "--tokens-as-ids", "--prompt-tokens-details", "--dev-mode", "--strict",
                 "--no-prefix-caching", "--no-metrics"):
        p.add_argument(flag, action="store_true")
    p.add_argument("--num-spec-tokens", type=int, default=0)
    args = p.parse_args()
    stub = Stub(args)
    app = web.Application()
    app.router.add_get("/health", lambda r: web.Response(text=""))
    app.router.add_get("/v1/models", stub.models)
    app.router.add_post("/v1/completions", stub.completions)
    if not args.no_metrics:
        app.router.add_get("/metrics", stub.metrics)
    if args.dev_mode:
        app.router.add_post("/reset_prefix_cache", stub.reset)
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
