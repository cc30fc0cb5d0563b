"""--kv-events-endpoint and its companions through an instance's front doors: flags,
PDSERVE_* variables (and so the settings file), into the engine's config; a bad endpoint is
refused naming the setting."""

import pytest

from services.instance.engine_setup import engine_config
from services.instance.flags import parse_settings
from shared.engine_args import EngineArgs
from shared.errors import ConfigurationError


def test_a_variable_and_flags_reach_the_engine_config(monkeypatch):
    monkeypatch.setenv("PDSERVE_KV_EVENTS_ENDPOINT", "tcp://*:5557")
    settings = parse_settings("x", ("decode",), ["--kv-events-topic", "kv@p@m", "--kv-events-format", "map"])
    config = engine_config(settings).kv_events
    assert (config.endpoint, config.topic, config.wire_format, config.binds) == ("tcp://*:5557", "kv@p@m", "map", True)


def test_no_endpoint_means_no_events_and_a_bad_one_is_refused_by_name():
    assert EngineArgs().create_engine_config().kv_events is None
    with pytest.raises(ConfigurationError, match="^kv_events_endpoint: must start with one of"):
        EngineArgs.from_kwargs(kv_events_endpoint="localhost:5557")
