"""RunConfig: every setting of a harness run, from CLI flags and/or a TOML file, validated here.

Precedence: built-in defaults < `--config run.toml` < `RAY_ADDRESS` (address only)
< explicit CLI flags. Every flag `--foo-bar` has the TOML key `foo_bar`.
"""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path

PLACEMENTS = ("STRICT_PACK", "PACK", "SPREAD", "STRICT_SPREAD")

# Settings that define what a run measures; a resume must not change them.
RESUME_FIXED = ("suite", "num_requests", "intervals", "concurrency", "block_size", "model_path",
                "model_preset", "inject_fault", "page_size", "tp_size", "server_command")


class ConfigError(ValueError):
    """A setting is missing, malformed or inconsistent; the message names it."""


@dataclass(frozen=True)
class RunConfig:
    """One harness run: workload, sweep, pools, cluster, run directory and gate thresholds."""

    suite: str = "frozen"  # frozen, load, or a user workload file
    num_requests: int | None = None  # size of the load suite (None: the suite's default)
    intervals: tuple[int, ...] = (128, 256)  # one candidate pool per mamba track interval
    concurrency: tuple[int, ...] = (1, 4, 8, 16)  # sweep points, requests in flight per pool
    replicas: int = 1  # replicas per candidate pool
    reference_replicas: int = 1
    tp_size: int = 1
    block_size: int = 8  # DFlash block size B (--speculative-num-draft-tokens)
    model_path: str = "default"
    model_preset: str | None = None  # architecture for --model-path random
    inject_fault: str | None = None  # candidates only; the reference stays the clean oracle
    page_size: int | None = None  # None: the engine's default
    address: str | None = None  # Ray cluster address; None: `auto` on a ray-up node, else a local Ray
    num_cpus: int | None = None  # logical CPUs of a local Ray
    placement: str = "STRICT_PACK"  # placement-group strategy of one replica's bundles (TP ranks)
    runs_dir: str = "runs"
    run_id: str | None = None
    resume: str | None = None  # run directory to finish
    endpoint: tuple[str, ...] = ()  # external candidate servers (no Ray then)
    reference_endpoint: tuple[str, ...] = ()
    api_key: str | None = None
    request_timeout: float = 600.0  # seconds per request
    startup_timeout: float = 600.0  # seconds for a replica to become healthy (also after a restart)
    max_retries: int = 3  # re-sends of one request after replica failures
    reference_concurrency: int = 8  # reference requests in flight
    sequential_pools: bool = False  # run interval pools one after another instead of together
    server_command: tuple[str, ...] | None = None  # replica server command; None: python -m engine.serve
    margin_threshold: float = 0.5
    max_soft_rate: float = 0.02
    max_hard: int = 0
    max_errors: int = 0
    dry_run: bool = False
    no_progress: bool = False

    def __post_init__(self) -> None:
        validate(self)

    @property
    def external(self) -> bool:
        """True when driving already-running servers instead of built-in replicas."""
        return bool(self.endpoint)

    def to_json(self) -> dict:
        """The config as JSON-ready values, the API key redacted."""
        d = asdict(self)
        if d["api_key"]:
            d["api_key"] = "***"
        return d


# kind of each field for parsing: int, float, str, bool, ints (comma list), strs (repeatable), cmd
_KINDS = {
    "suite": "str", "num_requests": "int", "intervals": "ints", "concurrency": "ints", "replicas": "int",
    "reference_replicas": "int", "tp_size": "int", "block_size": "int", "model_path": "str",
    "model_preset": "str", "inject_fault": "str", "page_size": "int", "address": "str", "num_cpus": "int",
    "placement": "str", "runs_dir": "str", "run_id": "str", "resume": "str", "endpoint": "strs",
    "reference_endpoint": "strs", "api_key": "str", "request_timeout": "float", "startup_timeout": "float",
    "max_retries": "int", "reference_concurrency": "int", "sequential_pools": "bool", "server_command": "cmd",
    "margin_threshold": "float", "max_soft_rate": "float", "max_hard": "int", "max_errors": "int",
    "dry_run": "bool", "no_progress": "bool",
}
assert set(_KINDS) == {f.name for f in fields(RunConfig)}

