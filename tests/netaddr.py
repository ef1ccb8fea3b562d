"""This machine's own non-loopback IPv4 address, for tests that show something is (not) reachable from outside."""

from __future__ import annotations

import socket


def outside_address() -> str | None:
    """The address the default route leaves from (a UDP connect sends no packet), or None without one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("198.51.100.1", 9))  # TEST-NET-2: never contacted, it only selects a route
            addr = s.getsockname()[0]
        except OSError:
            return None
    return None if addr.startswith("127.") or addr == "0.0.0.0" else addr
