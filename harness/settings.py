"""How a setting is declared, and what every kind of target's own settings say about it.

A setting is a dataclass field whose metadata holds its kind (how a flag or TOML
value is parsed), its help, its choices and what a `--resume` does with it; one
declaration gives its flag `--foo-bar`, its TOML key `foo_bar` and its `--help`
line. `RunConfig` (harness/config.py) declares the run-wide settings this way, and
each kind of target declares its own in a `TargetSettings` subclass next to its
target (harness/targets/); the command line is built from all of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, Field, asdict, dataclass, field, fields
from typing import TYPE_CHECKING, ClassVar

from reports.gate import EXTERNAL_DRIFT_TOLERANCE

if TYPE_CHECKING:
    from harness.config import RunConfig

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


@dataclass(frozen=True)
class TargetSettings:
    """One kind of target's own settings, and what the rest of a run needs to know about that target.

    A subclass sets `key` (its --engine value, or the name of a target chosen otherwise) and declares its fields
    with `setting`; the run reads only the attributes below, never the target's name.
    """

    key: ClassVar[str] = ""
    managed: ClassVar[bool] = True  # the harness starts its servers (under Ray); else they run already
    chosen_by: ClassVar[tuple[str, ...]] = ()  # its settings that choose it without --engine (else --engine KEY)
    default_backend: ClassVar[str] = "sglang"  # --backend when not given
    refuses: ClassVar[frozenset[str]] = frozenset()  # run-wide settings (RunConfig's) it cannot honour

    @property
    def noisy(self) -> bool:
        """Whether its numerics move with the code path (bf16, GPU kernels): then every run is calibrated from
        controls (harness/calibrate.py); an exact target keeps its fixed tolerance."""
        return True

    @property
    def drift_tolerance(self) -> float:
        """The gate's default --drift-tolerance for this target."""
        return EXTERNAL_DRIFT_TOLERANCE

    def suite(self, suite: str) -> str:
        """The suite a run drives, given --suite (a target may run one of its own)."""
        return suite

    def suite_flag(self, suite: str) -> str:
        """The flag that chose the workload, for messages."""
        return f"--suite {suite}"

    def validate(self, run: RunConfig, need: Need) -> None:
        """The target's own settings, checked against the run's; `need(ok, message)` raises the ConfigError."""
        check_choices(self, need)

    def refused(self, name: str, offered_by: tuple[str, ...]) -> str:
        """Why the setting `name`, which this target does not have, is refused; `offered_by`: the --engine values
        whose targets have it."""
        where = f" (--engine {' or '.join(offered_by)} does)" if offered_by else ""
        return f"{flag(name)} does not apply to this target{where}"

    def to_json(self) -> dict:
        """The settings as JSON-ready values (config.json's run_config holds them beside the run-wide ones)."""
        return asdict(self)
