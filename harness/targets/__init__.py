"""Targets: what a run gates, one module per kind, behind one interface (base.py), chosen by key.

* `builtin`: the built-in engine (`engine.serve`) under Ray, the default;
* `vllm`: vLLM's OpenAI server under Ray, from its own venv (`--engine vllm`);
* `sglang`: SGLang's server under Ray, from its own venv (`--engine sglang`);
* `endpoints`: servers that already run, given by `--endpoint` / `--reference-endpoint`.

Each kind declares its own settings (a TargetSettings subclass beside its Target) and
is registered here; `run_config` turns flat settings (flags, TOML keys, a stored
config.json) into a RunConfig holding the chosen target's settings. `--engine KEY`
picks a started target; `--endpoint` without `--engine` picks `endpoints`. A new kind
of target is one module with its Target and settings, added with `register` (here for
the four above, or by whoever imports it); harness/run.py names none of them.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import Field, dataclass

from harness.config import RunConfig
from harness.errors import ConfigError
from harness.settings import declared, default_of, flag, setting
from harness.targets.base import CONTROLS, Target
from harness.targets.builtin import BuiltinTarget
from harness.targets.endpoints import EndpointsTarget
from harness.targets.sglang import SGLangTarget
from harness.targets.vllm import VLLMTarget

__all__ = ["CONTROLS", "DEFAULT_ENGINE", "TARGETS", "Target", "all_settings", "engines", "make_target", "offered_by",
           "offers", "refusal", "register", "run_config", "target_key", "unregister"]
TARGETS: dict[str, type[Target]] = {}
DEFAULT_ENGINE = BuiltinTarget.key
RESUME_ONLY = "target"  # config.json names its target's kind (what a resume reads); not a flag


@dataclass(frozen=True)
class _Selector:
    engine: str = setting(DEFAULT_ENGINE, "str", "what the Ray replicas run: builtin (engine.serve), vllm (vLLM's "
                          "OpenAI server from its own venv, see --vllm-python; implies --backend openai) or sglang "
                          "(sglang.launch_server from its own venv, see --sglang-python)", resume="runs")


ENGINE: Field = declared(_Selector)["engine"]  # --engine: which started target; its settings follow it


def register(target: type[Target]) -> type[Target]:
    """Add a kind of target to the registry under its settings' key (its flags join the command line)."""
    key = target.settings_class.key
    assert key and key not in TARGETS, f"target key {key!r} is empty or taken"
    for name, f in declared(target.settings_class).items():
        known = all_settings().get(name)
        assert known is None or known.metadata["kind"] == f.metadata["kind"], \
            f"{flag(name)} of target {key} is declared with another kind elsewhere"
    TARGETS[key] = target
    return target


def unregister(key: str) -> None:
    """Remove a kind of target from the registry (tests that register one of their own)."""
    TARGETS.pop(key)


def engines() -> tuple[str, ...]:
    """The values of --engine: the registered targets not chosen by a setting of their own (`chosen_by`)."""
    return tuple(k for k, t in TARGETS.items() if not t.settings_class.chosen_by)


def all_settings() -> dict[str, Field]:
    """Every setting a run can be given, by name: the run-wide ones, --engine, then each target's own (a name two
    targets declare appears once)."""
    fields = {"engine": ENGINE, **declared(RunConfig)}
    for target in TARGETS.values():
        for name, f in declared(target.settings_class).items():
            fields.setdefault(name, f)
    return fields


for _target in (BuiltinTarget, VLLMTarget, SGLangTarget, EndpointsTarget):
    register(_target)


def offered_by(name: str) -> tuple[str, ...]:
    """The --engine values whose targets take the setting `name`."""
    return tuple(k for k in engines() if offers(k, name))


def offers(key: str, name: str) -> bool:
    """Whether target `key` takes the setting `name`: one of its own, or a run-wide one it does not refuse."""
    settings_class = TARGETS[key].settings_class
    return name in declared(settings_class) or name in declared(RunConfig) and name not in settings_class.refuses


def refusal(key: str, name: str) -> str:
    """The message that refuses the setting `name` for target `key` (which does not offer it)."""
    return TARGETS[key].settings_class().refused(name, offered_by(name))


def target_key(values: Mapping | RunConfig) -> str:
    """The kind of target flat settings choose: --engine when it names another than the default, else a stored
    `target` (a resumed run's), else a target whose own settings choose it (`chosen_by`: --endpoint or
    --reference-endpoint pick `endpoints`), else the built-in engine."""
    if isinstance(values, RunConfig):
        return values.key
    engine = values.get("engine", DEFAULT_ENGINE)
    if engine != DEFAULT_ENGINE:
        return str(engine)
    if values.get(RESUME_ONLY):
        return str(values[RESUME_ONLY])
    for key, target in TARGETS.items():
        if any(values.get(name) for name in target.settings_class.chosen_by):
            return key
    return DEFAULT_ENGINE


def run_config(values: Mapping | None = None, explicit: Collection[str] = (), **kw) -> RunConfig:
    """The RunConfig of flat settings (`values` and keywords: flag names with '_'). A setting the chosen target does
    not have is refused with the target's message where it was given (`explicit`) or differs from its default (a
    config.json of an older layout holds every target's settings at their defaults); ConfigError names the flag."""
    values = {**(values or {}), **kw}
    explicit = set(explicit) | set(kw)
    engine = values.get("engine", DEFAULT_ENGINE)
    if engine not in engines():
        raise ConfigError(f"--engine must be one of {', '.join(engines())}, got {engine!r}")
    key = target_key(values)
    if key not in TARGETS:
        raise ConfigError(f"{RESUME_ONLY} {key!r} is not a registered kind of target ({', '.join(TARGETS)})")
    settings_class = TARGETS[key].settings_class
    values.setdefault("backend", settings_class.default_backend)  # what its servers speak (vLLM: the OpenAI API)
    run_fields, own, known = declared(RunConfig), declared(settings_class), all_settings()
    run_kw, own_kw = {}, {}
    for name, value in values.items():
        if name in settings_class.refuses and value and value != default_of(known[name]):
            raise ConfigError(refusal(key, name))
        if name in run_fields:
            run_kw[name] = value
        elif name in own:
            own_kw[name] = value
        elif name in ("engine", RESUME_ONLY):
            continue
        elif name not in known:
            raise ConfigError(f"unknown setting {name!r}")
        elif name in explicit or value != default_of(known[name]) and not _empty(value):
            raise ConfigError(refusal(key, name))
    try:
        settings = settings_class(**own_kw)
    except TypeError as e:
        raise ConfigError(f"settings of target {key}: {e}") from None
    return RunConfig(target=settings, **run_kw)


def _empty(value: object) -> bool:
    return value in (None, False, (), [], "")


def make_target(cfg: RunConfig) -> Target:
    """The run's target, for its config."""
    return TARGETS[cfg.key](cfg)
