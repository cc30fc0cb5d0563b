"""Free-port lookup for the few listeners the launcher must fix before starting (Redis)."""

import socket


def find_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]
