"""Command-line flags of an engine instance: one per InstanceSettings field.

Every settings field `some_name` becomes flag `--some-name`, variable `PDSERVE_SOME_NAME` and
key `some_name` of the `--config` TOML file (services.settings.service_settings); `--help` shows
the variable and the documented default. An entry point that serves one fixed role (prefill)
omits `--role`; one that serves several offers it with those choices.
"""

import argparse
from collections.abc import Sequence

from shared.errors import ConfigurationError

from services.instance.settings import InstanceSettings
from services.settings.flags import add_config_flag, add_settings_flags, flag_name, settings_from_args

__all__ = ["build_parser", "env_name", "flag_name", "parse_settings"]


def env_name(field_name: str) -> str:
    return InstanceSettings.env_name(field_name)


def build_parser(prog: str, roles: Sequence[str]) -> argparse.ArgumentParser:
    """A parser for an entry point serving `roles` (with several, InstanceSettings' default
    role, decode, is the first)."""
    parser = argparse.ArgumentParser(prog=prog, description=f"pdserve engine instance ({', '.join(roles)})")
    add_config_flag(parser)
    skip = ("role",) if len(roles) == 1 else ()
    add_settings_flags(parser, InstanceSettings, skip=skip, choices={"role": roles})
    if len(roles) == 1:
        parser.set_defaults(role=roles[0])
    return parser


def parse_settings(prog: str, roles: Sequence[str], argv: Sequence[str] | None = None) -> InstanceSettings:
    """Flags, PDSERVE_* variables, --config file -> settings; exits with status 2 and a message
    naming the setting on bad input."""
    parser = build_parser(prog, roles)
    args = parser.parse_args(argv)
    try:
        settings = settings_from_args(args, InstanceSettings)
    except ConfigurationError as error:
        parser.error(f"{flag_name(error.field)}: {error.message}")
    if settings.role not in roles:  # from PDSERVE_ROLE or the file
        parser.error(f"--role: must be one of {', '.join(roles)} here, got {settings.role!r}")
    return settings
