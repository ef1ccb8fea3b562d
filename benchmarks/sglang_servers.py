"""SGLang servers as local processes: start several together, wait for /health, stop their process groups.

Used by benchmarks/sglang_37817.py and by the real-SGLang tests (tests/sglang_setup/server.py). A server runs
as shared/reference/sglang-cpu.md says (CPU engine, torch-native attention, no CUDA graphs, offline, a HOME of
its own) on a free 127.0.0.1 port, in a process group of its own so that it and its scheduler and detokenizer
children all stop. `launcher` is what follows the interpreter: SGLang's own `-m sglang.launch_server`, or a
script such as tests/sglang_setup/hybrid/serve.py (the CPU setup of the #37817 path), named by path.

`validation_servers` are the servers of the #37818 validation (benchmarks/sglang_37817.py and its CI test): a
cold reference, and per variant and track interval a DFLASH + extra_buffer candidate; the variants are one
release without and with the fix (SPECGATE_SGLANG_FIXES), each candidate logging its verify steps.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from harness.ports import holds_port

STARTUP_TIMEOUT = 900.0  # seconds to /health 200: ~3.5 min on a loaded 2-core machine
# On CPU SGLang sizes its KV pool from the machine's free memory: budget = free-after-load minus
# (1 - fraction) x free-before-load, so whatever else starts meanwhile (the other test server, pytest
# workers) is charged against it. 0.05 failed in CI ("Loaded weights leave no GPU memory for the KV cache",
# minimum 0.0542 on an 18.8 GB machine); a generous fraction with a small token cap keeps the pool tiny
# (2 layers x 2 x 128 x 4 bytes per token: 32768 tokens = 64 MiB) and the start robust to neighbours.
# --sleep-on-idle: an idle scheduler otherwise polls its sockets without pause, about a third of a core each
# (measured with three servers up), which the other servers and tests sharing the machine then lack.
SERVER_FLAGS = ("--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph",
                "--mem-fraction-static", "0.3", "--max-total-tokens", "32768", "--sleep-on-idle")
LAUNCH_SERVER = ("-m", "sglang.launch_server")
SERVE = Path(__file__).resolve().parents[1] / "tests" / "sglang_setup" / "hybrid" / "serve.py"
FIXES = {"unpatched": "", "patched": "pr37818"}  # SPECGATE_SGLANG_FIXES per variant of the validation
COMMON = ("--dtype", "float32", "--random-seed", "0")
REFERENCE_FLAGS = (*COMMON, "--disable-radix-cache")


def candidate_flags(interval: int, drafter: Path, block_size: int) -> tuple[str, ...]:
    """A candidate: DFLASH with the drafter, radix cache with extra_buffer checkpoints every `interval` tokens."""
    return (*COMMON, "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(drafter),
            "--speculative-dflash-block-size", str(block_size), "--mamba-radix-cache-strategy", "extra_buffer",
            "--mamba-track-interval", str(interval))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env(home: Path, extra: dict | None = None) -> dict:
    """The server's environment: SGLang's CPU engine, offline, its own HOME, without this project's path; then
    `extra` (e.g. SPECGATE_SGLANG_FIXES for the hybrid setup)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    home.mkdir(parents=True, exist_ok=True)
    return {**env, "SGLANG_USE_CPU_ENGINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "OMP_NUM_THREADS": "2", "HOME": str(home), "PYTHONUNBUFFERED": "1", **(extra or {})}


class SGLangServer:
    """One SGLang server process: `url`, `log` (its output), `argv`; `start`, `wait`, `stop`. `extra` are its
    flags after the model's and SERVER_FLAGS; `launcher` what runs it; `env` added to its environment."""

    def __init__(self, python: str, model: Path, workdir: Path, *extra: str, launcher: tuple = LAUNCH_SERVER,
                 env: dict | None = None, name: str = "sglang") -> None:
        self.python, self.model, self.workdir, self.extra = python, model, workdir, extra
        self.launcher, self.env, self.name = tuple(str(a) for a in launcher), dict(env or {}), name
        self.proc: subprocess.Popen | None = None
        self.startup_seconds: float | None = None
        self._on_port(free_port())

    def _on_port(self, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = self.workdir / f"{self.name}-{self.port}.log"
        self.home = self.workdir / f"home-{self.port}"
        self.argv = [self.python, *self.launcher, "--host", "127.0.0.1", "--port", str(self.port),
                     "--model-path", str(self.model), *SERVER_FLAGS, *self.extra]

    def start(self) -> None:
        """Launch the process (returns at once; `wait` waits for /health)."""
        self._t0 = time.monotonic()
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=server_env(self.home, self.env), cwd=self.home.parent,
                                         start_new_session=True)

    def healthy(self) -> bool:
        """True when GET /health answers 200."""
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=5) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError, http.client.HTTPException):
            return False  # HTTPException: not HTTP on the port (another process took it before SGLang bound it)

    def log_tail(self, lines: int = 40) -> str:
        """The last `lines` lines of the server's output."""
        text = self.log.read_text(errors="replace") if self.log.exists() else "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def serving(self) -> bool | None:
        """True once this server answers /health on its port; None while another process holds the port and
        answers (started beside it and handed the same port: harness/ports.py); False before."""
        if not self.healthy():
            return False
        return None if holds_port(self.proc.pid, self.port) is False else True

    def wait(self, timeout: float = STARTUP_TIMEOUT, attempts: int = 3) -> None:
        """Until /health answers 200 from this server; RuntimeError with the log tail if the server exits or takes
        too long. A port taken between free_port() and SGLang's bind (by the other server's internal ports, or
        by another server, say) is retried on another port, `attempts` times in all."""
        deadline = self._t0 + timeout
        while not (serving := self.serving()):
            taken = serving is None
            if taken or self.proc.poll() is not None:
                if attempts > 1 and (taken or "address already in use" in self.log_tail(200).lower()):
                    with contextlib.suppress(ProcessLookupError):  # its scheduler and detokenizer children
                        os.killpg(self.proc.pid, signal.SIGKILL)
                    self._on_port(free_port())
                    self.start()
                    return self.wait(timeout, attempts - 1)
                if taken:
                    raise RuntimeError(f"another process answers on port {self.port}, not this server "
                                       f"({' '.join(self.argv)})")
                raise RuntimeError(f"SGLang exited with {self.proc.returncode} before it was healthy "
                                   f"({' '.join(self.argv)}); the last lines of {self.log}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"SGLang was not healthy after {timeout:.0f}s at {self.url} "
                                   f"({' '.join(self.argv)}); the last lines of {self.log}:\n{self.log_tail()}")
            time.sleep(2)
        self.startup_seconds = round(time.monotonic() - self._t0, 1)
        return None

    def stop(self) -> None:
        """SIGTERM to the whole process group, SIGKILL after 30 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):  # children that outlived their parent
            os.killpg(self.proc.pid, signal.SIGKILL)


@contextlib.contextmanager
def sglang_servers(python: str, model: Path, workdir: Path, *flag_sets: tuple[str, ...]):
    """One server per flag set, started together (their start-ups overlap) and all stopped at the end."""
    with started([SGLangServer(python, model, workdir, *flags) for flags in flag_sets]) as servers:
        yield servers


@contextlib.contextmanager
def started(servers: list[SGLangServer]):
    """Start `servers` together, wait for each to be healthy, yield them; stop them all at the end."""
    try:
        for server in servers:
            server.start()
        for server in servers:
            server.wait()
        yield servers
    finally:
        for server in servers:
            server.stop()


def validation_servers(python: str, target: Path, drafter: Path, intervals: list[int], block_size: int,
                       workdir: Path) -> tuple[SGLangServer, dict[str, list[SGLangServer]]]:
    """The #37818 validation's servers, not started: the cold reference, and per variant a candidate per interval
    (through the CPU setup's serve.py, with its verify trace on)."""
    workdir.mkdir(parents=True, exist_ok=True)
    ref = SGLangServer(python, target, workdir, *REFERENCE_FLAGS, launcher=(SERVE,), name="reference")
    cands = {v: [SGLangServer(python, target, workdir, *candidate_flags(i, drafter, block_size), launcher=(SERVE,),
                              env={"SPECGATE_SGLANG_FIXES": fix, "SPECGATE_HYBRID_TRACE": "1"}, name=f"{v}-i{i}")
                 for i in intervals] for v, fix in FIXES.items()}
    return ref, cands


def servers_json(ref: SGLangServer, cands: dict[str, list[SGLangServer]]) -> dict:
    """What benchmarks/sglang_37817.py --servers reads: the reference URL, each variant's URLs and logs."""
    return {"reference": ref.url, **{v: [{"url": s.url, "log": str(s.log)} for s in group]
                                     for v, group in cands.items()}}
