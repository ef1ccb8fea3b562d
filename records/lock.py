"""One writer per run directory: `RUN_DIR/writer.lock`, taken by a run or a resume for as long as it writes.

The lock file names its holder (pid, host, command, since when, the process's start time). It is created
complete or not at all (written to a private file, then hard-linked into place: the link fails when a lock
exists), so a reader never sees half a holder. A second writer is refused with `RunLocked`, whose message
names the holder. A lock left by a process that is gone (same host, no such pid, or the pid now belongs to
a process started later) is stale and taken over; takeovers are serialised by an flock on
`RUN_DIR/writer.lock.takeover` and re-check the lock they judged stale, so of two racing takeovers one wins
and the other sees the winner alive. A lock held on another host is never taken over: its message says to
remove the file once that process is known to be gone.

    with RunLock.acquire(run_dir):   # RunLocked when another process writes there
        ...
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import socket
import sys
import time
from pathlib import Path

LOCK_FILE = "writer.lock"


class RunLocked(RuntimeError):
    """The run directory has a live writer (or an unreadable lock); `holder` is what its lock file says."""

    def __init__(self, run_dir: Path, holder: dict | None, reason: str = "") -> None:
        self.run_dir, self.holder = run_dir, holder
        path = run_dir / LOCK_FILE
        if holder is None:
            msg = (f"run directory {run_dir} is locked by {path}, which cannot be read ({reason}); remove it if no "
                   "run or resume is using this directory")
        else:
            msg = (f"run directory {run_dir} is in use by pid {holder.get('pid')} on host {holder.get('host')} "
                   f"since {holder.get('since')} (command: {holder.get('command')}); wait for it to finish or stop "
                   "it, then resume")
            if holder.get("host") != socket.gethostname():
                msg += f"; if that process is gone, remove {path}"
        super().__init__(msg)


def process_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22); None where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # the command name may hold spaces and parentheses
    return int(fields[19]) if fields[0] != "Z" else -1  # -1: a zombie, gone but not yet reaped


def holder_alive(holder: dict) -> bool:
    """Whether the process a lock names still runs (only decidable on its own host: elsewhere, True)."""
    if holder.get("host") != socket.gethostname():
        return True
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    start = process_start(pid)
    if start == -1:
        return False
    recorded = holder.get("start_time")
    return start is None or recorded is None or start == recorded  # another start time: the pid was reused


def _holder_info(command: str | None) -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(),
            "command": command if command is not None else shlex.join([sys.executable, *sys.argv]),
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "start_time": process_start(os.getpid())}


def _create(path: Path, data: bytes) -> None:
    """Put `data` at `path` atomically, complete, or raise FileExistsError."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
    finally:
        os.unlink(tmp)


class RunLock:
    """A held run-directory lock; `taken_over` is the stale holder it replaced, if any."""

    def __init__(self, run_dir: Path, data: bytes, taken_over: dict | None) -> None:
        self.run_dir, self.path = run_dir, run_dir / LOCK_FILE
        self._data, self.taken_over = data, taken_over
        self.holder = json.loads(data)

    @classmethod
    def acquire(cls, run_dir: str | Path, command: str | None = None) -> RunLock:
        """Take the lock of `run_dir` (which must exist) for this process, taking over a stale one; RunLocked
        when a live process holds it. `command`: what the lock says this process runs (default: its argv)."""
        run_dir = Path(run_dir)
        path = run_dir / LOCK_FILE
        data = json.dumps(_holder_info(command), sort_keys=True).encode() + b"\n"
        for _ in range(20):  # each retry follows a change by another process: a release or a takeover
            try:
                _create(path, data)
                return cls(run_dir, data, None)
            except FileExistsError:
                pass
            try:
                seen = path.read_bytes()
            except FileNotFoundError:
                continue  # released meanwhile
            try:
                holder = json.loads(seen)
                assert isinstance(holder, dict)
            except (ValueError, AssertionError) as e:
                raise RunLocked(run_dir, None, f"not a lock record: {e}") from None
            if holder_alive(holder):
                raise RunLocked(run_dir, holder)
            if cls._take_over(run_dir, seen, data):
                return cls(run_dir, data, holder)
        raise RunLocked(run_dir, None, "it kept changing while this process tried to take it")

    @staticmethod
    def _take_over(run_dir: Path, stale: bytes, data: bytes) -> bool:
        """Replace the stale lock `stale` by ours, one takeover at a time; False when the lock changed first."""
        path = run_dir / LOCK_FILE
        with open(run_dir / (LOCK_FILE + ".takeover"), "a") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)
            try:
                if path.read_bytes() != stale:
                    return False  # another takeover (or a release and a new run) came first
            except FileNotFoundError:
                return False
            os.unlink(path)
            try:
                _create(path, data)
            except FileExistsError:
                return False  # a new writer took the free lock between the unlink and our link
            return True

    def release(self) -> None:
        """Remove the lock if it is still ours (idempotent)."""
        try:
            if self.path.read_bytes() == self._data:
                os.unlink(self.path)
        except FileNotFoundError:
            pass

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()
