"""The fake SGLang server (tests/harness/fake_server.py), recording first where it was started.

`python -m tests.harness.recording_server --env-dir DIR [server flags]` writes DIR/<port>.json: its argv, pid
and CUDA_VISIBLE_DEVICES (null when unset), then serves as the fake does. Flags the fake does not know (SGLang's
`--random-seed`, the built-in engine's `--device`, ...) are ignored, so it stands in for any managed engine. With
`--tp-rendezvous HOST:PORT` it also holds rank 0 of the replica's tensor-parallel group (engine/tp/group.py, on
CPU), so that a built-in replica's rank actors join it and stay.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

from tests.harness import fake_server


def _hold_rank_zero(rendezvous: str, size: int) -> None:
    """Form the group as rank 0 and keep it (its ranks then wait for calls that never come)."""
    from engine.tp.group import Group

    host, _, port = rendezvous.rpartition(":")
    group = Group(0, size, host, int(port), 60.0, os.environ["SPECGATE_TP_SECRET"].encode())
    threading.Event().wait()  # never returns: the group lives as long as the server
    del group


def main(argv: list[str]) -> None:
    at = argv.index("--env-dir")
    env_dir, rest = argv[at + 1], argv[:at] + argv[at + 2:]
    parser_args = _known(rest)
    record = {"argv": rest, "pid": os.getpid(), "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")}
    Path(env_dir, f"{parser_args.port}.json").write_text(json.dumps(record))
    if "--tp-rendezvous" in rest:
        rendezvous = rest[rest.index("--tp-rendezvous") + 1]
        threading.Thread(target=_hold_rank_zero, args=(rendezvous, parser_args.tp_size), daemon=True).start()
    from aiohttp import web

    web.run_app(fake_server.make_app(parser_args), host=parser_args.host, port=parser_args.port, print=None,
                access_log=None)


def _known(argv: list[str]):
    """The fake server's flags among `argv` (the others ignored)."""
    import argparse

    parser = argparse.ArgumentParser(add_help=False)
    defaults = vars(fake_server.parse_args([]))
    for name, value in defaults.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            parser.add_argument(flag, action="store_true")
        else:
            parser.add_argument(flag, type=type(value) if value is not None else str, default=value)
    return parser.parse_known_args(argv)[0]


if __name__ == "__main__":
    main(sys.argv[1:])
