"""`python -m services.rpc.health_probe [ADDRESS] [--service NAME]`: gRPC health probe.

Exits 0 when the standard health service at ADDRESS reports SERVING for NAME (default ""),
1 otherwise. Container health checks (deploy/compose) run it every few seconds, so it imports
only grpc and what it needs (never the launcher or the engine). Without ADDRESS it probes the
port the service wrote to its ready file (`--ready-file`, default `$PDSERVE_READY_FILE`) on
127.0.0.1: services on ephemeral ports (`PDSERVE_GRPC_PORT=0`, host networking) are probed
too, and a missing ready file means "not up yet". When the container serves TLS
(PDSERVE_TLS_CERT_FILE set), the probe speaks TLS, trusting PDSERVE_TLS_CA_FILE (or
PDSERVE_INSTANCE_TLS_CA_FILE on the gateway) and presenting the container's own certificate,
which mutual-TLS instances accept (`pdserve certs` makes certificates good for both ends).
"""

import argparse
import os
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.rpc.ready_file import grpc_address_in, read_ready_file

PROBE_HOST = "127.0.0.1"


def health_status(address: str, service: str = "", timeout_s: float = 1.0,
                  credentials: grpc.ChannelCredentials | None = None) -> int | None:
    """The health service's status for `service`, or None when unreachable/unimplemented.
    With `credentials`, over TLS."""
    channel = grpc.insecure_channel(address) if credentials is None else grpc.secure_channel(address, credentials)
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError:
            return None
    return reply.status


def is_serving(address: str, service: str = "", timeout_s: float = 1.0,
               credentials: grpc.ChannelCredentials | None = None) -> bool:
    return health_status(address, service, timeout_s, credentials) == health_pb2.HealthCheckResponse.SERVING


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.rpc.health_probe")
    parser.add_argument("address", nargs="?", help="host:port of a pdserve gRPC service "
                                                   "(default: the port in --ready-file, on 127.0.0.1)")
    parser.add_argument("--ready-file", default=os.environ.get("PDSERVE_READY_FILE", ""),
                        help="the service's ready file (default: $PDSERVE_READY_FILE)")
    parser.add_argument("--service", default="", help='health service name (default: "")')
    parser.add_argument("--timeout-s", type=float, default=3.0)
    args = parser.parse_args(argv)
    if not args.address and not args.ready_file:
        parser.error("give ADDRESS or --ready-file (or set PDSERVE_READY_FILE)")
    address = args.address or address_in_ready_file(Path(args.ready_file))
    if address is None:
        return 1
    return 0 if is_serving(address, args.service, args.timeout_s, probe_credentials(os.environ)) else 1


def address_in_ready_file(path: Path) -> str | None:
    """127.0.0.1 and the port the ready file announces; None while there is none."""
    ready = read_ready_file(path)
    address = grpc_address_in(ready) if ready is not None else None
    if address is None or ":" not in address:
        return None
    return f"{PROBE_HOST}:{address.rsplit(':', 1)[1]}"


def probe_credentials(environ) -> grpc.ChannelCredentials | None:
    if not environ.get("PDSERVE_TLS_CERT_FILE"):
        return None
    from services.tls.credentials import channel_credentials

    ca_file = environ.get("PDSERVE_TLS_CA_FILE") or environ.get("PDSERVE_INSTANCE_TLS_CA_FILE")
    return channel_credentials(ca_file, environ["PDSERVE_TLS_CERT_FILE"], environ.get("PDSERVE_TLS_KEY_FILE"))


if __name__ == "__main__":
    sys.exit(main())
