"""Gateway settings: flags win over PDSERVE_* variables, which win over the defaults."""

import argparse
import os

import pytest

from services.gateway.settings import GatewaySettings, add_arguments, env_name, settings_from_args
from shared.errors import ConfigurationError


@pytest.fixture(autouse=True)
def no_pdserve_variables(monkeypatch):
    for name in [name for name in os.environ if name.startswith("PDSERVE_")]:
        monkeypatch.delenv(name)


def parse(argv, environ):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.MonkeyPatch.context() as patch:
        for name, value in environ.items():
            patch.setenv(name, value)
        return settings_from_args(parser.parse_args(argv))


def test_defaults():
    assert parse([], {}) == GatewaySettings()
    assert GatewaySettings().port == 50051
    assert not hasattr(GatewaySettings(), "block_size")  # learned from the instances' registered settings


def test_env_then_flag_precedence():
    environ = {"PDSERVE_PORT": "6000", "PDSERVE_REDIS_URL": "redis://h:1/0", "PDSERVE_PREFER_COLOCATED": "1",
               "PDSERVE_ROUTING_CACHE_S": "0.25"}
    settings = parse(["--port", "0", "--ready-file", "/tmp/r.json"], environ)
    assert (settings.port, settings.redis_url, settings.prefer_colocated) == (0, "redis://h:1/0", True)
    assert (settings.routing_cache_s, settings.ready_file) == (0.25, "/tmp/r.json")


def test_bad_values_name_the_setting():
    with pytest.raises(ConfigurationError, match="^port: Input should be less than or equal to 65535"):
        parse(["--port", "70000"], {})
    with pytest.raises(ConfigurationError, match="^lease_s: Input should be a valid number"):
        parse([], {"PDSERVE_LEASE_S": "long"})
    assert env_name("--max-prefill-retries") == "PDSERVE_MAX_PREFILL_RETRIES"


def test_http_keep_alive_is_a_setting_with_a_long_default():
    assert GatewaySettings().http_keep_alive_s == 75.0
    assert parse([], {"PDSERVE_HTTP_KEEP_ALIVE_S": "120"}).http_keep_alive_s == 120.0
    assert parse(["--http-keep-alive-s", "30"], {"PDSERVE_HTTP_KEEP_ALIVE_S": "120"}).http_keep_alive_s == 30.0
    with pytest.raises(ConfigurationError, match="^http_keep_alive_s:"):
        parse(["--http-keep-alive-s", "0"], {})


def test_local_prefill_thresholds_are_flags_variables_and_config_keys(tmp_path):
    assert (GatewaySettings().local_prefill_max_tokens, GatewaySettings().prefill_busy_backlog) == (None, 2)
    settings = parse(["--local-prefill-max-tokens", "32"], {"PDSERVE_LOCAL_PREFILL_MAX_TOKENS": "8",
                                                             "PDSERVE_LOCAL_PREFILL_BUSY_MAX_TOKENS": "0"})
    assert (settings.local_prefill_max_tokens, settings.local_prefill_busy_max_tokens) == (32, 0)
    config = tmp_path / "gateway.toml"
    config.write_text("prefill_busy_backlog = 5\nlocal_prefill_max_tokens = 0\n")
    settings = parse(["--config", str(config)], {})
    assert (settings.prefill_busy_backlog, settings.placement_policy().max_local_tokens) == (5, 0)
    with pytest.raises(ConfigurationError, match="^local_prefill_max_tokens:"):
        parse(["--local-prefill-max-tokens", "-1"], {})
