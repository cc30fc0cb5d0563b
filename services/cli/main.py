"""Entry point of the `pdserve` console script (declared in pyproject.toml).

`main` builds one argparse parser; each subcommand lives in its own module that exposes
`add_parser(subparsers)` (registers its flags and sets `run`) and `run(args) -> int`.
Subcommand modules import heavy libraries (torch, transformers) inside `run`, so
`pdserve --help` stays instant.
"""

import argparse
import sys
from collections.abc import Sequence

from services.cli import (
    bench_command,
    certs_command,
    convert_command,
    generate_command,
    offline_command,
    profile_command,
    serve_command,
    simulate_command,
    status_command,
    up_command,
)
from shared.errors import ConfigurationError, InvalidRequestError
from shared.logging_setup import LOG_FORMATS, configure_logging

from services.settings.flags import flag_name

SUBCOMMAND_MODULES = (convert_command, offline_command, serve_command, up_command, generate_command,
                      status_command, bench_command, certs_command, profile_command,
                      simulate_command)


def build_parser() -> argparse.ArgumentParser:
    """The full parser; tests call it to check flags without running anything."""
    parser = argparse.ArgumentParser(
        prog="pdserve",
        description="pdserve: LLM inference serving with prefill/decode disaggregation.",
    )
    parser.add_argument("--log-level", default="WARNING", help="Python logging level (default: WARNING)")
    parser.add_argument("--log-format", choices=LOG_FORMATS, default="text",
                        help="log lines as text or one JSON object each (default: text; services "
                             "take their own --log-format / PDSERVE_LOG_FORMAT)")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in SUBCOMMAND_MODULES:
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parses `argv` (default: sys.argv), runs the chosen subcommand, returns its exit code.

    A bad setting (ConfigurationError) or bad input (InvalidRequestError) is reported on
    stderr, naming it, with exit code 2, like argparse.
    """
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    try:
        return args.run(args)
    except ConfigurationError as error:
        print(f"pdserve {args.command}: error: {flag_name(error.field)}: {error.message}", file=sys.stderr)
        return 2
    except InvalidRequestError as error:
        print(f"pdserve {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
