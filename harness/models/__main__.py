"""`python -m harness.models build DIR --arch ARCH`: build a tiny model for a real engine (see __init__)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from harness.models import ARCHS, MODEL_CARD, SGLANG_ARGS
from harness.targets.sglang import VENV as SGLANG_VENV
from harness.targets.venv import InterpreterNotFound, find_python, repo_root
from harness.targets.vllm import VENV as VLLM_VENV

HELDOUT = repo_root() / "workloads" / "data" / "heldout.txt"


def build(out: Path, arch: str, python: str, seed: int = 0, vocab: int = 2048, lm_head_scale: float = 16.0,
          timeout: float = 600.0) -> dict:
    """Build the model into `out` (under the interpreter `python`, which has transformers); the model card."""
    out.mkdir(parents=True, exist_ok=True)
    spec = {"dir": str(out.resolve()), "text": str(HELDOUT), "arch": arch, "vocab": vocab, "seed": seed,
            "lm_head_scale": lm_head_scale, "prompt_len": 48, "prompts": 3, "new_tokens": 24}
    spec_path = out / "build_spec.json"
    spec_path.write_text(json.dumps(spec, indent=1) + "\n")
    t0 = time.monotonic()
    proc = subprocess.run([python, str(Path(__file__).with_name("hf_build.py")), str(spec_path)],
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                          env={**_clean_env(), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    if proc.returncode != 0:
        raise RuntimeError(f"building {arch} failed (exit {proc.returncode}) under {python}:\n"
                           + "\n".join(proc.stderr.splitlines()[-20:]))
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    card = {**spec, **result, "seconds": round(time.monotonic() - t0, 1), "vllm_args": list(ARCHS[arch]),
            "sglang_args": list(SGLANG_ARGS[arch]), "built_with": python}
    (out / MODEL_CARD).write_text(json.dumps(card, indent=1) + "\n")
    spec_path.unlink()
    return card


def _clean_env() -> dict:
    import os

    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the vLLM venv must not see this project's packages
    return env


def interpreter(explicit: str | None) -> str:
    """The interpreter that builds: `explicit` (--python / --vllm-python), else vLLM's venv, else SGLang's (either
    has transformers); InterpreterNotFound naming both builds and the flag."""
    if explicit:
        return find_python(VLLM_VENV, explicit)
    try:
        return find_python(VLLM_VENV)
    except InterpreterNotFound:
        pass
    try:
        return find_python(SGLANG_VENV)
    except InterpreterNotFound:
        raise InterpreterNotFound("no interpreter with transformers: build one with `make vllm` (.venv-vllm) or "
                                  "`make sglang` (.venv-sglang), or pass --python /path/to/venv/bin/python") from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.models", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build a tiny model into DIR (under a minute, nothing downloaded)")
    b.add_argument("dir", metavar="DIR")
    b.add_argument("--arch", required=True, choices=sorted(ARCHS))
    b.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    b.add_argument("--vocab", type=int, default=2048, help="BPE vocabulary size (default 2048)")
    b.add_argument("--python", "--vllm-python", dest="python",
                   help="interpreter with transformers (default: .venv-vllm/bin/python from `make vllm`, else "
                   ".venv-sglang/bin/python from `make sglang`)")
    a = p.parse_args(argv)
    if a.vocab < 300:
        p.error(f"--vocab {a.vocab}: needs >= 300 (256 bytes + merges)")
    try:
        python = interpreter(a.python)
        print(f"building {a.arch} into {a.dir} with {python} ...", flush=True)
        card = build(Path(a.dir), a.arch, python, a.seed, a.vocab)
    except (InterpreterNotFound, RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"harness.models: error: {e}", file=sys.stderr)
        return 2
    print(f"built {card['arch']} ({card['params']:,} parameters) in {card['seconds']}s: {a.dir}; its card "
          f"{MODEL_CARD} gives the flags --engine vllm adds ({' '.join(card['vllm_args'])}) and those --engine "
          f"sglang adds ({' '.join(card['sglang_args'])})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
