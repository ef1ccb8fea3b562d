"""A stand-in for vLLM's OpenAI server, started the way `--engine vllm` starts vLLM (tests only).

`make_interpreter(dir)` writes an executable `python` that runs this file, so a test
passes it as `--vllm-python`: the harness then runs
`<it> -m vllm.entrypoints.openai.api_server --model DIR ... --host H --port P`. The
vLLM flags are mapped onto tests/harness/vllm_stub.py (prefix caching, speculative
config -> spec counters in /metrics). A `fake_vllm.json` in the model directory with
`{"refuse": "why"}` makes a server started with a speculative config exit at start as vLLM refusing a flag
combination does; `{"crash_at": N}` makes it die at its N-th
completion with a traceback in its log, as a crashing engine core would (a file, not
an environment variable: Ray's workers do not see the test's environment). Each server
writes its vLLM environment variables to `$VLLM_CACHE_ROOT/fake_vllm_env.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def make_interpreter(directory: Path) -> str:
    """An executable `python` in `directory` that runs this fake (with the test's interpreter)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "python"
    path.write_text(f"#!/bin/sh\nexec {sys.executable} {Path(__file__).resolve()} \"$@\"\n")
    path.chmod(0o755)
    return str(path)


def stub_argv(argv: list[str]) -> tuple[list[str], bool, str]:
    """vllm_stub flags for vLLM's `argv` (after `-m vllm.entrypoints.openai.api_server`); whether it speculates;
    the model directory."""
    p = argparse.ArgumentParser()
    p.add_argument("--host")
    p.add_argument("--port")
    p.add_argument("--served-model-name", default="stub")
    p.add_argument("--enable-prefix-caching", dest="cache", action="store_true", default=True)
    p.add_argument("--no-enable-prefix-caching", dest="cache", action="store_false")
    p.add_argument("--speculative-config")
    p.add_argument("--model")
    known, _ = p.parse_known_args(argv)
    out = ["--host", known.host, "--port", known.port, "--model", known.served_model_name, "--block-size", "16",
           "--return-token-ids", "--tokens-as-ids", "--prompt-tokens-details", "--dev-mode"]
    if not known.cache:
        out.append("--no-prefix-caching")
    spec = json.loads(known.speculative_config) if known.speculative_config else None
    if spec:
        out += ["--num-spec-tokens", str(spec["num_speculative_tokens"])]
    return out, bool(spec), known.model


def main() -> None:
    argv = sys.argv[1:]
    if argv[:2] != ["-m", "vllm.entrypoints.openai.api_server"]:
        sys.exit(f"fake vLLM: expected -m vllm.entrypoints.openai.api_server, got {argv[:2]}")
    args, speculative, model = stub_argv(argv[2:])
    cache = Path(os.environ["VLLM_CACHE_ROOT"])
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "fake_vllm_env.json").write_text(json.dumps({k: v for k, v in os.environ.items()
                                                          if k.startswith(("VLLM_", "HF_", "PYTHONPATH"))}))
    behaviour = Path(model or ".") / "fake_vllm.json"
    wanted = json.loads(behaviour.read_text()) if behaviour.is_file() and speculative else {}
    crash_at = wanted.get("crash_at", 0)
    if wanted.get("refuse"):  # as vLLM refusing a flag combination at start
        sys.stderr.write(f"Traceback (most recent call last):\n  File \"arg_utils.py\", line 1\nValueError: "
                         f"{wanted['refuse']}\n")
        sys.exit(1)
    sys.path.insert(0, str(REPO))
    from tests.harness import vllm_stub

    if crash_at:
        served = {"n": 0}
        original = vllm_stub.Stub.completions

        async def completions(self, request):
            served["n"] += 1
            if served["n"] >= crash_at:
                sys.stderr.write("ERROR [core.py:1] EngineCore encountered a fatal error.\n"
                                 "Traceback (most recent call last):\n  File \"core.py\", line 1, in step\n"
                                 "RuntimeError: fake engine core died in the speculative verify step\n")
                sys.stderr.flush()
                os._exit(1)
            return await original(self, request)

        vllm_stub.Stub.completions = completions
    sys.argv = ["vllm_stub", *args]
    vllm_stub.main()


if __name__ == "__main__":
    main()
