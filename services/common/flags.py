"""argparse flags for InstanceSettings, with PDSERVE_* environment variables as defaults.

Every settings field `some_name` becomes flag `--some-name` and variable `PDSERVE_SOME_NAME`;
`--help` shows both and the documented default. An entry point that serves one fixed role
(prefill) omits `--role`; one that serves several offers it with those choices.
"""

import argparse
import os
from collections.abc import Mapping, Sequence

from shared.errors import InvalidRequestError
from services.common.settings import InstanceSettings, setting_fields

ENV_PREFIX = "PDSERVE_"
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def build_parser(prog: str, roles: Sequence[str], environ: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """A parser for an entry point serving `roles` (the first is the default role)."""
    environ = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(prog=prog, description=f"pdserve engine instance ({', '.join(roles)})")
    for field in setting_fields():
        if field.name == "role" and len(roles) == 1:
            continue
        default = roles[0] if field.name == "role" else field.default
        default = _env_default(parser, field.name, field.type, default, environ)
        help_text = f"{field.metadata['help']} [env {env_name(field.name)}; default: %(default)r]"
        if field.type is bool:  # --name / --no-name; the variable takes 1/0, true/false, yes/no
            parser.add_argument(flag_name(field.name), action=argparse.BooleanOptionalAction, default=default,
                                help=help_text)
            continue
        parser.add_argument(
            flag_name(field.name), type=field.type, default=default,
            choices=list(roles) if field.name == "role" else None, help=help_text)
    if len(roles) == 1:
        parser.set_defaults(role=roles[0])
    return parser


def settings_from_args(args: argparse.Namespace) -> InstanceSettings:
    """Raises InvalidRequestError naming the first bad setting."""
    return InstanceSettings(**{field.name: getattr(args, field.name) for field in setting_fields()})


def parse_settings(prog: str, roles: Sequence[str], argv: Sequence[str] | None = None,
                   environ: Mapping[str, str] | None = None) -> InstanceSettings:
    """Flags -> settings; exits with status 2 and a message naming the setting on bad input."""
    parser = build_parser(prog, roles, environ)
    args = parser.parse_args(argv)
    if args.role not in roles:  # a PDSERVE_ROLE outside the choices: argparse skips defaults
        parser.error(f"argument --role: invalid choice {args.role!r} (choose from {', '.join(roles)})")
    try:
        return settings_from_args(args)
    except InvalidRequestError as error:
        parser.error(f"{flag_name(error.field)}: {error.message}")


def _env_default(parser: argparse.ArgumentParser, name: str, kind: type, default, environ: Mapping[str, str]):
    raw = environ.get(env_name(name))
    if raw is None:
        return default
    if kind is bool:
        if raw.strip().lower() not in TRUE_WORDS + FALSE_WORDS:
            parser.error(f"{env_name(name)}={raw!r} is not one of {TRUE_WORDS + FALSE_WORDS}")
        return raw.strip().lower() in TRUE_WORDS
    try:
        return kind(raw)
    except ValueError:
        parser.error(f"{env_name(name)}={raw!r} is not a valid {kind.__name__}")
