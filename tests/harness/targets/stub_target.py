"""A fifth kind of target, defined only for the tests: the fake SGLang server (tests/harness/fake_server.py), started
in this process on free local ports, one candidate pool per interval and a cold reference.

It is the whole of what a new target takes: its settings (declared with `setting`, so
they become flags, TOML keys and resume rules), its Target, and `register` — no edit
anywhere else. test_fifth_target.py registers it and drives it through
`python -m harness.run`'s entry point.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from harness.backends import Backend, make_backend
from harness.config import RunConfig, TargetSettings
from harness.plan import REFERENCE_POOL, EngineSpec, Plan, PoolPlan, sessions_for, skipped
from harness.pools import Pool, external_pools
from harness.settings import Need, setting
from harness.targets.base import Target
from harness.workload import WorkloadTarget, from_flags
from tests.harness.fake_server import make_app, parse_args
from tests.harness.helpers import candidate_args, reference_args

FAULTS = ("shift-restored",)  # the fake server's one fault: a restored turn's tokens are shifted by one


@dataclass(frozen=True)
class StubSettings(TargetSettings):
    """The stub's own settings: a fault for its candidates, and its servers' replicas per pool."""

    key = "stub"
    managed = False  # no Ray: its servers live in this process

    stub_fault: str | None = setting(None, "str", "stub target (tests): a fault of the fake server for the "
                                     f"candidates ({', '.join(FAULTS)})", resume="fixed")

    @property
    def noisy(self) -> bool:
        return False  # the fake is deterministic: the exact oracle applies

    @property
    def drift_tolerance(self) -> float:
        return 1e-3

    def validate(self, run: RunConfig, need: Need) -> None:
        super().validate(run, need)
        need(run.backend == "sglang", f"--engine stub speaks SGLang's /generate: drop --backend {run.backend}")
        need(self.stub_fault in (None, *FAULTS), f"--stub-fault must be one of {', '.join(FAULTS)}, got "
             f"{self.stub_fault!r}")


class StubTarget(Target):
    """Fake servers in this process: a DFlash + radix candidate per interval, a cold reference."""

    settings_class = StubSettings
    settings: StubSettings

    def workload(self, infos: dict[str, dict]) -> WorkloadTarget:
        return from_flags(self.cfg, "byte", "the stub target")

    def plan(self, sessions: list, infos: dict[str, dict]) -> Plan:
        cfg = self.cfg
        cands = tuple(PoolPlan(f"i{i}", "candidate", EngineSpec(i, cfg.block_size, "extra_buffer", 1,
                                                                self.settings.stub_fault, True, True),
                               1, sessions_for(sessions, i)) for i in cfg.intervals)
        ref = PoolPlan(REFERENCE_POOL, "reference", EngineSpec(None, None, None, 1, None, False, False), 1)
        return Plan(cands, ref, cfg.concurrency, skipped(sessions, set(cfg.intervals)))

    def describe(self, plan: Plan) -> str:
        return plan.describe(self.cfg)

    def backend(self) -> Backend:
        return make_backend("sglang", self.cfg.api_key)

    @contextmanager
    def servers(self, plan: Plan, run_dir: Path, run_id: str) -> Iterator[tuple[list[Pool], Pool]]:
        """One fake server per pool, on a loop of its own in a thread; stopped after the run."""
        fault = ("--inject-fault", self.settings.stub_fault) if self.settings.stub_fault else ()
        argvs = {p.name: candidate_args(p.engine.interval, "--speculative-num-draft-tokens", str(p.engine.block_size),
                                        *fault) for p in plan.candidates}
        argvs[REFERENCE_POOL] = reference_args()
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        runners, urls = [], {}

        async def start(name: str, argv: list[str]) -> None:
            runner = web.AppRunner(make_app(parse_args(argv)), access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            runners.append(runner)
            host, port = runner.addresses[0][:2]
            urls[name] = f"http://{host}:{port}"

        try:
            for name, argv in argvs.items():
                asyncio.run_coroutine_threadsafe(start(name, argv), loop).result(30)
            placed = Plan(tuple(_at(p, urls[p.name]) for p in plan.candidates), _at(plan.reference,
                                                                                      urls[REFERENCE_POOL]),
                          plan.concurrency, plan.skipped_sessions)
            yield external_pools(placed, self.cfg.api_key, self.cfg.recover_timeout, self.backend())
        finally:
            for runner in runners:
                asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(30)


def _at(pool: PoolPlan, url: str) -> PoolPlan:
    return PoolPlan(pool.name, pool.role, pool.engine, 1, pool.sessions, (url,))
