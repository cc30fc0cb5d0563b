"""Flags of EngineArgs fields for the commands that build an engine in this process (`pdserve
offline`, `pdserve profile`, the profiler's busy neighbour, the benchmarks through
benchmarks/engine_flags.py): each field's instance flag (`--num-threads`), type, choices and
description, generated from shared.engine_args.EngineArgs instead of written by hand. Unlike an
instance's flags (services.settings.flags) they read no PDSERVE_* variable or file: a
flag left out is the field's default, or the command's own.
"""

import argparse
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from shared.engine_args import EngineArgs

from services.settings.flags import argument_kind, flag_name

# The parsed namespace's attribute listing the EngineArgs fields this command has flags for.
ENGINE_FLAGS_DEST = "pdserve_engine_flags"


def add_engine_flags(parser: argparse.ArgumentParser, names: Iterable[str],
                     choices: Mapping[str, Sequence[str]] | None = None, **defaults: Any) -> None:
    """One flag per EngineArgs field in `names`; `choices` narrows a field's values, `defaults`
    overrides a field's default for this command (the help says which default applies)."""
    fields, names = EngineArgs.__pydantic_fields__, tuple(names)
    parser.set_defaults(**{ENGINE_FLAGS_DEST: (*(parser.get_default(ENGINE_FLAGS_DEST) or ()), *names)})
    for name in names:
        info = fields[name]
        default = defaults.get(name, info.default)
        kind = argument_kind(info.annotation, False, False)
        if "action" not in kind:
            kind["type"] = type(info.default) if isinstance(info.default, (int, float)) else str
        if name in (choices or {}):
            kind["choices"] = list(choices[name])
        help_text = f"{info.description} [default: {default!r}]".replace("%", "%%")
        parser.add_argument(flag_name(name), dest=name, default=default, help=help_text, **kind)


def engine_args_from(args: argparse.Namespace, **overrides: Any) -> EngineArgs:
    """EngineArgs from the engine flags add_engine_flags declared, then `overrides`;
    ConfigurationError naming a bad one."""
    given = {name: getattr(args, name) for name in getattr(args, ENGINE_FLAGS_DEST, ())}
    return EngineArgs.from_kwargs(**{**given, **overrides})
