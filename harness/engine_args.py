"""`--candidate-args`: engine flags for the candidate replicas only, parsed by `engine.serve`'s own parser.

The flags become EngineConfig overrides of the candidate pools (so tensor-parallel rank
actors, built from the same EngineConfig, agree with their server); the raw strings stay
in the plan (`EngineSpec.args`) for servers that are not the built-in engine. Flags the
harness sets per pool (interval, block size, speculation, radix cache, fault, model, TP,
page size, device) and per replica (host, port, API key) are refused with the harness flag to use.
"""

from __future__ import annotations

import argparse
from dataclasses import fields

from engine.config import EngineConfig

# engine settings the harness decides per pool -> the harness flag that sets them (None: the pool's role)
# (--disable-radix-cache is accepted: a candidate that turns its cache off is gated, and restores nothing: the
# verdict says INCONCLUSIVE)
POOL_FIELDS = {
    "model_path": "--model-path", "model_preset": "--model-preset", "tp_size": "--tp-size",
    "speculative_algorithm": None, "speculative_num_draft_tokens": "--block-size",
    "mamba_radix_cache_strategy": None, "mamba_track_interval": "--intervals",
    "page_size": "--page-size", "inject_fault": "--inject-fault", "device": "--device (every pool and rank)",
}
# what --cover asks of the candidates: drafts that force the commit length to cycle 1..B with the verify count
COVER_ARGS = ("--drafter-mode", "scripted", "--scripted-accept", "-1")


class EngineArgsError(ValueError):
    """A flag in --candidate-args is unknown, malformed or reserved to the harness; the message names it."""


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _parser() -> argparse.ArgumentParser:
    from engine.server.config import build_parser

    parser = build_parser()
    for action in parser._actions:  # only the flags actually given end up in the namespace
        action.default = argparse.SUPPRESS

    def error(message: str):
        raise EngineArgsError(message)

    parser.error = error  # argparse would print and exit; the harness names the flag instead
    return parser


def engine_overrides(args: tuple[str, ...] | list[str]) -> dict:
    """EngineConfig field -> value for the given engine.serve flags; EngineArgsError on a bad or reserved one."""
    if not args:
        return {}
    try:
        given = vars(_parser().parse_args(list(args)))
    except SystemExit:  # --help / --version print and exit even with a custom error()
        raise EngineArgsError("--help is not an engine setting") from None
    engine_fields = {f.name for f in fields(EngineConfig)}
    for name in given:
        if name not in engine_fields:
            raise EngineArgsError(f"{_flag(name)} is set by the harness for each replica, not per pool")
        if name in POOL_FIELDS:
            instead = POOL_FIELDS[name]
            raise EngineArgsError(f"{_flag(name)} is set by the harness for each pool"
                                  + (f"; use the harness flag {instead}" if instead else
                                     " (candidates run speculation with the radix cache; see --diagnose)"))
    return given


def check_config(base: dict, overrides: dict) -> None:
    """Build the EngineConfig a candidate pool would run; EngineArgsError naming the flag if it is invalid."""
    try:
        EngineConfig(**{**base, **overrides})
    except (ValueError, TypeError) as e:
        message = str(e)
        for name in overrides:
            message = message.replace(name, _flag(name))
        raise EngineArgsError(message) from None
