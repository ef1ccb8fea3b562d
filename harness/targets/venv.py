"""Where a third-party engine's own virtual environment is: `--<engine>-python`, its environment variable, the
venv its `make` target builds.

An engine such as vLLM lives in a venv of its own (its torch / transformers pins
are not the project's); specgate never imports it, it starts
`<that python> -m <its server module>` in the Ray replica actors.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from harness.errors import HarnessError


class InterpreterNotFound(HarnessError):
    """No interpreter with the engine installed; the message says how to get one."""


@dataclass(frozen=True)
class Venv:
    """How to find one engine's interpreter."""

    engine: str  # as messages name it: "vLLM"
    flag: str  # the harness flag that gives it: "--vllm-python"
    env_var: str  # the environment variable used when the flag is not given
    conventional: tuple[str, ...]  # paths tried relative to the working directory, then to the repository
    build: str  # how to build it, for the message: "`make vllm` (creates .venv-vllm, ...)"


def repo_root() -> Path:
    """The repository this harness runs from."""
    return Path(__file__).resolve().parents[2]


def find_python(venv: Venv, explicit: str | None = None, environ=os.environ) -> str:
    """The engine's interpreter: `explicit` (the flag), else $<env_var>, else a conventional path in the working
    directory or the repository. InterpreterNotFound says what to do."""
    candidates = [explicit] if explicit else []
    if not explicit and environ.get(venv.env_var):
        candidates.append(environ[venv.env_var])
    if not candidates:
        for base in (Path.cwd(), repo_root()):
            candidates += [str(base / c) for c in venv.conventional]
    for c in candidates:
        path = shutil.which(c) if os.sep not in c else c
        if path and os.access(path, os.X_OK) and Path(path).is_file():
            return os.path.abspath(path) if os.sep in c else path
    where = explicit or environ.get(venv.env_var) or " or ".join(candidates)
    raise InterpreterNotFound(f"no {venv.engine} interpreter at {where}: build one with {venv.build}, or pass "
                              f"{venv.flag} /path/to/venv/bin/python")


def isolated(env: dict) -> dict:
    """A server environment that never sees this project's packages (its venv has its own)."""
    env.pop("PYTHONPATH", None)
    return env
