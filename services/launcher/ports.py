"""Free-port lookup for the few listeners that must be fixed before they start (Redis, an
instance that restarts on its own address).

A port fixed now is bound seconds later, after other processes started. A port from the
kernel's ephemeral range can be handed meanwhile to any socket that binds port 0 or connects
out (a sibling instance's listener, a client connection), and the fixed listener then fails
to bind: "Device is busy" from UCX, in one fresh-clone run of the suite. So the port is drawn
from below the ephemeral range, which the kernel never hands out by itself, and a port this
process gave out already is not given again.
"""

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL_LOW = 32768  # Linux's default when the range cannot be read
LOWEST_PORT = 10000  # below this: well-known and registered services' ports
NUM_TRIES = 200

_handed_out: set[int] = set()


def find_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that nothing uses right now, outside the ephemeral range where
    there is room below it (else any free port); never one this process returned before."""
    low = ephemeral_range_low()
    candidates = random.sample(range(LOWEST_PORT, low), min(NUM_TRIES, low - LOWEST_PORT)) if low > LOWEST_PORT else []
    for port in candidates:
        if port not in _handed_out and _is_free(host, port):
            _handed_out.add(port)
            return port
    return _any_free_port(host)


def ephemeral_range_low() -> int:
    """The lowest port of the kernel's ephemeral range."""
    try:
        return int(EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_LOW


def _is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def _any_free_port(host: str) -> int:
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((host, 0))
            port = probe.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port
