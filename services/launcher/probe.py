"""`python -m services.launcher.probe ADDRESS [--service NAME]`: gRPC health probe.

Exits 0 when the standard health service at ADDRESS reports SERVING for NAME (default ""),
1 otherwise. Container health checks (deploy/compose) use it. When the container serves TLS
(PDSERVE_TLS_CERT_FILE set), the probe speaks TLS, trusting PDSERVE_TLS_CA_FILE (or
PDSERVE_INSTANCE_TLS_CA_FILE on the gateway) and presenting the container's own certificate,
which mutual-TLS instances accept (`pdserve certs` makes certificates good for both ends).
"""

import argparse
import os
import sys

import grpc

from services.launcher.readiness import is_serving


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.launcher.probe")
    parser.add_argument("address", help="host:port of a pdserve gRPC service")
    parser.add_argument("--service", default="", help='health service name (default: "")')
    parser.add_argument("--timeout-s", type=float, default=3.0)
    args = parser.parse_args(argv)
    return 0 if is_serving(args.address, args.service, args.timeout_s, probe_credentials(os.environ)) else 1


def probe_credentials(environ) -> grpc.ChannelCredentials | None:
    if not environ.get("PDSERVE_TLS_CERT_FILE"):
        return None
    from services.common.tls import channel_credentials

    ca_file = environ.get("PDSERVE_TLS_CA_FILE") or environ.get("PDSERVE_INSTANCE_TLS_CA_FILE")
    return channel_credentials(ca_file, environ["PDSERVE_TLS_CERT_FILE"], environ.get("PDSERVE_TLS_KEY_FILE"))


if __name__ == "__main__":
    sys.exit(main())
