"""make_app against fake engines, in process: failures inside the engine become JSON errors, never a dead server."""

from __future__ import annotations

import asyncio

from aiohttp.test_utils import TestClient, TestServer

from engine.config import EngineConfig
from engine.io_struct import GenerateOutput
from engine.model.config import preset
from engine.server.app import drain, make_app
from engine.server.async_engine import EngineDeadError


class FakeEngine:
    """Just enough of AsyncEngine; `fail` decides what generate_stream does."""

    def __init__(self, fail: BaseException | None = None, tokens: int = 3, delay: float = 0.0):
        self.cfg = EngineConfig(model_path="random", model_preset="tiny")
        self.model_config = preset("tiny")
        self.fail, self.tokens, self.delay = fail, tokens, delay
        self.health_error: str | None = None
        self.aborted: list[str] = []

    @property
    def healthy(self) -> bool:
        return self.health_error is None

    def health_problem(self) -> str | None:
        return self.health_error

    async def generate_stream(self, req):
        if self.fail is not None:
            raise self.fail
        out = GenerateOutput(rid=req.rid, prompt_tokens=len(req.input_ids))
        for i in range(self.tokens):
            await asyncio.sleep(self.delay)
            if req.rid in self.aborted:
                out.finished, out.finish_reason = True, {"type": "abort", "message": "aborted"}
                yield out
                return
            out.output_ids.append(65 + i)
            if i == self.tokens - 1:
                out.finished, out.finish_reason = True, {"type": "length", "length": self.tokens}
            yield out

    def abort(self, rid: str) -> None:
        self.aborted.append(rid)

    def num_active(self) -> int:
        return 0

    def stats(self) -> dict:
        return {"requests": 0, "running": 0, "waiting": 0}

    def server_info(self) -> dict:
        raise RuntimeError("boom")

    def flush_cache(self) -> bool:
        return True


def run(engine: FakeEngine, scenario) -> None:
    async def main():
        app = make_app(engine)
        async with TestClient(TestServer(app)) as client:
            await scenario(client, app)

    asyncio.run(main())


def test_unexpected_exception_is_500_json_and_server_keeps_serving():
    async def scenario(client, app):
        r = await client.post("/generate", json={"text": "hi"})
        assert r.status == 500
        assert "RuntimeError: kaput" in (await r.json())["error"]["message"]
        r = await client.get("/server_info")
        assert r.status == 500 and "boom" in (await r.json())["error"]["message"]
        assert (await client.get("/health")).status == 200

    run(FakeEngine(fail=RuntimeError("kaput")), scenario)


def test_dead_engine_is_503():
    engine = FakeEngine(fail=EngineDeadError("engine loop failed: oops"))

    async def scenario(client, app):
        r = await client.post("/generate", json={"text": "hi"})
        assert r.status == 503 and "oops" in (await r.json())["error"]["message"]
        engine.health_error = "engine loop failed: oops"
        r = await client.get("/health")
        assert r.status == 503 and "oops" in (await r.json())["error"]["message"]
        r = await client.get("/metrics")  # still answers, so that its health gauge can read 0
        text = await r.text()
        assert r.status == 200
        assert "specgate_engine_healthy 0.0" in text and "specgate_requests_total" not in text

    run(engine, scenario)


def test_engine_value_error_is_400():
    async def scenario(client, app):
        r = await client.post("/v1/completions", json={"prompt": "hi"})
        assert r.status == 400 and (await r.json())["error"]["message"].startswith("rid:")

    run(FakeEngine(fail=ValueError("rid: a request with id 'x' is already running")), scenario)


def test_drain_aborts_requests_past_the_timeout():
    engine = FakeEngine(tokens=1000, delay=0.01)

    async def scenario(client, app):
        task = asyncio.ensure_future(client.post("/generate", json={"text": "hi"}))
        await asyncio.sleep(0.1)
        assert await drain(app, timeout=0.2) == 1
        r = await task
        assert (await r.json())["meta_info"]["finish_reason"]["type"] == "abort"
        r = await client.post("/generate", json={"text": "hi"})
        assert r.status == 503

    run(engine, scenario)
