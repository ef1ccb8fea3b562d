"""What each target's contract tests are given: one `case_<key>.py` per registered target defines `case(tmp_path)`.

A case is a valid configuration of its target, what its servers report (the server
info its backend's probe returns, per pool: agreeing with the pool, and contradicting
it), what the workload must be built for, and settings it refuses. test_contract.py
runs the same checks on every case, so a new target is covered once its case exists.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

from harness.plan import PoolPlan
from harness.targets.base import Reported


@dataclass
class Case:
    """One target's contract data."""

    argv: list[str]  # a valid command line of the target (without --dry-run)
    pools: list[str]  # the pools it plans for `argv`, candidates first
    # pool -> the server info a server running that pool reports (from the pool plan and, for a started target,
    # what its replicas launch); and what reported() must read from it
    agreeing: Callable[[PoolPlan, object], dict]
    reported: Callable[[PoolPlan], Reported]
    # (pool, server info that contradicts it, a phrase of the message)
    contradicting: list[tuple[str, dict, str]]
    workload: tuple[tuple[int, ...], int, str | None]  # intervals, block size, tokenizer name it is built for
    candidate_args: list[str] = field(default_factory=list)  # a --candidate-args value the target accepts
    infos: dict[str, dict] = field(default_factory=dict)  # what probe() returns (already-running servers)
    refused: list[tuple[list[str], str]] = field(default_factory=list)  # extra argv -> a phrase of the error


def load_case(key: str, tmp_path) -> Case:
    """The case of target `key` (tests/harness/targets/case_<key>.py); fails naming the file when it is missing."""
    try:
        module = importlib.import_module(f"tests.harness.targets.case_{key}")
    except ModuleNotFoundError as e:
        raise AssertionError(f"target {key!r} has no contract case: add tests/harness/targets/case_{key}.py "
                             "with case(tmp_path) -> Case") from e
    return module.case(tmp_path)
