"""The port a replica's server listens on: one that is free now, and whether the server really holds it.

`free_port` asks the OS for a free port and lets it go again, so another process can bind it before the
server does: two replicas of one run started side by side on one node can be handed the same port, one
server binds it and the other fails to. A health probe of that URL is then answered by the first server,
and the second replica would report its neighbour's address as its own (a candidate pool served by the
reference server: every answer identical, nothing restored, nothing caught). `holds_port` tells a server
that holds its port from one that only answers on it: on Linux, whose open files hold the socket listening on
the port, the server's process and its descendants' or another process's. Where that cannot be seen (no /proc,
a port a container's firewall rule forwards, another user's process) the answer is taken as it comes.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

PROC = Path("/proc")
LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column


def free_port(host: str) -> int:
    """A TCP port that is free on `host` right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def listening_inodes(port: int, proc: Path = PROC) -> set[str] | None:
    """The inodes of the sockets listening on TCP `port` (IPv4 and IPv6, any address); None without
    /proc/net/tcp (not Linux)."""
    tables = [proc / "net" / name for name in ("tcp", "tcp6")]
    if not tables[0].exists():
        return None
    inodes = set()
    for table in tables:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def process_tree(root: int, proc: Path = PROC) -> list[int]:
    """`root` and every process descended from it (from each process's parent in /proc/PID/stat)."""
    children: dict[int, list[int]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        children.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, ()))
    return tree


def holds_port(root: int, port: int, proc: Path = PROC) -> bool | None:
    """Whether process `root` or one of its descendants holds the socket listening on `port`: True; False when
    another process visibly holds it; None where this cannot be told (no /proc, no listener seen in this network
    namespace, e.g. a container's port forwarded by the firewall, or its holder's files not readable here)."""
    inodes = listening_inodes(port, proc)
    if not inodes:
        return None
    wanted = {f"socket:[{i}]" for i in inodes}
    tree = set(process_tree(root, proc))
    if any(_has_socket(pid, wanted, proc) for pid in tree):
        return True
    others = (int(e.name) for e in proc.iterdir() if e.name.isdigit() and int(e.name) not in tree)
    return False if any(_has_socket(pid, wanted, proc) for pid in others) else None


def _has_socket(pid: int, wanted: set[str], proc: Path) -> bool:
    """Whether process `pid` has one of the sockets `wanted` ("socket:[inode]") open (False where its files cannot
    be read)."""
    try:
        fds = list((proc / str(pid) / "fd").iterdir())
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(fd) in wanted:
                return True
        except OSError:
            continue
    return False


def shared_addresses(urls: dict[str, str]) -> str | None:
    """Why the started replicas cannot be told apart (two report one URL: one of them answers for a server it
    does not own, e.g. where `holds_port` cannot tell), or None."""
    seen: dict[str, str] = {}
    for replica_id, url in urls.items():
        if url in seen:
            return (f"replicas {seen[url]} and {replica_id} both report {url}: one of them answers through the "
                    "other's server (a port taken between free_port() and its server's bind); start the run again")
        seen[url] = replica_id
    return None
