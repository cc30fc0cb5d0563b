"""One settings system for every pdserve process, on pydantic-settings.

A settings class (a ServiceSettings) declares each setting as a field with a description.
`load_settings` fills it from, highest precedence first:

    1. command-line flags     --kv-cache-memory-gb 2           (services.settings.flags)
    2. environment variables  PDSERVE_KV_CACHE_MEMORY_GB=2     (the class's prefix + the name)
    3. a TOML settings file   --config FILE  holding  kv_cache_memory_gb = 2
    4. the documented default

A field marked SETTINGS_GROUP holds a group of settings (a pydantic dataclass such as
shared.engine_args.EngineArgs, nested in InstanceSettings as `engine`): each setting of the
group is still a flag, a variable and a file key of its own, flat (`--block-size`,
PDSERVE_BLOCK_SIZE, `block_size = 16`), and so is a keyword of the constructor
(`InstanceSettings(block_size=8)` fills `settings.engine.block_size`).
A field marked `settings_group(only, ...)` holds some of its class's settings only, under
variables of its own prefix: `pdserve up` takes the engine settings it passes on to every
instance that way (`UpSettings.engine`, variables PDSERVE_MODEL, ... as the instances').

Constructing a settings class directly (`InstanceSettings(role="prefill")`, as tests and
benchmarks do) reads neither the environment nor a file: only its arguments and the defaults.
Either way an invalid value raises ConfigurationError naming the setting.
"""

import contextvars
import dataclasses
import os
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict,
                               TomlConfigSettingsSource)

from shared.errors import ConfigurationError, InvalidRequestError

from services.rpc.bounded_text import bounded

ENV_PREFIX = "PDSERVE_"
# json_schema_extra of a field holding a group of settings, each a setting of its own (above); the
# group's class lists them in `setting_names()` and describes them in its own fields.
SETTINGS_GROUP = {"settings": "group"}


def comma_separated(value: Any) -> Any:
    """A list setting given as one string (an environment variable, a settings file) may be comma
    separated: "a, b," -> ("a", "b"). Any other value is left to the field's own validation."""
    if isinstance(value, str):
        return tuple(item.strip() for item in value.split(",") if item.strip())
    return value


def settings_group(only: Iterable[str], env_prefix: str = ENV_PREFIX,
                   env_names: Mapping[str, str] | None = None) -> dict[str, Any]:
    """json_schema_extra of a field holding the settings `only` of its group's class, each read
    from the variable `env_prefix` + its name, or the one `env_names` gives it."""
    return {**SETTINGS_GROUP, "only": list(only), "env_prefix": env_prefix, "env_names": dict(env_names or {})}


def _is_group(info: FieldInfo) -> bool:
    extra = info.json_schema_extra
    return isinstance(extra, dict) and extra.get("settings") == SETTINGS_GROUP["settings"]


def _group_settings(info: FieldInfo) -> tuple[str, ...]:
    """The names of the settings a group field holds."""
    return tuple(info.json_schema_extra.get("only") or info.annotation.setting_names())


@dataclass(frozen=True)
class _Load:
    """What `load_settings` adds to a construction: the environment and maybe a file."""
    config_file: Path | None
    # Keys the file may hold for other settings classes read from the same command line.
    other_keys: frozenset[str]


_LOADING: contextvars.ContextVar[_Load | None] = contextvars.ContextVar("pdserve_settings_load", default=None)


