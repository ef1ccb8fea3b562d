"""Deterministic workloads: the frozen boundary suite, seeded load profiles, user JSONL files.

    from workloads import list_suites, load_suite
    sessions = load_suite("frozen")                      # 56 two-turn sessions from data/frozen.jsonl
    sessions = load_suite("load", seed=0, num_requests=1024)
    sessions = load_suite("cover", intervals=(128, 256), block_size=8)  # one session per boundary cell
    sessions = load_suite("path/to/mine.jsonl")          # validated; see workloads/README.md
"""

from __future__ import annotations

from pathlib import Path

from workloads.schema import DEFAULT_BLOCK_SIZE, DEFAULT_INTERVALS, Session, Turn, WorkloadError
from workloads.validate import validate_file

BUILTIN_SUITES = ("frozen", "load", "cover")

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_INTERVALS",
    "Session",
    "Turn",
    "WorkloadError",
    "list_suites",
    "load_suite",
    "validate_file",
]


def list_suites() -> list[str]:
    """Names of the built-in suites."""
    return list(BUILTIN_SUITES)


def load_suite(name_or_path: str | Path, *, seed: int = 0, num_requests: int = 1024,
               intervals: tuple[int, ...] = DEFAULT_INTERVALS, block_size: int = DEFAULT_BLOCK_SIZE) -> list[Session]:
    """Sessions of a built-in suite ("frozen", "load", "cover") or of a user JSONL file (validated).

    `seed` and `num_requests` apply to "load" only, `intervals` to "load" and "cover", `block_size` to "cover".
    """
    # Imported here, not at the top: `python -m workloads.frozen` would otherwise run a module
    # that importing the package had already loaded (runpy warns about it).
    if name_or_path == "frozen":
        from workloads.frozen import FROZEN_PATH

        return validate_file(FROZEN_PATH)
    if name_or_path == "cover":
        from workloads.cover import generate_cover

        return generate_cover(tuple(intervals), block_size)
    if name_or_path == "load":
        from workloads.load import generate_load

        return generate_load(num_requests=num_requests, seed=seed, intervals=tuple(intervals))
    path = Path(name_or_path)
    if not path.is_file():
        raise WorkloadError(f"unknown suite {str(name_or_path)!r}: not one of {', '.join(BUILTIN_SUITES)} "
                            "and no such file", path=str(path))
    return validate_file(path)
