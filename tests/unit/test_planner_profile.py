"""`pdserve profile --quick` on the tiny model, and the profile's fits and JSON round trip."""

import pytest

from services.planner.profile_data import DecodePoint, PerfProfile, PrefillPoint
from services.cli.main import main


def make_profile() -> PerfProfile:
    prefill = [PrefillPoint(n, 0, 0.01 + 0.001 * n) for n in (64, 128, 256, 512)]
    decode = [DecodePoint(b, c, 0.02 + 0.001 * b + 1e-5 * b * c) for b in (1, 8, 32) for c in (128, 512)]
    return PerfProfile(model="m", dtype="bfloat16", num_threads=2, block_size=16, kv_capacity_tokens=20000,
                       prefill=prefill, decode=decode)


def test_fits_recover_linear_costs():
    profile = make_profile()
    assert profile.prefill_s(300) == pytest.approx(0.31, rel=1e-6)
    assert profile.prefill_s(300, cached_tokens=200) == pytest.approx(0.11, rel=1e-6)
    assert profile.decode_step_s(16, 256) == pytest.approx(0.02 + 0.016 + 1e-5 * 16 * 256, rel=1e-6)


def test_json_round_trip(tmp_path):
    profile = make_profile()
    profile.save(tmp_path / "p.json")
    loaded = PerfProfile.load(tmp_path / "p.json")
    assert loaded == profile


def test_quick_profile_of_the_tiny_model(tiny_llama_folder, tmp_path, capsys):
    output = tmp_path / "profile.json"
    assert main(["profile", "--quick", "--model", str(tiny_llama_folder), "--dtype", "float32",
                 "--kv-cache-memory-gb", "0.01", "--output", str(output)]) == 0
    profile = PerfProfile.load(output)
    assert [p.prompt_tokens for p in profile.prefill if p.cached_tokens == 0] == [8, 16, 32, 64]
    assert [(p.prompt_tokens, p.cached_tokens) for p in profile.prefill if p.cached_tokens] == [(64, 32)]
    assert {(p.batch_size, p.context_tokens) for p in profile.decode} == {(b, c) for b in (1, 4, 8) for c in (16, 48)}
    assert all(p.seconds > 0 for p in profile.prefill + profile.decode)
    assert profile.kv_capacity_tokens > 0 and profile.kv_capacity_tokens % profile.block_size == 0
    assert "KV capacity" in capsys.readouterr().out


def test_profiling_returns_every_kv_block(tiny_llama_folder):
    from services.planner.profiler import QUICK_PLAN, Profiler
    from shared.engine.llm import engine_config_from_kwargs
    from shared.engine.llm_engine import LLMEngine

    engine = LLMEngine.from_config(engine_config_from_kwargs(str(tiny_llama_folder), "float32", num_blocks=64))
    Profiler(engine, QUICK_PLAN).run("tiny", "float32", None)
    assert engine.block_pool.num_free_blocks == engine.block_pool.num_blocks
    assert not engine.has_unfinished_requests()
