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
from pathlib import Path

from harness.config import ConfigError, RunConfig
from harness.settings import default_of, flag
from harness.targets import RESUME_ONLY, all_settings, run_config

ADDRESS = "address"  # the Ray cluster: the command line's, unless --trust-run-config


def _role(name: str) -> str:
    return all_settings()[name].metadata["resume"]


def chooses_what_runs() -> tuple[str, ...]:
    """Settings that choose a program to run or what it loads: never from a run directory unless
    --trust-run-config (each setting declares it: resume="runs")."""
    return tuple(n for n in all_settings() if _role(n) == "runs")


def resume_fixed() -> tuple[str, ...]:
    """Settings that define the workload or the pools (resume="fixed"), and those that choose what runs: a resume
    must not change them."""
    return tuple(n for n in all_settings() if _role(n) in ("fixed", "runs"))


def _kind(name: str) -> str:
    return all_settings()[name].metadata["kind"]


def _shown(name: str, value: object) -> str:
    """A setting's value as its flag would take it."""
    if _kind(name) in ("cmd", "args") and value is not None:
        return repr(shlex.join(value))
    return repr(list(value) if isinstance(value, tuple) else value)


def _saved_settings(saved: dict, run_dir: Path) -> dict:
    """The stored run config's known settings (and its target's kind), lists as tuples; a stored command that is
    not strings is refused."""
    known = all_settings()
    base = {k: v for k, v in saved.items() if k in known}
    for k, v in base.items():
        if v is not None and _kind(k) in ("ints", "floats", "strs", "cmd", "args"):
            if not isinstance(v, (list, tuple)) or (_kind(k) in ("cmd", "args", "strs")
                                                    and not all(isinstance(x, str) for x in v)):
                raise ConfigError(f"{run_dir}/config.json: {k} must be a list of strings, got {v!r}")
            base[k] = tuple(v)
    if isinstance(saved.get(RESUME_ONLY), str):
        base[RESUME_ONLY] = saved[RESUME_ONLY]
    return base


def _value(settings: dict, name: str) -> object:
    """A setting's value in flat settings, its default where they do not hold it (another target's setting: a run
    keeps its own target's settings only, so one it does not hold was at its default)."""
    return settings[name] if name in settings else default_of(all_settings()[name])


def for_resume(saved: dict, given: RunConfig, explicit: set[str], run_dir: Path) -> RunConfig:
    """The config of a resumed run: the saved one, with only runtime settings taken from `given`.

    Raises ConfigError naming the flag and both values when a stored setting that chooses what runs differs
    from the command line's (unless `given.trust_run_config`), or when a setting that defines the workload or
    the pools is given with another value than the run's.
    """
    base = _saved_settings(saved, run_dir)
    now = {**given.settings(), "engine": given.engine or _value({}, "engine")}
    if not given.trust_run_config:
        base[ADDRESS] = given.address
        for k in chooses_what_runs():
            stored = _value(base, k)
            if stored != _value(now, k) and k not in explicit:
                raise ConfigError(
                    f"--resume {run_dir}: the run used {flag(k)} {_shown(k, stored)}, this command line gives "
                    f"{_shown(k, _value(now, k))}; a resume never runs a command stored in a run directory, nor "
                    f"takes a program, interpreter, model, tokenizer, server flags or engine from it: give "
                    f"{flag(k)} again, or --trust-run-config to use the stored value")
    fixed = resume_fixed()
    for k in sorted(explicit - {"resume"}):
        if k in fixed and _value(now, k) != _value(base, k):
            raise ConfigError(f"{flag(k)} cannot change on --resume (the run used {_shown(k, _value(base, k))}; this "
                              f"command line gives {_shown(k, _value(now, k))}): start a new run")
    overrides = {k: _value(now, k) for k in explicit if k in all_settings() and k not in fixed}
    if base.get("api_key") == "***":
        base["api_key"] = None
    base.update(overrides)
    base.update(run_id=run_dir.name, runs_dir=str(run_dir.parent), resume=str(run_dir), dry_run=given.dry_run,
                trust_run_config=given.trust_run_config)
    try:
        return run_config(base)
    except ConfigError as e:
        raise ConfigError(f"{run_dir}/config.json: unusable run config ({e})") from None


def trusted_lines(cfg: RunConfig, config_path: Path) -> list[str]:
    """What a `--trust-run-config` resume takes from `config_path` that chooses what runs: one line each, to print
    before anything runs."""
    lines = []
    settings = {**cfg.settings(), "engine": cfg.engine}
    command = settings.get("server_command")
    if command:
        lines.append(f"--trust-run-config: running the server command stored in {config_path}: "
                     f"{shlex.join(command)}")
    for k in (*chooses_what_runs(), ADDRESS):
        value = settings.get(k)
        if k != "server_command" and value not in (None, ()):
            lines.append(f"--trust-run-config: {flag(k)} {_shown(k, value)} (from {config_path})")
    return lines
