"""vLLM as a target engine: its interpreter, its environment, its flags (the engine profile of `--engine vllm`).

vLLM lives in its own virtual environment (`make vllm` builds `.venv-vllm`; the
workarounds are in shared/reference/vllm-cpu.md): its torch/transformers pins
are not the project's. specgate never imports vLLM; it starts
`<vllm python> -m vllm.entrypoints.openai.api_server` in the Ray replica actors
and speaks to it through the OpenAI backend.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

VLLM_PYTHON_ENV = "SPECGATE_VLLM_PYTHON"  # an interpreter to use when --vllm-python is not given
CONVENTIONAL = (".venv-vllm/bin/python",)  # relative to the working directory / the repository
ENTRYPOINT = ("-m", "vllm.entrypoints.openai.api_server")  # the `vllm` console script fails with vllm-cpu


class VLLMNotFound(RuntimeError):
    """No interpreter with vLLM; the message says how to get one."""


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def find_python(explicit: str | None = None, environ=os.environ) -> str:
    """The interpreter of the vLLM environment: `explicit` (--vllm-python), else $SPECGATE_VLLM_PYTHON, else
    `.venv-vllm/bin/python` in the working directory or the repository. VLLMNotFound says what to do."""
    candidates = [explicit] if explicit else []
    if not explicit and environ.get(VLLM_PYTHON_ENV):
        candidates.append(environ[VLLM_PYTHON_ENV])
    if not candidates:
        for base in (Path.cwd(), repo_root()):
            candidates += [str(base / c) for c in CONVENTIONAL]
    for c in candidates:
        path = shutil.which(c) if os.sep not in c else c
        if path and os.access(path, os.X_OK) and Path(path).is_file():
            return os.path.abspath(path) if os.sep in c else path
    where = explicit or environ.get(VLLM_PYTHON_ENV) or " or ".join(candidates)
    raise VLLMNotFound(f"no vLLM interpreter at {where}: build one with `make vllm` (creates .venv-vllm, about "
                       "3 minutes and 3.5 GB), or pass --vllm-python /path/to/venv/bin/python")


def server_env(cache_dir: str, api_key: str | None, host: str) -> dict[str, str]:
    """Environment of one vLLM server (besides the inherited one): its own cache dir, no telemetry, nothing
    downloaded, internal messaging on the replica's address, the API key (vLLM reads VLLM_API_KEY)."""
    env = {"VLLM_HOST_IP": host, "VLLM_CACHE_ROOT": cache_dir, "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_HOME": os.path.join(cache_dir, "hf"), "VLLM_SERVER_DEV_MODE": "1", "OMP_NUM_THREADS": "1"}
    if api_key:
        env["VLLM_API_KEY"] = api_key
    return env
