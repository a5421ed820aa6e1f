"""Free ports for servers started on this machine: SGLang, the simulator, Prefect's API."""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A port nothing listens on right now: the OS picks it for a throwaway bound socket (another
    process may still take it before the caller binds it; callers that start a server check)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
