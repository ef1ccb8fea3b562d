"""Driver overhead: requests/s and client CPU per request against a server that answers instantly.

The server streams canned SGLang answers (cumulative snapshots with logprobs and
top-2) without any model. By default it runs in a child process, so that
`time.process_time()` counts only the driver; `--in-process` serves from the
driver's own event loop (then the CPU figure includes the server).
The same requests are then sent by a bare aiohttp loop against the same server, as lean as the
driver's reader: POST, read the stream's bytes as they come, JSON-decode only the chunks that the
driver decodes too (up to the second token, for TTFT and time to second token, and the last one, the
answer) and the reference answer, nothing recorded. The driver's CPU per request is printed as a
ratio of that floor, for a closed-loop sweep point (`--concurrency`) and an open-loop one
(`--request-rate`, Poisson arrivals; the bare loop sends at the same planned times). Each mode runs the
driver and the bare loop in turn `--repeat` times and compares each side's least CPU per request (on a
noisy machine the least is the closest to the cost itself); the ratio of each pair is printed too.

    python benchmarks/driver_bench.py --requests 2000 --concurrency 16 --request-rate 400
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import socket
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web

from harness.arrival import schedule
from harness.driver import Driver
from harness.pools import Pool, Replica
from harness.progress import Progress
from harness.targets import run_config
from harness.targets.builtin import candidate_engine, reference_engine
from records.jsonl import RecordFiles
from workloads.schema import Session, Turn


def canned(n: int, stream: bool) -> list[bytes] | bytes:
    """SGLang answers for n output tokens: every cumulative stream chunk, or the one JSON body."""
    def snap(k: int) -> dict:
        out = [(7 * i) % 256 for i in range(k)]
        return {"text": "x" * k, "output_ids": out, "meta_info": {
            "id": "bench", "prompt_tokens": 0, "completion_tokens": k, "cached_tokens": 0,
            "finish_reason": {"type": "length", "length": n} if k == n else None,
            "output_token_logprobs": [[-0.1, t, None] for t in out],
            "output_top_logprobs": [[[-0.1, t, None], [-2.0, t + 1, None]] for t in out],
            "spec_verify_ct": max(1, k // 3), "spec_accept_length": 3.0}}
    if not stream:
        return json.dumps(snap(n)).encode()
    return [b"data: " + json.dumps(snap(k)).encode() + b"\n\n" for k in range(1, n + 1)] + [b"data: [DONE]\n\n"]


def make_app() -> web.Application:
    cache: dict[tuple[int, bool], object] = {}

    async def generate(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        n, stream = int(body["sampling_params"]["max_new_tokens"]), bool(body.get("stream"))
        answer = cache.get((n, stream)) or cache.setdefault((n, stream), canned(n, stream))
        if not stream:
            return web.Response(body=answer, content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for chunk in answer:
            await resp.write(chunk)
        return resp

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/generate", generate)
    app.router.add_post("/flush_cache", ok)
    app.router.add_get("/health", ok)
    return app


def serve_forever(port: int) -> None:
    web.run_app(make_app(), host="127.0.0.1", port=port, print=None, access_log=None)


def sessions(requests: int, prompt_len: int, max_new: int) -> list[Session]:
    """requests/2 two-turn sessions with distinct prompts (so every reference input is distinct too)."""
    out = []
    for k in range((requests + 1) // 2):
        prompt = tuple((k * 31 + j) % 256 for j in range(prompt_len))
        out.append(Session(f"b{k}", "bench", None, "bench", "", {},
                           (Turn(max_new, input_ids=prompt), Turn(max_new, suffix_ids=(10, 10)))))
    return out


async def bench(url: str | None, args: argparse.Namespace, rate: float | None = None) -> tuple[int, float, float]:
    """The driver over the bench sessions: one closed-loop point (`args.concurrency`), or one open-loop point at
    `rate` requests per second; returns (candidate requests, wall s, client CPU s)."""
    runner = None
    if url is None:  # serve from this loop
        runner = web.AppRunner(make_app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    cfg = run_config(intervals=(256,))
    work = sessions(args.requests, args.prompt_len, args.max_new_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        cand = Pool("i256", "candidate", candidate_engine(cfg, 256), [Replica("i256-r0", url)], True, 5.0)
        ref = Pool("reference", "reference", reference_engine(cfg), [Replica("reference-r0", url)], True, 5.0)
        files = RecordFiles(Path(tmp), set())
        progress = Progress(0, 0, enabled=False)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            driver = Driver(run_id="bench", concurrency=() if rate else (args.concurrency,), candidates=[cand],
                            reference=ref, files=files, http=http, progress=progress,
                            reference_concurrency=args.concurrency, request_rate=(rate,) if rate else (),
                            arrival="poisson", seed=0)
            driver.progress.write = lambda line: None
            cpu0, t0 = time.process_time(), time.perf_counter()
            await driver.run({"i256": tuple(work)})
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        files.close()
    if runner is not None:
        await runner.cleanup()
    return progress.done, wall, cpu


async def read_lean(resp: aiohttp.ClientResponse) -> dict:
    """A stream read as the driver's reader does: bytes as they come, only the first chunks (until one holds
    two tokens: the canned stream's second) and the last one JSON-decoded."""
    buf, pos, decoded = bytearray(), 0, 0
    async for data in resp.content.iter_any():
        buf += data
        while decoded < 2 and (end := buf.find(b"\n\n", pos)) >= 0:
            json.loads(buf[pos + 6:end])
            pos, decoded = end + 2, decoded + 1
    events = bytes(buf).rstrip().split(b"\n\n")
    return json.loads(events[-2 if events[-1] == b"data: [DONE]" else -1][6:])