_HELP = {
    "suite": "workload: frozen, load, or a JSONL file (workloads/README.md)",
    "num_requests": "requests of the load suite",
    "intervals": "mamba track intervals; one candidate pool each",
    "concurrency": "sweep points: requests in flight per pool",
    "replicas": "replicas per candidate pool",
    "reference_replicas": "replicas of the reference (cold-path) pool",
    "tp_size": "tensor-parallel ranks per replica",
    "block_size": "DFlash block size B (--speculative-num-draft-tokens)",
    "model_path": "default (bundled weights), random, or a weights directory",
    "model_preset": "architecture for --model-path random (tiny, small)",
    "inject_fault": "a named fault (engine/faults.py) for the candidate pools",
    "page_size": "KV page size of the replicas (engine default if unset)",
    "address": "Ray cluster address (else RAY_ADDRESS, else auto on a `ray up` node, else a local Ray)",
    "num_cpus": "logical CPUs of a local Ray (default: enough for every replica, at least the machine's cores)",
    "placement": "placement-group strategy of a replica's bundles (one per TP rank)",
    "runs_dir": "where run directories go",
    "run_id": "name of the run directory (default: UTC time + random suffix)",
    "resume": "finish the interrupted run in RUN_DIR",
    "endpoint": "an already-running candidate server (repeatable); no Ray replicas then",
    "reference_endpoint": "an already-running cold-path server (repeatable)",
    "api_key": "sent as 'Authorization: Bearer KEY' (and given to built-in replicas)",
    "request_timeout": "seconds per request",
    "startup_timeout": "seconds for a replica to become healthy, also after a restart",
    "max_retries": "re-sends of a request after replica failures",
    "reference_concurrency": "reference requests in flight",
    "sequential_pools": "run the interval pools one after another (default: together)",
    "server_command": "replica server command (default: 'python -m engine.serve'; a leading python is the "
                      "replica's interpreter)",
    "margin_threshold": "gate: top-1/top-2 log-prob margin below which a flip is soft",
    "max_soft_rate": "gate: largest allowed fraction of soft flips",
    "max_hard": "gate: largest allowed number of hard mismatches",
    "max_errors": "gate: largest allowed number of failed requests",
    "dry_run": "print the plan and exit",
    "no_progress": "no live progress bar",
}
assert set(_HELP) == set(_KINDS)


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _convert(name: str, value: object, source: str) -> object:
    """Turn a CLI string or TOML value into the field's type, or raise ConfigError naming it."""
    kind = _KINDS[name]
    where = flag(name) if source == "cli" else f"{source}: key '{name}'"
    try:
        if kind == "bool":
            if not isinstance(value, bool):
                raise TypeError("expected true or false")
            return value
        if kind == "int":
            if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip().lstrip(
                    "+-").isdigit():
                raise TypeError("expected an integer")
            return int(value)
        if kind == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise TypeError("expected a number")
            try:
                return float(value)
            except ValueError:
                raise TypeError("expected a number") from None
        if kind == "str":
            if not isinstance(value, str):
                raise TypeError("expected a string")
            return value
        if kind == "ints":
            items = value.split(",") if isinstance(value, str) else value
            if not isinstance(items, (list, tuple)):
                raise TypeError("expected a list of integers")
            try:
                return tuple(int(str(v).strip()) for v in items)
            except ValueError:
                raise ValueError("expected comma-separated integers") from None
        if kind == "strs":
            items = [value] if isinstance(value, str) else value
            if not isinstance(items, (list, tuple)) or not all(isinstance(v, str) for v in items):
                raise TypeError("expected a string or a list of strings")
            return tuple(items)
        if kind == "cmd":
            items = shlex.split(value) if isinstance(value, str) else value
            if not isinstance(items, (list, tuple)) or not items or not all(isinstance(v, str) for v in items):
                raise TypeError("expected a command line (string or list of strings)")
            return tuple(items)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {e} (got {value!r})") from None
    raise AssertionError(kind)


def validate(c: RunConfig) -> None:
    """Raise ConfigError on the first bad or inconsistent setting, naming its flag."""
    def need(ok: bool, msg: str) -> None:
        if not ok:
            raise ConfigError(msg)

    need(bool(c.suite), "--suite must not be empty")
    need(c.num_requests is None or c.num_requests >= 1, f"--num-requests must be >= 1, got {c.num_requests}")
    for name in ("intervals", "concurrency"):
        vals = getattr(c, name)
        need(len(vals) > 0, f"{flag(name)} needs at least one value")
        need(all(v >= 1 for v in vals), f"{flag(name)} values must be >= 1, got {list(vals)}")
        need(len(set(vals)) == len(vals), f"{flag(name)} has repeated values: {list(vals)}")
    for name in ("replicas", "reference_replicas", "tp_size", "block_size", "reference_concurrency"):
        need(getattr(c, name) >= 1, f"{flag(name)} must be >= 1, got {getattr(c, name)}")
    for name in ("max_retries", "max_hard", "max_errors"):
        need(getattr(c, name) >= 0, f"{flag(name)} must be >= 0, got {getattr(c, name)}")
    need(c.num_cpus is None or c.num_cpus >= 1, f"--num-cpus must be >= 1, got {c.num_cpus}")
    need(c.request_timeout > 0 and c.startup_timeout > 0, "--request-timeout and --startup-timeout must be > 0")
    need(c.margin_threshold >= 0, f"--margin-threshold must be >= 0, got {c.margin_threshold}")
    need(0 <= c.max_soft_rate <= 1, f"--max-soft-rate must be in [0, 1], got {c.max_soft_rate}")
    need(c.placement in PLACEMENTS, f"--placement must be one of {', '.join(PLACEMENTS)}, got {c.placement!r}")
    if not c.external:
        for i in c.intervals:
            need(i >= c.block_size, f"--intervals: interval {i} is smaller than --block-size {c.block_size} "
                 "(one verify step may cross at most one boundary)")
            need(c.page_size is None or i % c.page_size == 0,
                 f"--intervals: interval {i} is not a multiple of --page-size {c.page_size}")
    need(c.page_size is None or c.page_size >= 1, f"--page-size must be >= 1, got {c.page_size}")
    need(c.model_preset is None or c.model_path == "random",
         f"--model-preset applies to --model-path random only (model path is {c.model_path!r})")
    for url in c.endpoint + c.reference_endpoint:
        need(re.match(r"^https?://[^/\s]+", url) is not None,
             f"--endpoint / --reference-endpoint must be http(s)://host:port URLs, got {url!r}")
    need(not c.reference_endpoint or c.endpoint, "--reference-endpoint needs --endpoint (external candidates)")
    need(not c.endpoint or c.reference_endpoint,
         "--endpoint needs --reference-endpoint: the cold-path oracle for an external engine must be "
         "the same model, served without speculation and without radix cache")
    need(c.run_id is None or re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", c.run_id) is not None
         and c.run_id != "latest", f"--run-id must be letters, digits, '.', '_' or '-', got {c.run_id!r}")


