"""Replica server logs: the tail of a failed start, and the first lines of a crash (what an incident shows)."""

from __future__ import annotations

import re
from pathlib import Path

LOG_TAIL_BYTES = 3000
EXCERPT_LINES = 25


def log_tail(path: Path) -> str:
    """The last LOG_TAIL_BYTES of a log, as text ("" when unreadable)."""
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-LOG_TAIL_BYTES:].decode("utf-8", errors="replace")


_CARETS, _EXCEPTION = re.compile(r"^(.*\] )?\s*[\^~]+\s*$"), re.compile(r"\b[A-Za-z_][\w.]*(Error|Exception|Exit)\b: ")


def crash_excerpt(text: str, lines: int = EXCERPT_LINES) -> str | None:
    """The first lines of the crash in a server log: from its first traceback (else the first line saying the engine
    died or failed), a long one cut to its head and its exception; else the log's last lines; None if empty."""
    rows = [r for r in text.splitlines() if not _CARETS.match(r)]
    if not any(r.strip() for r in rows):
        return None
    markers = ("Traceback (most recent call last)", "engine died", "engine loop failed", "Error", "error:")
    for marker in markers:
        start = next((i for i, r in enumerate(rows) if marker in r), None)
        if start is not None:
            end = next((i for i in range(start, len(rows)) if _EXCEPTION.search(rows[i])), start)
            if end - start < lines:  # the first traceback, up to where the next one starts
                stop = next((i for i in range(end, min(start + lines, len(rows))) if "Traceback" in rows[i]), None)
                return "\n".join(rows[start:stop or start + lines])
            return "\n".join(rows[start:start + 4] + ["  ..."] + rows[end - (lines - 6):end + 1])
    return "\n".join(rows[-lines:])


def read_log_excerpt(path: str) -> str | None:
    """crash_excerpt of a log file on this node (run as a Ray task on the replica's node)."""
    try:
        return crash_excerpt(Path(path).read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return None


def previous_log(log_dir: Path, replica_id: str) -> Path | None:
    """The newest log this replica left in `log_dir` (its crashed predecessor's, when Ray restarted it)."""
    logs = [p for p in log_dir.glob(f"{replica_id}-*.log") if p.is_file()]
    return max(logs, key=lambda p: p.stat().st_mtime) if logs else None
