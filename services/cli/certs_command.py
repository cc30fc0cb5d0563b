"""`pdserve certs --out DIR [--host NAME ...]`: a development CA plus gateway and instance
certificates for TLS and mutual TLS (services.tls.dev_certs)."""

import argparse
from pathlib import Path


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("certs", help="make a development CA and TLS certificates",
                                   description=__doc__)
    parser.add_argument("--out", default="certs", help="folder to write the PEM files to (default: certs)")
    parser.add_argument("--host", action="append", default=[],
                        help="extra DNS name or IP address the certificates name (repeatable)")
    parser.add_argument("--days", type=int, default=365, help="validity in days (default: 365)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from services.tls.dev_certs import write_dev_certs

    for path in write_dev_certs(Path(args.out), args.host, args.days):
        print(path)
    return 0