def build_parser() -> argparse.ArgumentParser:
    """The CLI; every option defaults to 'not given' so a config file can supply it."""
    p = argparse.ArgumentParser(
        prog="python -m harness.run", argument_default=argparse.SUPPRESS, allow_abbrev=False,
        description="Run specgate: candidate pools (DFlash + radix cache) against the cold-path reference, "
                    "record every request, report and gate. Exit 0 pass, 1 gate failed, 2 harness error.")
    p.add_argument("--config", metavar="RUN.toml", help="TOML file with any of the settings below "
                   "(keys are the flag names with '_'); flags given here override it")
    d = RunConfig.__dataclass_fields__
    for name, kind in _KINDS.items():
        default = d[name].default
        if isinstance(default, tuple):
            default = ",".join(map(str, default))
        help_text = _HELP[name] + (f" (default: {default})" if default not in (None, "", False) else "")
        if kind == "bool":
            p.add_argument(flag(name), action="store_const", const=True, help=help_text)
        elif kind == "strs":
            p.add_argument(flag(name), action="append", metavar="URL", help="repeatable")
        elif kind == "ints":
            p.add_argument(flag(name), metavar="N,N,...", help=help_text)
        elif name == "placement":
            p.add_argument(flag(name), choices=PLACEMENTS, help=help_text)
        else:
            p.add_argument(flag(name), metavar=kind.upper() if kind != "cmd" else "'CMD ARGS'", help=help_text)
    return p


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
    unknown = sorted(set(raw) - set(_KINDS))
    if unknown:
        raise ConfigError(f"--config {path}: unknown key(s) {', '.join(unknown)}; "
                          f"valid keys: {', '.join(sorted(_KINDS))}")
    return {k: _convert(k, v, str(path)) for k, v in raw.items()}


def from_argv(argv: list[str] | None, environ: Mapping[str, str]) -> tuple[RunConfig, set[str]]:
    """Parse CLI flags (and the config file they name); return the config and the explicitly given keys."""
    ns = vars(build_parser().parse_args(argv))
    values = load_toml(ns.pop("config")) if "config" in ns else {}
    explicit = set(values) | set(ns)
    if "run_id" in explicit and "resume" in explicit:
        raise ConfigError("--run-id and --resume exclude each other (a resume keeps its run id)")
    if "address" not in values and environ.get("RAY_ADDRESS"):
        values["address"] = environ["RAY_ADDRESS"]
    values.update({k: _convert(k, v, "cli") for k, v in ns.items()})
    if values.get("endpoint"):
        values["endpoint"] = tuple(u.rstrip("/") for u in values["endpoint"])
    if values.get("reference_endpoint"):
        values["reference_endpoint"] = tuple(u.rstrip("/") for u in values["reference_endpoint"])
    return RunConfig(**values), explicit


def for_resume(saved: dict, given: RunConfig, explicit: set[str], run_dir: Path) -> RunConfig:
    """The config of a resumed run: the saved one, with only runtime settings taken from `given`.

    Raises ConfigError when a flag that defines the measurement was given with another value.
    """
    known = {f.name for f in fields(RunConfig)}
    base = {k: v for k, v in saved.items() if k in known}
    for k, v in base.items():
        kind = _KINDS[k]
        if v is not None and kind in ("ints", "strs", "cmd"):
            base[k] = tuple(v)
    for k in sorted(explicit - {"resume"}):
        if k in RESUME_FIXED and getattr(given, k) != base.get(k):
            raise ConfigError(f"{flag(k)} cannot change on --resume (the run used {base.get(k)!r})")
    overrides = {k: getattr(given, k) for k in explicit if k in known and k not in RESUME_FIXED}
    if base.get("api_key") == "***":
        base["api_key"] = None
    base.update(overrides)
    base.update(run_id=run_dir.name, runs_dir=str(run_dir.parent), resume=str(run_dir), dry_run=given.dry_run)
    try:
        return RunConfig(**base)
    except TypeError as e:
        raise ConfigError(f"{run_dir}/config.json: unusable run config ({e})") from None
