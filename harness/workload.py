"""The sessions a run sends, built for what its candidate pools run (DESIGN.md 3.6).

A `WorkloadTarget` is what the sessions are built for: the pools' track intervals
and DFlash block size B, their tokenizer, their context. Each target
(harness/targets/) says where these come from (the run's flags, a model
directory, the probed /server_info of --endpoint servers); this module builds the
sessions for them. The frozen and load suites are generated for it, so boundary
offsets -B..+1 hold exactly in the target's tokens; the committed frozen suite is
what a run at I = 128/256, B = 8 with the byte tokenizer and seed 0 sends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.errors import ConfigError
from protocol.tokenizer import BYTE_TOKENIZER, Tokenizer, TokenizerError

if TYPE_CHECKING:
    from harness.config import RunConfig

GENERATED = ("frozen", "load")  # suites built from text, so they need the target's tokenizer


@dataclass(frozen=True)
class WorkloadTarget:
    """What the workload is built for; `describe()` is the plan's workload line."""

    intervals: tuple[int, ...]
    block_size: int
    tokenizer: Tokenizer | None  # None: an external target whose tokenizer is unknown (ids-only user files)
    tokenizer_source: str  # where it came from, for the plan
    max_context: int | None

    @property
    def tokenizer_name(self) -> str | None:
        return self.tokenizer.name if self.tokenizer is not None else None


def load_target_tokenizer(spec: str) -> Tokenizer:
    """The tokenizer named by `spec` ("byte": the engine's own pure-Python copy, the fast path)."""
    if spec == "byte":
        return BYTE_TOKENIZER
    from protocol.hf_tokenizer import load_tokenizer

    try:
        return load_tokenizer(spec)
    except TokenizerError as e:
        raise ConfigError(f"--tokenizer: {e}") from None


def from_flags(cfg: RunConfig, spec: str | None, source: str) -> WorkloadTarget:
    """The workload target of replicas the harness starts: intervals and B from the flags, the tokenizer named by
    `spec` (None: unknown, `source` says why), the workload's own context limit."""
    from workloads.schema import CONTEXT_TOKENS

    tokenizer = load_target_tokenizer(spec) if spec is not None else None
    return WorkloadTarget(tuple(cfg.intervals), cfg.block_size, tokenizer, source, CONTEXT_TOKENS)


def load_sessions(cfg: RunConfig, target: WorkloadTarget) -> tuple[list, int]:
    """The workload's sessions for `target`, through the workloads package API, and how many generated sessions
    were left out because they could outgrow the target's context (ConfigError naming the flag)."""
    from workloads import load_suite
    from workloads.schema import WorkloadError

    flag = suite_flag(cfg)
    if target.tokenizer is None and cfg.workload in GENERATED:
        raise ConfigError(f"{flag}: its prompts are text cut to exact lengths in the target's tokenizer, and "
                          f"{target.tokenizer_source}: pass --tokenizer (the served model's tokenizer.json or its "
                          "local model directory; nothing is downloaded)")
    generated = cfg.workload in GENERATED
    kwargs = {"intervals": target.intervals, "block_size": target.block_size, "seed": cfg.seed,
              "max_context": None if generated else target.max_context, "tokenizer": target.tokenizer}
    if cfg.num_requests:
        kwargs["num_requests"] = cfg.num_requests
    try:
        sessions = list(load_suite(cfg.workload, **kwargs))
    except (WorkloadError, TokenizerError, OSError, ValueError) as e:
        raise ConfigError(f"{flag}: {e}") from None
    if not generated or target.max_context is None:
        return sessions, 0
    fits = [s for s in sessions if s.max_total_tokens() <= target.max_context]
    return fits, len(sessions) - len(fits)


def suite_flag(cfg: RunConfig) -> str:
    """The flag that chose the workload, for messages."""
    return cfg.target.suite_flag(cfg.suite)


def describe(cfg: RunConfig, target: WorkloadTarget, left_out: int = 0) -> str:
    """The plan's line on what the workload was built for (and what of it did not fit the context)."""
    from workloads import committed_frozen_fits

    tok = (f"tokenizer {target.tokenizer_name} (from {target.tokenizer_source})" if target.tokenizer is not None
           else f"no tokenizer ({target.tokenizer_source}; ids sent as given, the report shows ids)")
    if cfg.workload == "frozen":
        committed = target.tokenizer is not None and committed_frozen_fits(
            target.intervals, target.block_size, target.tokenizer, cfg.seed)
        how = "the committed workloads/data/frozen.jsonl" if committed else (
            f"generated for intervals {','.join(map(str, target.intervals))} and B={target.block_size} (offsets "
            f"-{target.block_size}..+1 around multiples of each interval), seed {cfg.seed}")
    elif cfg.workload == "load":
        how = (f"seed {cfg.seed}, prompts at offsets -{target.block_size + 4}..+4 around multiples of "
               f"{','.join(map(str, target.intervals))}")
    elif cfg.workload == "cover":
        how = f"one session per (step, commit length) cell at B={target.block_size}"
    else:
        how = "a user file"
    dropped = (f"; {left_out} session(s) left out: they could outgrow the {target.max_context}-token context"
               if left_out else "")
    return f"workload: {how}; {tok}{dropped}"
