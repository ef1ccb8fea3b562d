"""The `python -m harness.run` command line: flags and a TOML file into a RunConfig.

Precedence: built-in defaults < `--config run.toml` < `RAY_ADDRESS` (address only)
< explicit CLI flags. The flags are generated from the settings' declarations: the
run-wide ones (RunConfig), --engine, and every registered target's own.
"""

from __future__ import annotations

import argparse
import difflib
import re
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path

from harness.config import ConfigError, RunConfig
from harness.settings import declared, flag
from harness.targets import TARGETS, all_settings, engines, run_config


def _int(value):
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip().lstrip("+-").isdigit():
        raise TypeError("expected an integer")
    return int(value)


def _float(value):
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError("expected a number")
    try:
        return float(value)
    except ValueError:
        raise TypeError("expected a number") from None


def _str(value):
    if not isinstance(value, str):
        raise TypeError("expected a string")
    return value


def _bool(value):
    if not isinstance(value, bool):
        raise TypeError("expected true or false")
    return value


def _ints(value):
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise TypeError("expected a list of integers")
    try:
        return tuple(int(str(v).strip()) for v in items)
    except ValueError:
        raise ValueError("expected comma-separated integers") from None


def _floats(value):
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise TypeError("expected a list of numbers")
    try:
        return tuple(float(str(v).strip()) for v in items if str(v).strip())
    except ValueError:
        raise ValueError("expected comma-separated numbers") from None


def _strs(value):
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(v, str) for v in items):
        raise TypeError("expected a string or a list of strings")
    return tuple(items)


def _cmd(value):
    items = shlex.split(value) if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items or not all(isinstance(v, str) for v in items):
        raise TypeError("expected a command line (string or list of strings)")
    return tuple(items)


def _args(value):
    items = shlex.split(value) if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(v, str) for v in items):
        raise TypeError("expected flags (a string or a list of strings)")
    return tuple(items)


ALIASES = {"model_path": ("--model",)}  # --engine vllm takes a model directory: `--model DIR` reads naturally
CONVERTERS = {"int": _int, "float": _float, "str": _str, "bool": _bool, "ints": _ints, "floats": _floats,
              "strs": _strs, "cmd": _cmd, "args": _args}


def kind_of(name: str) -> str:
    """How the setting `name` (run-wide, --engine or a target's) is parsed (harness/settings.py KINDS)."""
    return all_settings()[name].metadata["kind"]


def choices_of(name: str) -> tuple[str, ...] | None:
    """The values the setting `name` may take, where it has a fixed set (--engine: the registered targets)."""
    return engines() if name == "engine" else all_settings()[name].metadata["choices"]


def convert(name: str, value: object, source: str) -> object:
    """Turn a CLI string or TOML value into the field's type, or raise ConfigError naming it."""
    where = flag(name) if source == "cli" else f"{source}: key '{name}'"
    try:
        return CONVERTERS[kind_of(name)](value)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {e} (got {value!r})") from None


