"""Speculative decoding settings: engine config, service flags and env variables, statistics."""

import pytest

from services.instance.engine_setup import engine_config
from services.instance.flags import parse_settings
from services.instance.settings import InstanceSettings
from shared.engine_args import EngineArgs
from shared.errors import ConfigurationError, InvalidRequestError
from shared.sampling.params import SamplingParams
from shared.spec_decode.config import SpeculativeConfig
from shared.spec_decode.stats import SpecDecodeStats


@pytest.mark.parametrize("kwargs, field", [
    (dict(speculative_method="medusa"), "speculative_method"),
    (dict(num_speculative_tokens=0), "num_speculative_tokens"),
    (dict(num_speculative_tokens=17), "num_speculative_tokens"),
    (dict(speculative_method="draft"), "draft_num_layers"),
    (dict(draft_num_layers=0), "draft_num_layers"),
    (dict(ngram_min=3, ngram_max=2), "ngram_min"),
])
def test_bad_settings_name_the_field(kwargs, field):
    with pytest.raises(ConfigurationError) as error:
        SpeculativeConfig(**kwargs)
    assert error.value.field == field


def test_offline_keyword_arguments_reach_the_speculative_section():
    config = EngineArgs.from_kwargs(model=None, dtype="float32", speculative_method="draft", draft_num_layers=4,
                                    num_speculative_tokens=5).create_engine_config()
    assert config.speculative == SpeculativeConfig("draft", 5, None, 4)
    with pytest.raises(ConfigurationError, match="^num_speculative_tokens"):
        EngineArgs.from_kwargs(model=None, dtype="float32", speculative_method="ngram", num_speculative_tokens=99)


def test_decode_flags_and_environment_configure_speculation(monkeypatch):
    monkeypatch.setenv("PDSERVE_NUM_SPECULATIVE_TOKENS", "4")
    settings = parse_settings("x", ("decode", "colocated"),
                              ["--speculative-method", "draft", "--draft-num-layers", "6"])
    assert engine_config(settings).speculative == SpeculativeConfig("draft", 4, None, 6)
    assert engine_config(InstanceSettings()).speculative.speculative_method == "none"


def test_prefill_instances_ignore_speculation():
    settings = InstanceSettings(role="prefill", speculative_method="ngram")
    assert engine_config(settings).speculative.speculative_method == "none"


def test_bad_flags_name_the_setting():
    with pytest.raises(ConfigurationError, match="^speculative_method"):
        InstanceSettings(speculative_method="eagle")
    with pytest.raises(ConfigurationError, match="^draft_num_layers"):
        InstanceSettings(speculative_method="draft")


def test_use_speculation_must_be_a_bool():
    with pytest.raises(InvalidRequestError, match="^use_speculation: must be true or false, got 1"):
        SamplingParams(use_speculation=1)


def test_stats_count_drafts_tokens_and_positions():
    stats = SpecDecodeStats()
    stats.record(3, 2)
    stats.record(3, 0)
    stats.record(1, 1)
    stats.record(0, 0)  # no proposal: not a draft
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (3, 7, 3)
    assert stats.accepted_per_position == [2, 1] and stats.proposed_per_position == [3, 2, 2]
    assert stats.acceptance_rate_per_position() == [2 / 3, 1 / 2, 0.0]
    assert stats.acceptance_rate == 3 / 7 and stats.mean_accepted_per_draft == 1.0
