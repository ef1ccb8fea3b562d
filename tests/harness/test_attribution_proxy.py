"""Attribution without spec_trace: the built-in engine with stale-seq-lens behind a proxy that strips it.

A real SGLang reports no verify steps (`spec_trace`, `spec_verify_ct`). The proxy here
forwards everything to a built-in candidate server and drops those two keys from every
`meta_info` (streamed chunks and plain answers), so the harness sees what it would see
from SGLang. The gate must still fail, and each flagged turn must be linked by position
to the previous turn's crossing of the checkpoint it restored; the report says "unknown"
where verify steps are not reported, never "no". A run straight at the server (spec_trace
present) gives the verify-linked set the position links must agree with.
"""

from __future__ import annotations

import asyncio
import json
import threading

import aiohttp
import pandas as pd
import pytest
from aiohttp import web

from harness.replica import free_port
from harness.run import main
from tests.engine.server.client import Server
from tests.harness.helpers import frozen_subset

pytestmark = pytest.mark.slow
INTERVAL = 128
# turn 0 crosses the next boundary in a verify step and turn 1 restores it (offsets), one spans two
# boundaries (multi), one never reaches a boundary (control)
SESSIONS = ("frozen-i128-k1-m8", "frozen-i128-k1-m3", "frozen-i128-k1-m1", "frozen-i128-k1-p0",
            "frozen-i128-k2-m5", "frozen-i128-multi1", "frozen-i128-ctrl1")
STRIPPED = ("spec_trace", "spec_verify_ct")


def strip(obj):
    """The answer without the verify-step keys a real SGLang does not report."""
    if isinstance(obj, dict) and isinstance(obj.get("meta_info"), dict):
        for key in STRIPPED:
            obj["meta_info"].pop(key, None)
    return obj


async def _forward(request: web.Request, upstream: str, http: aiohttp.ClientSession) -> web.StreamResponse:
    body = await request.read()
    headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")}
    async with http.request(request.method, upstream + request.path_qs, data=body or None, headers=headers) as up:
        if up.content_type == "text/event-stream":
            resp = web.StreamResponse(status=up.status, headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            async for line in up.content:  # one SSE line at a time: `data: {json}` or blank
                text = line.decode()
                if text.startswith("data: ") and text.strip() != "data: [DONE]":
                    text = "data: " + json.dumps(strip(json.loads(text[len("data: "):]))) + "\n"
                await resp.write(text.encode())
            await resp.write_eof()
            return resp
        raw = await up.read()
        if up.content_type == "application/json" and request.path.startswith("/generate"):
            raw = json.dumps(strip(json.loads(raw))).encode()
        return web.Response(status=up.status, body=raw, content_type=up.content_type)


class StrippingProxy:
    """An aiohttp proxy in a thread in front of `upstream`."""

    def __init__(self, upstream: str) -> None:
        self.port = free_port("127.0.0.1")
        self.url = f"http://127.0.0.1:{self.port}"
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self.thread = threading.Thread(target=self._serve, args=(upstream, started), daemon=True)
        self.thread.start()
        assert started.wait(30), "the proxy did not start"

    def _serve(self, upstream: str, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)

        async def start():
            self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300))
            app = web.Application()
            async def handle(request: web.Request) -> web.StreamResponse:
                return await _forward(request, upstream, self.http)

            app.router.add_route("*", "/{tail:.*}", handle)
            self.runner = web.AppRunner(app)
            await self.runner.setup()
            await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

        self.loop.run_until_complete(start())
        started.set()
        self.loop.run_forever()

    def close(self) -> None:
        async def stop():
            await self.http.close()
            await self.runner.cleanup()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    logs = tmp_path_factory.mktemp("engines")
    cand = Server(["--speculative-algorithm", "DFLASH", "--mamba-track-interval", str(INTERVAL),
                   "--inject-fault", "stale-seq-lens"], logs / "cand.log")
    ref = Server(["--speculative-algorithm", "NONE", "--disable-radix-cache"], logs / "ref.log")
    proxy = StrippingProxy(cand.url)
    yield cand.url, proxy.url, ref.url
    proxy.close()
    cand.stop()
    ref.stop()



def test_stale_seq_lens_behind_a_spec_trace_stripping_proxy_is_attributed_by_position(engines, tmp_path, capsys):
    cand, proxy, ref = engines
    suite = frozen_subset(tmp_path / "subset.jsonl", SESSIONS)
    common = ["--suite", suite, "--reference-endpoint", ref, "--concurrency", "1", "--runs-dir",
              str(tmp_path / "runs"), "--no-progress", "--request-timeout", "120",
              "--drift-tolerance", "1e-3",  # the tiny random model's floor is ~2e-4 (tests/reports)
              "--max-soft-rate", "1"]  # random weights: low-margin numeric flips are allowed
    assert main([*common, "--endpoint", proxy, "--run-id", "stripped"]) == 1
    assert main([*common, "--endpoint", cand, "--run-id", "direct"]) == 1
    capsys.readouterr()
    runs = tmp_path / "runs"
    stripped, direct = (pd.read_csv(runs / name / "requests.csv") for name in ("stripped", "direct"))
    assert len(stripped) == len(direct) == 2 * len(SESSIONS)
    assert stripped["spec_verify_ct"].isna().all() and (stripped["crossing_source"] == "inferred").all()
    assert not stripped["restored_verify_crossed"].any()

    flagged = set(stripped.loc[stripped["class"].isin(["drift", "hard"]), "key"])
    position = set(stripped.loc[stripped["restored_link"] == "position", "key"])
    verify = set(direct.loc[direct["restored_verify_crossed"].astype(bool), "key"])
    print(f"flagged {sorted(flagged)}; position-linked {len(position)}; verify-linked (direct) {len(verify)}")
    assert len(position) == 6  # the offset and multi sessions' turn 1 (not the control's)
    assert position == verify  # the position link finds exactly the turns the reported verify steps link
    assert flagged and flagged <= position  # every flagged turn restored a checkpoint its previous turn crossed
    assert flagged == set(direct.loc[direct["class"].isin(["drift", "hard"]), "key"])

    b = pd.read_csv(runs / "stripped" / "boundaries.csv")
    rp = b[b["boundary_kind"] == "restored_position"]
    assert int((rp["hard"] + rp["drift"]).sum()) == len(flagged)
    assert "restored_verify" not in set(b["boundary_kind"])
    summary = (runs / "stripped" / "summary.md").read_text()
    assert "Turns that restored a checkpoint their previous turn crossed (position-linked" in summary
    html = (runs / "stripped" / "report.html").read_text()
    assert "position-linked" in html and "no restored checkpoint was crossed" not in html
    assert html.count("<pre>candidate: ") >= len(flagged)  # the cases show text, decoded with the byte tokenizer