# --help's groups of the run-wide settings, in order (a target's own settings follow, a group per target)
GROUPS = {
    "workload": ("suite", "num_requests", "seed", "tokenizer", "no_restore_window"),
    "sweep": ("intervals", "block_size", "concurrency", "request_rate", "arrival", "warmup", "duration",
              "max_error_rate", "slo"),
    "target": ("engine", "backend", "api_key", "request_timeout"),
    "cluster": ("address", "replicas", "reference_replicas", "tp_size", "device", "gpus_per_rank", "num_cpus",
                "placement", "startup_timeout",
                "recover_timeout", "max_replica_restarts", "max_retries", "reference_concurrency", "reference_nice",
                "drivers", "sequential_pools", "analyze_on_cluster"),
    "gate": ("deterministic", "calibrate", "baseline_run", "min_coverage", "margin_threshold", "max_soft_rate",
             "max_hard", "max_errors", "max_drift", "drift_tolerance"),
    "output": ("runs_dir", "run_id", "resume", "trust_run_config", "dry_run", "no_progress"),
}
EXIT_STATUSES = ("exit status: 0 PASS; 1 FAIL (the gate failed); 2 the harness could not gate (a bad flag or "
                 "setting, no cluster, a replica or endpoint unusable, no records); 3 INCONCLUSIVE (the run did not "
                 "exercise what it gates: docs/reports.md); 130 interrupted (Ctrl-C) and 143 terminated (SIGTERM): "
                 "finish with --resume RUN_DIR. Every flag: docs/harness.md.")


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: an unknown flag names the closest known one."""

    def error(self, message: str):  # noqa: D102 - argparse's hook
        unknown = re.match(r"unrecognized arguments: (\S+)", message)
        if unknown:
            known = [o for a in self._actions for o in a.option_strings]
            close = difflib.get_close_matches(unknown.group(1).split("=")[0], known, n=1)
            message = f"unknown flag {unknown.group(1)}" + (f"; did you mean {close[0]}?" if close else "")
        self.exit(2, f"specgate: error: {message} (python -m harness.run --help lists every flag)\n")


def _help(name: str, f) -> str:
    default = f.default
    if isinstance(default, tuple):
        default = ",".join(map(str, default))
    return f.metadata["help"] + (f" (default: {default})" if default not in (None, "", False, ()) else "")


def _add(group, name: str, f) -> None:
    kind, help_text = f.metadata["kind"], _help(name, f)
    if kind == "bool":
        group.add_argument(flag(name), action="store_const", const=True, help=help_text)
    elif kind == "strs":
        group.add_argument(flag(name), action="append", metavar="URL", help="repeatable; " + help_text)
    elif kind in ("ints", "floats"):
        group.add_argument(flag(name), metavar="N,N,...", help=help_text)
    elif choices_of(name):
        group.add_argument(flag(name), choices=choices_of(name), help=help_text)
    else:
        metavar = {"cmd": "'CMD ARGS'", "args": "'--FLAG VALUE ...'"}.get(kind, kind.upper())
        group.add_argument(flag(name), *ALIASES.get(name, ()), dest=name, metavar=metavar, help=help_text)


def build_parser() -> argparse.ArgumentParser:
    """The CLI, its flags in groups; every option defaults to 'not given' so a config file can supply it."""
    p = Parser(
        prog="python -m harness.run", usage="python -m harness.run [--config RUN.toml] [FLAG ...]",
        argument_default=argparse.SUPPRESS, allow_abbrev=False, epilog=EXIT_STATUSES,
        description="Run specgate: candidate pools (DFlash + radix cache) against the cold-path reference, "
                    "record every request, report and gate.")
    p.add_argument("--config", metavar="RUN.toml", help="TOML file with any of the settings below "
                   "(keys are the flag names with '_'); flags given here override it")
    fields = all_settings()
    for title, names in GROUPS.items():
        group = p.add_argument_group(title)
        for name in names:
            _add(group, name, fields.pop(name))
    for name in list(fields):  # a target's own settings, under the targets that have them
        owners = [k for k, t in TARGETS.items() if name in declared(t.settings_class)]
        group = next((g for g in p._action_groups if g.title == f"target settings: {', '.join(owners)}"), None)
        _add(group or p.add_argument_group(f"target settings: {', '.join(owners)}"), name, fields.pop(name))
    return p


def did_you_mean(name: str, known) -> str:
    """`; did you mean X?` for the known name closest to `name` (empty when none is close)."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"; did you mean {close[0]}?" if close else ""


def load_toml(path: str | Path) -> dict:
    """The settings of a TOML config file, converted and checked against the known keys."""
    try:
        import tomllib
    except ModuleNotFoundError as e:  # Python 3.10
        raise ConfigError("--config needs Python >= 3.11 (tomllib)") from e
    try:
        raw = tomllib.loads(Path(path).read_text())
    except OSError as e:
        raise ConfigError(f"--config {path}: cannot read ({e.strerror})") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"--config {path}: not valid TOML ({e})") from None
    known = all_settings()
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ConfigError(f"--config {path}: unknown key {unknown[0]!r}{did_you_mean(unknown[0], known)} (valid "
                          f"keys: the flags of --help with '_', docs/harness.md)")
    return {k: convert(k, v, str(path)) for k, v in raw.items()}


def attach_flag_values(argv: list[str]) -> list[str]:
    """`--candidate-args --disable-radix-cache` as `--candidate-args=--disable-radix-cache`: argparse takes a
    value that starts with `--` and has no space for an option of its own ("expected one argument"), but the
    value of a flags-kind setting (engine flags) always starts with `--`."""
    flags_kind = {flag(n) for n, f in all_settings().items() if f.metadata["kind"] == "args"}
    out, i = [], 0
    while i < len(argv):
        if argv[i] in flags_kind and i + 1 < len(argv) and argv[i + 1].startswith("-"):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out


def from_argv(argv: list[str] | None, environ: Mapping[str, str]) -> tuple[RunConfig, set[str]]:
    """Parse CLI flags (and the config file they name); return the config and the explicitly given keys."""
    argv = attach_flag_values(list(sys.argv[1:] if argv is None else argv))
    ns = vars(build_parser().parse_args(argv))
    values = load_toml(ns.pop("config")) if "config" in ns else {}
    explicit = set(values) | set(ns)
    if "run_id" in explicit and "resume" in explicit:
        raise ConfigError("--run-id and --resume exclude each other (a resume keeps its run id)")
    if "address" not in values and environ.get("RAY_ADDRESS"):
        values["address"] = environ["RAY_ADDRESS"]
    values.update({k: convert(k, v, "cli") for k, v in ns.items()})
    return run_config(values, explicit), explicit
