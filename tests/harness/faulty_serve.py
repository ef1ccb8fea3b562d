"""Test wrapper around `python -m engine.serve` that breaks only one role's replicas.

    python -m tests.harness.faulty_serve --break candidate|reference --fault raise-after:N \\
        [--extra 'SERVER FLAGS'] [the flags the harness appends...]

The harness starts every pool with the same --server-command; this wrapper adds
`--test-loop-fault FAULT` (and the extra flags, e.g. `--watchdog-timeout 10`) only
when the replica's role (DFLASH = candidate) is the one to break, then execs the
real server, so the process the replica actor supervises is engine.serve itself.
"""

from __future__ import annotations

import os
import shlex
import sys

OWN = ("--break", "--fault", "--extra")


def server_argv(argv: list[str]) -> list[str]:
    """The engine.serve command line for the wrapper's `argv`."""
    own: dict[str, str] = {}
    while argv and argv[0] in OWN:
        own[argv[0]] = argv[1]
        argv = argv[2:]
    is_candidate = "DFLASH" in argv
    args = [sys.executable, "-m", "engine.serve", *argv]
    if (own["--break"] == "candidate") == is_candidate:
        args += ["--test-loop-fault", own["--fault"], *shlex.split(own.get("--extra", ""))]
    return args


if __name__ == "__main__":
    cmd = server_argv(sys.argv[1:])
    os.execv(cmd[0], cmd)
