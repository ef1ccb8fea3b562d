"""Targets: what a run gates, one module per kind, behind one interface (base.py), chosen by key.

* `builtin`: the built-in engine (`engine.serve`) under Ray, the default;
* `vllm`: vLLM's OpenAI server under Ray, from its own venv (`--engine vllm`);
* `sglang`: SGLang's server under Ray, from its own venv (`--engine sglang`);
* `endpoints`: servers that already run, given by `--endpoint` / `--reference-endpoint`.

`--engine KEY` picks a target the harness starts (`managed`); `--endpoint` without
`--engine` picks `endpoints`. A new kind of target is one module with a `Target`
subclass and one entry in TARGETS; harness/run.py names none of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from harness.backends import BACKENDS
from harness.targets.base import CONTROLS, Need, Target
from harness.targets.builtin import BuiltinTarget
from harness.targets.endpoints import EndpointsTarget
from harness.targets.sglang import SGLangTarget
from harness.targets.vllm import VLLMTarget

if TYPE_CHECKING:
    from harness.config import RunConfig

TARGETS: dict[str, type[Target]] = {t.key: t for t in (BuiltinTarget, VLLMTarget, SGLangTarget, EndpointsTarget)}
DEFAULT_ENGINE = BuiltinTarget.key
ENGINES = tuple(k for k, t in TARGETS.items() if t.managed)  # the values of --engine


def target_key(cfg: RunConfig) -> str:
    """The run's target: --engine's, or `endpoints` when --endpoint is given without --engine (a started target
    given endpoints refuses them itself)."""
    return "endpoints" if cfg.endpoint and cfg.engine == DEFAULT_ENGINE else cfg.engine


def target_class(cfg: RunConfig) -> type[Target]:
    """The Target subclass of the run (its class settings: controls, default backend, drift tolerance)."""
    return TARGETS[target_key(cfg)]


def make_target(cfg: RunConfig) -> Target:
    """The run's target, for its config."""
    return target_class(cfg)(cfg)


def default_backend(engine: str) -> str | None:
    """--backend when not given, for `--engine engine` (None for an unknown engine, refused by validation)."""
    target = TARGETS.get(engine)
    return target.default_backend if target is not None and target.managed else None


def validate_target(cfg: RunConfig, need: Need) -> None:
    """--engine, --backend and --tokenizer, the controls (CONTROLS) the target does not offer, then the target's own
    settings; `need(ok, message)` raises the ConfigError."""
    need(cfg.backend in BACKENDS, f"--backend must be one of {', '.join(BACKENDS)}, got {cfg.backend!r}")
    need(cfg.engine in ENGINES, f"--engine must be one of {', '.join(ENGINES)}, got {cfg.engine!r}")
    path = cfg.tokenizer
    need(path is None or bool(path) and (not path.startswith((".", "/", "~")) and not path.endswith(".json")
                                         or Path(path).expanduser().exists()),
         f"--tokenizer {path}: no such file or directory (give a tokenizer.json or a local model directory)")
    cls = target_class(cfg)
    for name in CONTROLS:
        offered_by = tuple(k for k, t in TARGETS.items() if t.managed and name in t.controls)
        need(not getattr(cfg, name) or name in cls.controls, cls.refused(name, offered_by))
    cls.validate(cfg, need)
