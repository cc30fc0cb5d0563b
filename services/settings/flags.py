"""Command-line flags for settings classes (services.settings.service_settings).

Setting `some_name` is flag `--some-name`; `--help` shows its description, its environment
variable and its default. A flag left out stays out of the parsed namespace (argparse's
SUPPRESS), so the environment, the settings file or the default decide it; given values stay
strings for pydantic to convert and check, so a bad one is reported naming the setting
whether it came from a flag, a variable or the file. Booleans are switches (`--no-http`),
tuples repeatable flags (`--api-key a --api-key b`).
"""

import argparse
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from services.settings.service_settings import ServiceSettings, load_settings

# json_schema_extra of a tuple setting given as one comma-separated value, not a repeated flag.
ONE_VALUE = {"flag": "one value"}
# json_schema_extra of a tuple setting whose flag takes several values, and may be repeated
# (`--lora-modules a=/x b=/y --lora-modules c=/z`).
MANY_VALUES = {"flag": "many values"}
# The parsed namespace's attribute listing the settings classes with flags on that command line.
CLASSES_DEST = "pdserve_settings_classes"
CONFIG_FLAG_HELP = ("TOML settings file of `name = value` lines (names as the flags, with _ for -); "
                    "flags and PDSERVE_* variables win over it")


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def add_settings_flags(parser: argparse.ArgumentParser, settings_cls: type[ServiceSettings],
                       skip: Iterable[str] = (), choices: Mapping[str, Sequence[str]] | None = None,
                       only: Iterable[str] | None = None) -> None:
    """One flag per field of `settings_cls` (or of `only` those), except `skip`; `choices`
    narrows a field's values."""
    choices = choices or {}
    known = parser.get_default(CLASSES_DEST) or ()
    if settings_cls not in known:  # so that a settings file may hold all their keys
        parser.set_defaults(**{CLASSES_DEST: (*known, settings_cls)})
    fields = settings_cls.setting_fields()
    names = fields if only is None else list(only)
    for name in names:
        if name in skip:
            continue
        info = fields[name]
        kind = argument_kind(info.annotation, info.json_schema_extra == ONE_VALUE, name.startswith("no_"))
        if info.json_schema_extra == MANY_VALUES:
            kind = {"action": "extend", "nargs": "+", "metavar": "VALUE"}
        if name in choices:
            kind["choices"] = list(choices[name])
        default = "none" if info.default is None else repr(info.default)
        help_text = f"{info.description} [env {settings_cls.env_name(name)}; default: {default}]"
        parser.add_argument(flag_name(name), dest=name, default=argparse.SUPPRESS,
                            help=help_text.replace("%", "%%"), **kind)


def add_config_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", default=None, help=CONFIG_FLAG_HELP)


def flag_values(args: argparse.Namespace, settings_cls: type[ServiceSettings]) -> dict[str, Any]:
    """The settings of `settings_cls` given on the command line."""
    return {name: getattr(args, name) for name in settings_cls.setting_fields() if hasattr(args, name)}


def settings_from_args(args: argparse.Namespace, settings_cls: type[ServiceSettings]) -> ServiceSettings:
    """Flags > PDSERVE_* variables > args.config > defaults. The settings file may hold the
    settings of every class whose flags this command line has."""
    classes = getattr(args, CLASSES_DEST, ())
    other_keys = {name for other in classes if other is not settings_cls for name in other.setting_fields()}
    return load_settings(settings_cls, flag_values(args, settings_cls), getattr(args, "config", None), other_keys)


def argument_kind(annotation: Any, takes_one_value: bool, is_negative: bool) -> dict[str, Any]:
    """argparse keywords for a field's type: a switch (`--x` / `--no-x`, or just `--no-x` for a
    setting named no_x), a repeatable flag or one value."""
    annotation = _without_none(annotation)
    origin = typing.get_origin(annotation)
    if annotation is bool:
        return {"action": "store_true" if is_negative else argparse.BooleanOptionalAction}
    if origin in (tuple, list) and not takes_one_value:
        return {"action": "append", "metavar": "VALUE"}
    if origin is typing.Literal:
        return {"choices": list(typing.get_args(annotation))}
    return {}  # one value, shown as the setting's name in capitals


def _without_none(annotation: Any) -> Any:
    """`X | None` -> X (and Annotated[X, ...] -> X)."""
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        members = [member for member in typing.get_args(annotation) if member is not type(None)]
        if len(members) == 1:
            return _without_none(members[0])
    return annotation
