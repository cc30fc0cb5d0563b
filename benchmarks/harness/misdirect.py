"""The control run's decoy (`--control-misdirect` of bench-faults and bench-chaos): a process
and a port that no service uses, at which every fault is aimed instead of its victim.

The faults then do what they do to the decoy, and each fault's verification, which looks at the
real victim (its /proc state, its pid, the rules' counters on the traffic it should have caught),
must fail. A control run that passes means the verification proves nothing.
"""

import contextlib
import subprocess
from dataclasses import dataclass

from services.launcher.ports import find_free_port

DECOY_ARGV = ("sleep", "100000")


@dataclass
class Decoy:
    """A `sleep` process and a free port that nothing listens on. A decoy killed by a
    misdirected kill is started again at the next `pid`."""

    process: subprocess.Popen
    port: int

    @property
    def pid(self) -> int:
        if self.process.poll() is not None:
            self.process = _start()
        return self.process.pid

    @property
    def name(self) -> str:
        return f"decoy (pid {self.pid}, port {self.port})"


@contextlib.contextmanager
def decoy():
    """A Decoy for the length of a with-block; killed afterwards."""
    found = Decoy(_start(), find_free_port())
    try:
        yield found
    finally:
        found.process.kill()  # SIGKILL ends it stopped or not
        found.process.wait()


def _start() -> subprocess.Popen:
    return subprocess.Popen(list(DECOY_ARGV), stdin=subprocess.DEVNULL, start_new_session=True)
