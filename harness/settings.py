"""How a setting is declared, and what every kind of target's own settings say about it.

A setting is a dataclass field whose metadata holds its kind (how a flag or TOML
value is parsed), its help, its choices and what a `--resume` does with it; one
declaration gives its flag `--foo-bar`, its TOML key `foo_bar` and its `--help`
line. `RunConfig` (harness/config.py) declares the run-wide settings this way, and
each kind of target declares its own in a `TargetSettings` subclass (harness/config.py)
next to its target (harness/targets/); the command line is built from all of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, Field, field, fields

# ints: comma list; strs: repeatable; cmd: a command line (argv); args: flags (argv, may be empty)
KINDS = ("int", "float", "str", "bool", "ints", "floats", "strs", "cmd", "args")
# what `--resume RUN_DIR` does with a setting stored in RUN_DIR/config.json (harness/resume.py):
# "runs": it chooses a program or what it loads, never taken from the directory unless --trust-run-config;
# "fixed": it defines the workload or the pools, taken from the run and never changed;
# "free": the command line's value is used (timeouts, thresholds, progress, ...)
RESUME = ("runs", "fixed", "free")
Need = Callable[[bool, str], None]  # need(ok, message) raises the ConfigError naming the flag


def setting(default, kind: str, help: str, *, resume: str = "free", choices: tuple[str, ...] | None = None):
    """A settings field: its default, how its flag / TOML value is parsed, its help, what a resume does with it
    (RESUME) and, for a string, the values it may take."""
    assert kind in KINDS, kind
    assert resume in RESUME, resume
    return field(default=default, metadata={"kind": kind, "help": help, "resume": resume, "choices": choices})


def flag(name: str) -> str:
    """The command-line flag of the setting `name`."""
    return "--" + name.replace("_", "-")


def declared(cls) -> dict[str, Field]:
    """The settings a dataclass declares with `setting` (name -> field), in declaration order."""
    return {f.name: f for f in fields(cls) if "kind" in f.metadata}


def default_of(f: Field) -> object:
    """A settings field's default value."""
    return f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]


def check_choices(values: object, need: Need) -> None:
    """Each setting of the dataclass instance `values` that has choices holds one of them."""
    for name, f in declared(type(values)).items():
        choices, value = f.metadata["choices"], getattr(values, name)
        need(choices is None or value in choices,
             f"{flag(name)} must be one of {', '.join(choices or ())}, got {value!r}")