async def bare(url: str | None, args: argparse.Namespace, rate: float | None = None) -> tuple[int, float, float]:
    """The floor: the same candidate (streamed) and reference (one body) requests from a bare aiohttp loop,
    `args.concurrency` in flight, or at `rate` per second at the driver's planned times (turn 1 after turn 0)."""
    runner = None
    if url is None:
        runner = web.AppRunner(make_app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    work = sessions(args.requests, args.prompt_len, args.max_new_tokens)

    async def send(http: aiohttp.ClientSession, ids) -> None:
        for stream in (True, False):
            body = {"input_ids": list(ids), "stream": stream,
                    "sampling_params": {"max_new_tokens": args.max_new_tokens, "temperature": 0}}
            async with http.post(url + "/generate", json=body) as resp:
                await (read_lean(resp) if stream else resp.json())

    async def session(http: aiohttp.ClientSession, k: int, s: Session, t0: float, plan: dict) -> int:
        n = 0
        for turn, t in enumerate(s.turns):
            if plan:
                await asyncio.sleep(max(0.0, t0 + plan[(k, turn)] - time.perf_counter()))
            await send(http, t.input_ids or s.turns[0].input_ids + t.suffix_ids)
            n += 1
        return n

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        cpu0, t0 = time.process_time(), time.perf_counter()
        if rate:
            plan = schedule([len(s.turns) for s in work], rate, "poisson", 0)
            n = sum(await asyncio.gather(*(session(http, k, s, t0, plan) for k, s in enumerate(work))))
        else:
            todo = iter(enumerate(work))

            async def worker() -> int:
                return sum([await session(http, k, s, t0, {}) for k, s in todo])

            n = sum(await asyncio.gather(*(worker() for _ in range(args.concurrency))))
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    if runner is not None:
        await runner.cleanup()
    return n, wall, cpu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=2000, help="candidate requests (each also has a reference)")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--in-process", action="store_true", help="serve from the driver's process")
    p.add_argument("--request-rate", type=float, default=400.0,
                   help="the open-loop point's requests per second (Poisson; 0: skip the rate mode)")
    p.add_argument("--repeat", type=int, default=3, help="driver and bare runs per mode, alternating (the machine "
                   "is noisy: each side's least CPU per request is compared)")
    args = p.parse_args()
    proc = None
    url = None
    if not args.in_process:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        proc = multiprocessing.Process(target=serve_forever, args=(port,), daemon=True)
        proc.start()
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("benchmark server did not start") from None
                time.sleep(0.05)
    try:
        modes = [("closed loop", None)] + ([("open loop", args.request_rate)] if args.request_rate else [])
        figures = []
        for name, rate in modes:  # driver and bare loop in turn, `--repeat` times: each side's least CPU counts
            runs = [(asyncio.run(bench(url, args, rate)), asyncio.run(bare(url, args, rate)))
                    for _ in range(args.repeat)]
            figures.append((name, rate, min((d for d, _ in runs), key=lambda f: f[2] / f[0]),
                            min((b for _, b in runs), key=lambda f: f[2] / f[0]),
                            [(d[2] / d[0]) / (b[2] / b[0]) for d, b in runs]))
    finally:
        if proc is not None:
            proc.terminate()
    where = "in-process server (CPU includes it)" if args.in_process else "server in a child process"
    for name, rate, (n, wall, cpu), (bn, bwall, bcpu), pairs in figures:
        shape = f"concurrency {args.concurrency}" if rate is None else f"{rate:g} requests/s, poisson"
        print(f"{name}: {n} candidate requests (+ {n} reference), {args.max_new_tokens} streamed tokens each, "
              f"{shape}, {where}")
        print(f"  requests/s: {n / wall:.0f} candidate ({2 * n / wall:.0f} HTTP requests/s)")
        print(f"  client CPU: {1000 * cpu / n:.2f} ms per candidate request (incl. its reference and records); "
              f"wall {wall:.2f}s, CPU {cpu:.2f}s")
        print(f"  bare aiohttp loop, same requests and server: {1000 * bcpu / bn:.2f} ms per candidate request "
              f"(wall {bwall:.2f}s); driver / bare = {(cpu / n) / (bcpu / bn):.2f}x")
        if len(pairs) > 1:
            print(f"  (least CPU of {len(pairs)} alternating runs each; per pair: "
                  f"{', '.join(f'{r:.2f}x' for r in pairs)})")


if __name__ == "__main__":
    main()
