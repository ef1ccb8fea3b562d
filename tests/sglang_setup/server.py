"""A real SGLang server for tests: its venv (`make sglang`), a tiny Llama built here, and the server process.

Tests that need SGLang skip with a reason when `.venv-sglang` is missing, and fail instead when
SPECGATE_REQUIRE_SGLANG=1 (CI builds it first). The server runs as shared/reference/sglang-cpu.md says
(CPU engine, torch-native attention, no CUDA graphs, offline, a HOME of its own) on a free 127.0.0.1
port, in a process group of its own so that it and its scheduler and detokenizer children all stop.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SGLANG_PYTHON = ROOT / ".venv-sglang" / "bin" / "python"
STARTUP_TIMEOUT = 900.0  # seconds to /health 200: ~3.5 min on a loaded 2-core machine
# On CPU SGLang sizes its KV pool from the machine's free memory: budget = free-after-load minus
# (1 - fraction) x free-before-load, so whatever else starts meanwhile (the other test server, pytest
# workers) is charged against it. 0.05 failed in CI ("Loaded weights leave no GPU memory for the KV cache",
# minimum 0.0542 on an 18.8 GB machine); a generous fraction with a small token cap keeps the pool tiny
# (2 layers x 2 x 128 x 4 bytes per token: 32768 tokens = 64 MiB) and the start robust to neighbours.
SERVER_FLAGS = ("--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph",
                "--mem-fraction-static", "0.3", "--max-total-tokens", "32768")


def sglang_python() -> str:
    """The interpreter of SGLang's venv; skips the calling test without it, or fails it under
    SPECGATE_REQUIRE_SGLANG=1."""
    if not SGLANG_PYTHON.exists():
        if os.environ.get("SPECGATE_REQUIRE_SGLANG") == "1":
            pytest.fail(f"SPECGATE_REQUIRE_SGLANG=1 but {SGLANG_PYTHON} is missing: `make sglang` failed or was "
                        "not run")
        pytest.skip("no .venv-sglang (run `make sglang` to build SGLang's CPU venv; CI does)")
    return str(SGLANG_PYTHON)


def build_llama(python: str, out: Path) -> dict:
    """`python -m harness.models build OUT --arch llama` with SGLang's interpreter (it has transformers); the
    model card."""
    proc = subprocess.run([sys.executable, "-m", "harness.models", "build", str(out), "--arch", "llama",
                           "--python", python], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads((out / "specgate_model.json").read_text())


_BUILT: dict[str, Path] = {}  # interpreter -> the Llama built with it in this test session


def shared_llama(python: str, tmp_path_factory) -> Path:
    """The tiny Llama, built once per test session with `python` (tests only read it, so the SGLang gate and the
    contract test share one build); asserts it is the Llama with SGLang's flags in its card."""
    if python not in _BUILT:
        out = tmp_path_factory.getbasetemp() / "sglang-llama"
        card = build_llama(python, out)
        assert card["architectures"] == ["LlamaForCausalLM"] and card["sglang_args"] == ["--dtype", "float32"]
        _BUILT[python] = out
    return _BUILT[python]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env(home: Path) -> dict:
    """The server's environment: SGLang's CPU engine, offline, its own HOME, without this project's path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    home.mkdir(parents=True, exist_ok=True)
    return {**env, "SGLANG_USE_CPU_ENGINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "OMP_NUM_THREADS": "2", "HOME": str(home), "PYTHONUNBUFFERED": "1"}


class SGLangServer:
    """One `python -m sglang.launch_server` process: `url`, `log` (its output), `argv`; `start`, `wait`,
    `stop`."""

    def __init__(self, python: str, model: Path, workdir: Path, *extra: str) -> None:
        self.python, self.model, self.workdir, self.extra = python, model, workdir, extra
        self.proc: subprocess.Popen | None = None
        self.startup_seconds: float | None = None
        self._on_port(free_port())

    def _on_port(self, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = self.workdir / f"sglang-{self.port}.log"
        self.home = self.workdir / f"home-{self.port}"
        self.argv = [self.python, "-m", "sglang.launch_server", "--host", "127.0.0.1", "--port", str(self.port),
                     "--model-path", str(self.model), *SERVER_FLAGS, *self.extra]

    def start(self) -> None:
        """Launch the process (returns at once; `wait` waits for /health)."""
        self._t0 = time.monotonic()
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=server_env(self.home), cwd=self.home.parent, start_new_session=True)

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

    def wait(self, timeout: float = STARTUP_TIMEOUT, attempts: int = 3) -> None:
        """Until /health answers 200; RuntimeError with the log tail if the server exits or takes too long. A port
        taken between free_port() and SGLang's bind (by the other server's internal ports, say) is retried on
        another port, `attempts` times in all."""
        deadline = self._t0 + timeout
        while not self.healthy():
            if self.proc.poll() is not None:
                if attempts > 1 and "address already in use" in self.log_tail(200).lower():
                    with contextlib.suppress(ProcessLookupError):  # its scheduler and detokenizer children
                        os.killpg(self.proc.pid, signal.SIGKILL)
                    self._on_port(free_port())
                    self.start()
                    return self.wait(timeout, attempts - 1)
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
    servers = [SGLangServer(python, model, workdir, *flags) for flags in flag_sets]
    try:
        for server in servers:
            server.start()
        for server in servers:
            server.wait()
        yield servers
    finally:
        for server in servers:
            server.stop()
