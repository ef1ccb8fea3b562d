"""What a `--resume` takes from the run directory, and what it never does.

`RUN_DIR/config.json` is a file anyone with write access to the directory could have edited, so nothing in it
chooses what runs: the settings of `CHOOSES_WHAT_RUNS` (a program, an interpreter, a model or tokenizer path,
server flags, the engine kind) come from the command line, and a stored value that differs from it is refused
with both values named, unless `--trust-run-config` (then the stored ones are used, and shown first:
`trusted_lines`). The Ray address is the command line's alone (a resume may join another cluster). The settings
of `RESUME_FIXED` define the workload or the pools: taken from the run when not given, refused when given with
another value. Everything else (timeouts, retries, gate thresholds, progress, ...) may change.
"""

from __future__ import annotations

import shlex
from dataclasses import fields
from pathlib import Path

from harness.config import ConfigError, RunConfig, flag, kind_of

# Settings that choose a program to run or what it loads: never from a run directory unless --trust-run-config.
CHOOSES_WHAT_RUNS = ("engine", "vllm_python", "sglang_python", "server_command", "model_path", "tokenizer",
                     "candidate_args")
# Settings that define the workload or the pools; a resume must not change them.
RESUME_FIXED = ("suite", "num_requests", "seed", "intervals", "concurrency", "block_size", "model_preset",
                "inject_fault", "page_size", "tp_size", "backend", "diagnose", "cover", "calibrate", "dtype",
                "request_rate", "arrival", "warmup", "duration", "endpoint", "reference_endpoint", "baseline_run",
                "no_restore_window", *CHOOSES_WHAT_RUNS)
ADDRESS = "address"  # the Ray cluster: the command line's, unless --trust-run-config


def _shown(name: str, value: object) -> str:
    """A setting's value as its flag would take it."""
    if kind_of(name) in ("cmd", "args") and value is not None:
        return repr(shlex.join(value))
    return repr(list(value) if isinstance(value, tuple) else value)


def _saved_settings(saved: dict, run_dir: Path) -> dict:
    """The stored run config's known settings, lists as tuples; a stored command that is not strings is refused."""
    known = {f.name for f in fields(RunConfig)}
    base = {k: v for k, v in saved.items() if k in known}
    for k, v in base.items():
        if v is not None and kind_of(k) in ("ints", "floats", "strs", "cmd", "args"):
            if not isinstance(v, (list, tuple)) or (kind_of(k) in ("cmd", "args", "strs")
                                                    and not all(isinstance(x, str) for x in v)):
                raise ConfigError(f"{run_dir}/config.json: {k} must be a list of strings, got {v!r}")
            base[k] = tuple(v)
    return base


def for_resume(saved: dict, given: RunConfig, explicit: set[str], run_dir: Path) -> RunConfig:
    """The config of a resumed run: the saved one, with only runtime settings taken from `given`.

    Raises ConfigError naming the flag and both values when a stored setting that chooses what runs differs
    from the command line's (unless `given.trust_run_config`), or when a setting that defines the workload or
    the pools is given with another value than the run's.
    """
    base = _saved_settings(saved, run_dir)
    if not given.trust_run_config:
        base[ADDRESS] = given.address
        for k in CHOOSES_WHAT_RUNS:
            stored, now = base.get(k, getattr(given, k)), getattr(given, k)
            if stored != now and k not in explicit:
                raise ConfigError(
                    f"--resume {run_dir}: the run used {flag(k)} {_shown(k, stored)}, this command line gives "
                    f"{_shown(k, now)}; a resume never runs a command stored in a run directory, nor takes a "
                    f"program, interpreter, model, tokenizer, server flags or engine from it: give {flag(k)} "
                    "again, or --trust-run-config to use the stored value")
    for k in sorted(explicit - {"resume"}):
        if k in RESUME_FIXED and getattr(given, k) != base.get(k, getattr(given, k)):
            raise ConfigError(f"{flag(k)} cannot change on --resume (the run used {_shown(k, base.get(k))}; this "
                              f"command line gives {_shown(k, getattr(given, k))}): start a new run")
    known = {f.name for f in fields(RunConfig)}
    overrides = {k: getattr(given, k) for k in explicit if k in known and k not in RESUME_FIXED}
    if base.get("api_key") == "***":
        base["api_key"] = None
    base.update(overrides)
    base.update(run_id=run_dir.name, runs_dir=str(run_dir.parent), resume=str(run_dir), dry_run=given.dry_run,
                trust_run_config=given.trust_run_config)
    try:
        return RunConfig(**base)
    except TypeError as e:
        raise ConfigError(f"{run_dir}/config.json: unusable run config ({e})") from None


def trusted_lines(cfg: RunConfig, config_path: Path) -> list[str]:
    """What a `--trust-run-config` resume takes from `config_path` that chooses what runs: one line each, to print
    before anything runs."""
    lines = []
    if cfg.server_command:
        lines.append(f"--trust-run-config: running the server command stored in {config_path}: "
                     f"{shlex.join(cfg.server_command)}")
    for k in (*CHOOSES_WHAT_RUNS, ADDRESS):
        value = getattr(cfg, k)
        if k != "server_command" and value not in (None, ()):
            lines.append(f"--trust-run-config: {flag(k)} {_shown(k, value)} (from {config_path})")
    return lines
