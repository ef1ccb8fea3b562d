"""Checks of the target settings of a RunConfig: --engine, --backend, --tokenizer (harness/config.py calls them)."""

from __future__ import annotations

from pathlib import Path

ENGINES = ("builtin", "vllm")  # what the Ray replicas run


def validate_target(c, need) -> None:
    """--engine, --backend and --tokenizer, and --engine vllm's own settings; `need(ok, message)` raises the
    ConfigError."""
    from harness.backends import BACKENDS

    need(c.backend in BACKENDS, f"--backend must be one of {', '.join(BACKENDS)}, got {c.backend!r}")
    need(c.engine in ENGINES, f"--engine must be one of {', '.join(ENGINES)}, got {c.engine!r}")
    need(c.backend == "sglang" or c.external or c.engine == "vllm",
         f"--backend {c.backend} drives already-running servers: give "
         "--endpoint and --reference-endpoint (built-in replicas speak sglang)")
    path = c.tokenizer
    need(path is None or bool(path) and (not path.startswith((".", "/", "~")) and not path.endswith(".json")
                                         or Path(path).expanduser().exists()),
         f"--tokenizer {path}: no such file or directory (give a tokenizer.json or a local model directory)")
    if c.engine == "vllm":
        from harness.vllm.profile import validate_run

        validate_run(c, need)
    else:
        need(not c.calibrate, "--calibrate needs --engine vllm (the built-in engine's tolerance is measured)")
