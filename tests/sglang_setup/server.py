"""A real SGLang server for tests: its venv (`make sglang`), a tiny Llama built here, and the server process.

Tests that need SGLang skip with a reason when `.venv-sglang` is missing, and fail instead when
SPECGATE_REQUIRE_SGLANG=1 (CI builds it first). The server processes are benchmarks/sglang_servers.py's
(re-exported here): CPU engine, torch-native attention, no CUDA graphs, offline, a HOME of their own, a free
127.0.0.1 port, a process group each.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.sglang_servers import SERVER_FLAGS, SGLangServer, free_port, server_env, sglang_servers, started

__all__ = ["SERVER_FLAGS", "SGLangServer", "build_llama", "free_port", "server_env", "sglang_python",
           "sglang_servers", "shared_llama", "started"]
ROOT = Path(__file__).resolve().parents[2]
SGLANG_PYTHON = ROOT / ".venv-sglang" / "bin" / "python"


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