class ServiceSettings(BaseSettings):
    """Base of every settings class: frozen, unknown names refused, PDSERVE_* variables."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_ignore_empty=True, extra="forbid",
                                      frozen=True, validate_by_name=True, validate_default=True)

    def __init__(self, **values: Any):
        try:
            super().__init__(**values)
        except ValidationError as error:
            raise configuration_error(error, type(self)) from None

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                   file_secret_settings):
        load = _LOADING.get()
        if load is None:
            return (init_settings,)
        environment = (env_settings, _GroupEnvironment(settings_cls))
        if load.config_file is None:
            return init_settings, *environment
        return init_settings, *environment, _SettingsFile(settings_cls, load.config_file, load.other_keys)

    @classmethod
    def env_name(cls, name: str) -> str:
        """The environment variable of setting `name`."""
        alias = cls.setting_fields()[name].validation_alias
        if isinstance(alias, str):
            return alias
        for info in cls.model_fields.values():
            if _is_group(info) and name in _group_settings(info):
                extra = info.json_schema_extra
                prefix = extra.get("env_prefix", cls.model_config["env_prefix"])
                return extra.get("env_names", {}).get(name) or prefix + name.upper()
        return cls.model_config["env_prefix"] + name.upper()

    @classmethod
    def setting_fields(cls) -> dict[str, FieldInfo]:
        """Every setting, in order: the class's own fields, each group's settings in its place."""
        settings = {}
        for name, info in cls.model_fields.items():
            if not _is_group(info):
                settings[name] = info
                continue
            group_fields = info.annotation.__pydantic_fields__
            settings.update((setting, group_fields[setting]) for setting in _group_settings(info))
        return settings

    @classmethod
    def settings_groups(cls) -> dict[str, tuple[str, ...]]:
        """Each group field's name -> the names of its settings."""
        return {name: _group_settings(info) for name, info in cls.model_fields.items() if _is_group(info)}

    @model_validator(mode="before")
    @classmethod
    def _nest_groups(cls, values: Any) -> Any:
        """Flat settings of a group (from the constructor, flags, variables or the file) go into
        the group's field, over what that field was given."""
        if not isinstance(values, dict):
            return values
        values = dict(values)
        for group, names in cls.settings_groups().items():
            given = {name: values.pop(name) for name in names if name in values}
            if not given:
                continue
            base = values.get(group)
            if dataclasses.is_dataclass(base):
                base = {field.name: getattr(base, field.name) for field in dataclasses.fields(base)}
            values[group] = {**(base or {}), **given}
        return values


def load_settings(settings_cls: type[ServiceSettings], flags: Mapping[str, Any],
                  config_file: str | Path | None = None, other_keys: Iterable[str] = ()) -> ServiceSettings:
    """`flags` (the settings given on the command line) over the environment over the file.

    `other_keys`: settings of other classes read from the same command line, which the file
    may hold too. Raises ConfigurationError naming the first bad setting.
    """
    path = None if config_file in (None, "") else Path(config_file)
    if path is not None and not path.is_file():
        raise ConfigurationError("config", f"no settings file at {path}")
    token = _LOADING.set(_Load(path, frozenset(other_keys)))
    try:
        return settings_cls(**flags)
    finally:
        _LOADING.reset(token)


class _GroupEnvironment(PydanticBaseSettingsSource):
    """The PDSERVE_* variables of the groups' settings (pydantic-settings reads those of the
    class's own fields); values stay strings for the group's validation, empty ones unset."""

    def __call__(self) -> dict[str, Any]:
        environ = {name.upper(): value for name, value in os.environ.items()}
        names = (name for group in self.settings_cls.settings_groups().values() for name in group)
        values = {name: environ.get(self.settings_cls.env_name(name).upper()) for name in names}
        return {name: value for name, value in values.items() if value}

    def get_field_value(self, field, field_name):  # __call__ reads every variable at once
        return None, field_name, False


class _SettingsFile(TomlConfigSettingsSource):
    """A TOML file of `name = value` lines; a name no class on the command line knows is refused."""

    def __init__(self, settings_cls: type[ServiceSettings], path: Path, other_keys: frozenset[str]):
        try:
            super().__init__(settings_cls, toml_file=path)
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
            raise ConfigurationError("config", f"{path} is not valid TOML: {error}") from None
        unknown = sorted(set(self.toml_data) - set(settings_cls.setting_fields()) - other_keys)
        if unknown:
            raise ConfigurationError(unknown[0], f"is not a setting (in {path})")
        self.init_kwargs = {key: value for key, value in self.init_kwargs.items() if key not in other_keys}


def configuration_error(error: ValidationError, settings_cls: type[ServiceSettings]) -> ConfigurationError:
    """pydantic's first complaint as a ConfigurationError naming the setting (never echoing a
    secret's value)."""
    first = error.errors(include_url=False)[0]
    cause = first.get("ctx", {}).get("error")
    if isinstance(cause, (InvalidRequestError, ConfigurationError)):
        return ConfigurationError(cause.field, cause.message)
    field = _field_name(settings_cls, first["loc"]) or settings_cls.__name__
    if first["type"] == "extra_forbidden":
        return ConfigurationError(field, "is not a setting")
    message = first["msg"].removeprefix("Value error, ")
    info = settings_cls.setting_fields().get(field)
    if info is not None and not info.repr:
        return ConfigurationError(field, message)
    return ConfigurationError(field, f"{message}, got {bounded(repr(first['input']), 200)}")


def _field_name(settings_cls: type[ServiceSettings], loc: tuple) -> str:
    """The setting's name for an error location, which may be the setting's alias."""
    if not loc:
        return ""
    if loc[0] in settings_cls.settings_groups() and len(loc) > 1:
        return str(loc[1])
    for name, info in settings_cls.model_fields.items():
        if info.validation_alias == loc[0]:
            return name
    return str(loc[0])
