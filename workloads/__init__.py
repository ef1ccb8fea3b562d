"""Deterministic workloads: the frozen boundary suite, seeded load profiles, user JSONL files.

    from workloads import list_suites, load_suite
    sessions = load_suite("frozen")                      # 72 sessions (148 requests) from data/frozen.jsonl
    sessions = load_suite("frozen", intervals=(512,), block_size=16, tokenizer=tok)  # generated for that target
    sessions = load_suite("load", seed=0, num_requests=1024)
    sessions = load_suite("cover", intervals=(128, 256), block_size=8)  # one session per boundary cell
    sessions = load_suite("path/to/mine.jsonl", tokenizer=tok)  # validated; see workloads/README.md

Every prompt is an exact token length in the target's `tokenizer` (default: the
built-in byte tokenizer). The committed frozen suite is what "frozen" gives for
its own targets (intervals within 128, 256; B = 8; the byte tokenizer; seed 0);
any other target gets the suite generated for it.
"""

from __future__ import annotations

from pathlib import Path

from protocol.tokenizer import BYTE_TOKENIZER, Tokenizer
from workloads.schema import (
    CONTEXT_TOKENS,
    DEFAULT_BLOCK_SIZE,
    DEFAULT_INTERVALS,
    Session,
    Turn,
    WorkloadError,
)
from workloads.validate import validate_file

BUILTIN_SUITES = ("frozen", "load", "cover")

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_INTERVALS",
    "Session",
    "Turn",
    "WorkloadError",
    "committed_frozen_fits",
    "list_suites",
    "load_suite",
    "validate_file",
]


def list_suites() -> list[str]:
    """Names of the built-in suites."""
    return list(BUILTIN_SUITES)


def committed_frozen_fits(intervals: tuple[int, ...], block_size: int, tokenizer: Tokenizer | None,
                          seed: int) -> bool:
    """True when the committed frozen.jsonl is the suite for this target (else it is generated)."""
    return (tokenizer is not None and set(intervals) <= set(DEFAULT_INTERVALS) and block_size == DEFAULT_BLOCK_SIZE
            and tokenizer.name == "byte" and seed == 0)


def load_suite(name_or_path: str | Path, *, seed: int = 0, num_requests: int = 1024,
               intervals: tuple[int, ...] = DEFAULT_INTERVALS, block_size: int = DEFAULT_BLOCK_SIZE,
               tokenizer: Tokenizer | None = BYTE_TOKENIZER, max_context: int | None = CONTEXT_TOKENS) -> list[Session]:
    """Sessions of a built-in suite ("frozen", "load", "cover") or of a user JSONL file (validated).

    `intervals` and `block_size` are the target's (its pools' track intervals, its DFlash block size B): the
    frozen and load suites place their prompts around those boundaries, at offsets from -B. `seed` applies to
    the generated suites (frozen: where its text starts; load: everything), `num_requests` to "load".
    `tokenizer`: the target's, for exact prompt lengths and for a user file's `text` and ids (None: unknown, so
    a user file's ids are taken as given and text-only prompts are refused). Generated frozen
    sessions that could outgrow `max_context` tokens are left out; a user file's are refused.
    """
    # Imported here, not at the top: `python -m workloads.frozen` would otherwise run a module
    # that importing the package had already loaded (runpy warns about it).
    if name_or_path == "frozen":
        from workloads.frozen import FROZEN_PATH, generate_frozen

        if committed_frozen_fits(tuple(intervals), block_size, tokenizer, seed):
            return validate_file(FROZEN_PATH)
        return generate_frozen(tuple(intervals), block_size, tokenizer, seed, max_context)
    if name_or_path == "cover":
        from workloads.cover import generate_cover

        return generate_cover(tuple(intervals), block_size)
    if name_or_path == "load":
        from workloads.load import generate_load

        return generate_load(num_requests=num_requests, seed=seed, intervals=tuple(intervals),
                             block_size=block_size, tokenizer=tokenizer)
    path = Path(name_or_path)
    if not path.is_file():
        raise WorkloadError(f"unknown suite {str(name_or_path)!r}: not one of {', '.join(BUILTIN_SUITES)} "
                            "and no such file", path=str(path))
    return validate_file(path, max_context=max_context, tokenizer=tokenizer)
