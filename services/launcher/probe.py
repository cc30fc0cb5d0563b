"""`python -m services.launcher.probe ADDRESS [--service NAME]`: gRPC health probe.

Exits 0 when the standard health service at ADDRESS reports SERVING for NAME (default ""),
1 otherwise. Container health checks (deploy/compose) use it.
"""

import argparse
import sys

from services.launcher.readiness import is_serving


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.launcher.probe")
    parser.add_argument("address", help="host:port of a pdserve gRPC service")
    parser.add_argument("--service", default="", help='health service name (default: "")')
    parser.add_argument("--timeout-s", type=float, default=3.0)
    args = parser.parse_args(argv)
    return 0 if is_serving(args.address, args.service, args.timeout_s) else 1


if __name__ == "__main__":
    sys.exit(main())
