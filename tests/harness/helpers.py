"""Shared helpers for the harness tests: tiny workloads, in-process fake servers, record readers."""

from __future__ import annotations

import contextlib
import json
import sys
from collections import Counter
from pathlib import Path

from aiohttp import web

from harness.plan import EngineSpec
from harness.pools import Pool, Replica
from tests.harness.fake_server import make_app, parse_args
from workloads.schema import Session, Turn, dumps_jsonl

FAKE_SERVER = (sys.executable, "-m", "tests.harness.fake_server")
REPO = Path(__file__).resolve().parents[2]
SUFFIX = (10, 35, 10)  # "\n#\n"


def make_sessions(n: int, turns: int = 2, interval: int | None = None, prompt_len: int = 20, max_new: int = 8,
                  prefix: str = "s") -> list[Session]:
    """`n` sessions with distinct printable prompts of `prompt_len` tokens and `turns` turns each."""
    out = []
    for k in range(n):
        prompt = tuple(97 + (k * 7 + j) % 26 for j in range(prompt_len))
        ts = [Turn(max_new, input_ids=prompt, text=bytes(prompt).decode())]
        ts += [Turn(max_new, suffix_ids=SUFFIX, suffix_text=bytes(SUFFIX).decode()) for _ in range(turns - 1)]
        out.append(Session(f"{prefix}{k}", "tiny", interval, "test", "harness test", {"k": k}, tuple(ts)))
    return out


def write_workload(path: Path, sessions: list[Session]) -> Path:
    path.write_text(dumps_jsonl(sessions))
    return path


def candidate_args(interval: int, *extra: str) -> list[str]:
    return ["--speculative-algorithm", "DFLASH", "--speculative-num-draft-tokens", "4",
            "--mamba-track-interval", str(interval), *extra]


def reference_args(*extra: str) -> list[str]:
    return ["--speculative-algorithm", "NONE", "--disable-radix-cache", *extra]


@contextlib.asynccontextmanager
async def fake_servers(*argvs: list[str]):
    """Start one in-process fake server per argv on free ports; yield their URLs."""
    runners, urls = [], []
    try:
        for argv in argvs:
            runner = web.AppRunner(make_app(parse_args(argv)), access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            runners.append(runner)
            host, port = runner.addresses[0][:2]
            urls.append(f"http://{host}:{port}")
        yield urls
    finally:
        for r in runners:
            await r.cleanup()


def pool(name: str, urls: list[str], engine: EngineSpec, role: str = "candidate", recover: float = 1.0,
         api_key: str | None = None) -> Pool:
    return Pool(name, role, engine, [Replica(f"{name}-r{i}", u) for i, u in enumerate(urls)], external=True,
                recover_timeout=recover, api_key=api_key)


def engine_pair(logs: Path):
    """A built-in DFlash candidate (I = 128) and a cold reference server; yields their URLs, then stops both
    (the body of a module-scoped fixture)."""
    from tests.engine.server.client import Server

    cand = Server(["--speculative-algorithm", "DFLASH", "--mamba-track-interval", "128"], logs / "cand.log")
    ref = Server(["--speculative-algorithm", "NONE", "--disable-radix-cache"], logs / "ref.log")
    yield cand.url, ref.url
    cand.stop()
    ref.stop()


@contextlib.contextmanager
def server_processes(command: list[str], argvs, what: str = "servers"):
    """`command + argv + --port P` as subprocesses on free ports, one per argv; yields their URLs once each
    answers /health on a port it holds (one whose port another process took first starts again on another)."""
    import subprocess
    import time

    from harness.ports import free_port, holds_port
    from harness.replica import http_ok

    def start(argv) -> tuple[subprocess.Popen, int]:
        port = free_port("127.0.0.1")
        return subprocess.Popen([*command, *argv, "--port", str(port)], cwd=REPO), port

    argvs, procs, ports = list(argvs), [], []
    try:
        for argv in argvs:
            proc, port = start(argv)
            procs.append(proc)
            ports.append(port)
        deadline = time.monotonic() + 30
        while True:
            up = [http_ok(f"http://127.0.0.1:{port}/health") for port in ports]
            for i, proc in enumerate(procs):
                if up[i] and holds_port(proc.pid, ports[i]) is False:  # another server answers on its port
                    proc.kill()
                    proc.wait()
                    procs[i], ports[i] = start(argvs[i])
                    up[i] = False
            if all(up):
                break
            assert time.monotonic() < deadline, f"{what} did not start"
            time.sleep(0.05)
        yield [f"http://127.0.0.1:{port}" for port in ports]
    finally:
        for p in procs:
            p.terminate()
            p.wait()


def frozen_subset(path: Path, session_ids) -> str:
    """Write the committed frozen suite's sessions `session_ids` (all must exist) to `path`; its path."""
    from workloads.corpus import DATA_DIR

    lines = [ln for ln in (DATA_DIR / "frozen.jsonl").read_text().splitlines()
             if json.loads(ln)["session_id"] in session_ids]
    assert len(lines) == len(session_ids)
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def read_lines(run_dir: Path) -> list[dict]:
    """Every stored record of a run directory, in parts or journals (duplicates kept, to be counted)."""
    from records.reader import raw_records

    return raw_records(run_dir)


def journal_lines(run_dir: Path, stem: str) -> list[str]:
    """The JSON lines of one pool's records (`candidate-i16`, `reference`), in order, wherever they are stored."""
    from records.reader import RunReader

    return [json.dumps(r) for r in RunReader(run_dir).records(stem)]


def duplicate_keys(records: list[dict]) -> list[str]:
    return [k for k, n in Counter(r["key"] for r in records).items() if n > 1]


def expected_candidate_keys(sessions: list[Session], intervals: tuple[int, ...], concurrency: tuple[int, ...]
                            ) -> set[str]:
    return {f"i{i}-c{c}/{s.session_id}/{t}" for i in intervals for c in concurrency for s in sessions
            if s.interval in (None, i) for t in range(len(s.turns))}


def run_args(tmp: Path, sessions, *extra: str, intervals: str = "16,32", replicas: int = 2,
             token_delay: float = 0.0) -> list[str]:
    workload = write_workload(tmp / "tiny.jsonl", sessions)
    server = (f"{sys.executable} -m tests.harness.fake_server --rid-log {tmp}/rids.log --pid-dir {tmp}/pids "
              f"--token-delay {token_delay}")
    return ["--suite", str(workload), "--intervals", intervals, "--block-size", "4", "--concurrency", "1,2",
            "--replicas", str(replicas), "--runs-dir", str(tmp / "runs"), "--server-command", server,
            "--no-progress", "--startup-timeout", "60", "--request-timeout", "30", *extra]


def check_complete(run_dir: Path, sessions, intervals=(16, 32)) -> list[dict]:
    """Every session turn answered exactly once per sweep point; one reference per distinct input."""
    recs = read_lines(run_dir)
    assert not duplicate_keys(recs)
    cands = [r for r in recs if r["role"] == "candidate"]
    refs = [r for r in recs if r["role"] == "reference"]
    assert {r["key"] for r in cands} == expected_candidate_keys(sessions, intervals, (1, 2))
    assert all(r["error"] is None for r in cands + refs)
    assert sorted(r["input_hash"] for r in refs) == sorted({r["input_hash"] for r in cands})
    return cands
