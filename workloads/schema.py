"""The workload model the harness consumes: sessions of turns, and their JSON form.

Turn 0 carries the full prompt (ids and text). Turn n > 0 carries only a suffix:
its input is turn n-1's input + turn n-1's output (known at run time) + the
suffix, built by the harness; a turn with `branch_at` keeps only the first
`branch_at` tokens of that history before its suffix, so it branches off it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

DEFAULT_INTERVALS = (128, 256)  # track intervals the committed frozen suite targets
DEFAULT_BLOCK_SIZE = 8  # DFlash block size B: drafts per verify step
CONTEXT_TOKENS = 2048  # the built-in engine's context (max_position_embeddings)
MAX_TURN0_TOKENS = 1100  # turn-0 prompts stay here so follow-up turns fit the context


class WorkloadError(ValueError):
    """A workload file or spec is invalid; the message names the line and the field."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None,
                 field: str | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.line = line
        self.field = field


@dataclass(frozen=True)
class Turn:
    """One request of a session."""

    max_new_tokens: int
    input_ids: tuple[int, ...] | None = None  # turn 0: the full prompt
    text: str | None = None  # turn 0: the prompt text (same content as input_ids)
    suffix_ids: tuple[int, ...] | None = None  # turn n>0: appended after prev input + prev output
    suffix_text: str | None = None
    branch_at: int | None = None  # turn n>0: keep only this many tokens of prev input + prev output


@dataclass(frozen=True)
class Session:
    """A conversation: turn 0's prompt, then follow-ups that extend it."""

    session_id: str  # stable, unique within a suite
    suite: str  # "frozen", "load", or the user file's stem
    interval: int | None  # the track interval this case targets (None = any)
    group: str  # "offset", "multi", "control", "load", ...
    targets: str  # one sentence: what this case targets
    meta: dict  # e.g. {"boundary_offset": -3, "boundaries_spanned": 1, "turn0_len": 253}
    turns: tuple[Turn, ...]

    @property
    def prompt_len(self) -> int:
        """Turn 0's prompt length in tokens."""
        ids = self.turns[0].input_ids
        return len(ids) if ids is not None else 0

    def turn_input(self, turn: int, prev_input: list[int] | None, prev_output: list[int] | None) -> list[int]:
        """Input ids of `turn`: turn 0's prompt; else the previous input + its (candidate) output + the suffix,
        that history cut to its first `branch_at` tokens when the turn branches (all of it when it is shorter)."""
        t = self.turns[turn]
        if turn == 0:
            if t.input_ids is None:
                raise ValueError(f"session {self.session_id}: turn 0 has no input_ids")
            return list(t.input_ids)
        if prev_input is None or prev_output is None:
            raise ValueError(f"session {self.session_id}: turn {turn} needs turn {turn - 1}'s output")
        history = list(prev_input) + list(prev_output)
        if t.branch_at is not None:
            history = history[: t.branch_at]
        return history + list(t.suffix_ids or ())

    def max_total_tokens(self) -> int:
        """The longest the sequence can get: prompt, every suffix and every turn's max output."""
        return self.prompt_len + sum(t.max_new_tokens + len(t.suffix_ids or ()) for t in self.turns)


TURN_FIELDS = ("max_new_tokens", "input_ids", "text", "suffix_ids", "suffix_text", "branch_at")
SESSION_FIELDS = ("session_id", "suite", "interval", "group", "targets", "meta", "turns")


def turn_to_dict(turn: Turn) -> dict:
    """JSON form of a turn; absent (None) fields are left out."""
    out: dict = {}
    for name in TURN_FIELDS:
        value = getattr(turn, name)
        if value is not None:
            out[name] = list(value) if isinstance(value, tuple) else value
    return out


def session_to_dict(session: Session) -> dict:
    """JSON form of a session (the JSONL schema of workloads/README.md)."""
    return {
        "session_id": session.session_id,
        "suite": session.suite,
        "interval": session.interval,
        "group": session.group,
        "targets": session.targets,
        "meta": session.meta,
        "turns": [turn_to_dict(t) for t in session.turns],
    }


def dumps_jsonl(sessions: list[Session]) -> str:
    """Sessions as JSONL text, one compact line per session, fixed key order."""
    return "".join(json.dumps(session_to_dict(s), separators=(",", ":")) + "\n" for s in sessions)
