"""Starts a local pdserve stack as separate OS processes and keeps it running.

`LocalStack(StackConfig(...))` launches redis-server on a free loopback port, the prefill and
decode (or colocated) instances, then one gateway; each child binds the ports it is given
(0 = ephemeral) and writes its bound addresses to a ready file. The stack waits for every
ready file and for the standard gRPC health check to report SERVING, supervises the children
(one that dies is restarted with backoff, up to a crash-loop limit: services.launcher.supervisor),
can add and remove instances while running (scale out/in), and stops everything (SIGTERM, so
instances drain, then SIGKILL after a grace period). `pdserve up` and the e2e test harness are built on it.
"""

from services.launcher.config import StackConfig
from services.launcher.errors import StackError
from services.launcher.stack import LocalStack

__all__ = ["LocalStack", "StackConfig", "StackError"]
