"""`pdserve serve gateway|prefill|decode|colocated [service flags...]`: run one service.

The remaining arguments go unchanged to the service's `main(argv)` (see
`pdserve serve ROLE --help` for them); `colocated` is the decode service with
`--role colocated`.
"""

import argparse
import importlib

# role -> (module with main(argv), arguments put in front of the user's)
SERVICES = {
    "gateway": ("services.gateway", []),
    "prefill": ("services.prefill", []),
    "decode": ("services.decode", ["--role", "decode"]),
    "colocated": ("services.decode", ["--role", "colocated"]),
    "planner": ("services.planner.main", []),
}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Called by services.cli.main.build_parser to register this subcommand."""
    parser = subparsers.add_parser(
        "serve", help="run one service: gateway, prefill, decode, colocated or planner",
        description="Runs one pdserve service in the foreground; the arguments after the "
                    "role are the service's own flags (each also an environment variable).",
    )
    parser.add_argument("role", choices=sorted(SERVICES), help="which service to run")
    parser.add_argument("service_args", nargs=argparse.REMAINDER,
                        help="flags for the service (see `pdserve serve ROLE --help`)")
    parser.set_defaults(run=run)


def service_argv(role: str, service_args: list[str]) -> tuple[str, list[str]]:
    """(module name, argv for its main) for `pdserve serve role service_args...`."""
    module_name, fixed_args = SERVICES[role]
    return module_name, [*fixed_args, *service_args]


def run(args: argparse.Namespace) -> int:
    module_name, argv = service_argv(args.role, args.service_args)
    service = importlib.import_module(module_name)
    result = service.main(argv)
    return 0 if result is None else int(result)
