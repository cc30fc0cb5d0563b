"""`pdserve profile --quick` on the tiny model, and the profile's fits and JSON round trip."""

import pytest

from shared.engine_args import EngineArgs
from shared.kv_tier.cost_seeds import load_cost_seeds

from services.instance.engine_setup import build_engine_probe
from services.cost_model.perf_profile import DecodePoint, PerfProfile, PrefillPoint, TransferPoint
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


def test_transfer_fit_and_defaults():
    profile = make_profile()
    assert profile.kv_transfer_s(512) is None and profile.colocated_slowdown == 1.0
    with_transfer = PerfProfile(**{**profile.__dict__, "transfer": [TransferPoint(n, 0.002 + 1e-5 * n)
                                                                    for n in (64, 256, 1024)], "transfer_fit": []})
    assert with_transfer.kv_transfer_s(512) == pytest.approx(0.002 + 512e-5, rel=1e-6)
    with pytest.raises(ValueError, match="colocated_slowdown"):
        PerfProfile(**{**profile.__dict__, "colocated_slowdown": 0.5})


def test_json_round_trip(tmp_path):
    profile = PerfProfile(**{**make_profile().__dict__, "transfer": [TransferPoint(64, 0.003), TransferPoint(512, 0.01)],
                             "colocated_slowdown": 1.3, "host_cores": 2})
    profile.save(tmp_path / "p.json")
    loaded = PerfProfile.load(tmp_path / "p.json")
    assert loaded == profile


def test_loading_refits_from_the_points(tmp_path):
    profile = make_profile()
    stale = PerfProfile(**{**profile.__dict__, "prefill_fit": [1.0, 0.0, 0.0], "decode_fit": [2.0, 0.0, 0.0]})
    stale.save(tmp_path / "p.json")
    loaded = PerfProfile.load(tmp_path / "p.json")
    assert loaded.prefill_fit == pytest.approx(profile.prefill_fit)
    assert loaded.decode_fit == pytest.approx(profile.decode_fit)


def test_prefill_is_fitted_on_relative_error():
    # Seconds of a 1-thread SmolLM2 prefill (this CPU, emulated bf16): an absolute least-squares
    # fit is pulled by the long prompts' seconds and puts 16 tokens ~50% high; the relative fit
    # keeps every point within 10%.
    seconds = {16: 0.19, 32: 0.31, 64: 0.653, 128: 1.207, 256: 2.325, 512: 4.407, 1024: 10.958}
    points = [PrefillPoint(n, 0, s) for n, s in seconds.items()]
    profile = PerfProfile(**{**make_profile().__dict__, "prefill": points, "prefill_fit": []})
    for n, measured in seconds.items():
        assert profile.prefill_s(n) == pytest.approx(measured, rel=0.1)


def tiny_engine_args(folder) -> EngineArgs:
    return EngineArgs(model=str(folder), dtype="float32", num_blocks=64)


def assert_every_block_free(probe) -> None:
    load = probe.load()
    assert load.num_free_blocks == load.num_total_blocks
    assert load.num_waiting == load.num_running == load.num_reserved == 0


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
    assert [p.prompt_tokens for p in profile.transfer] == [16, 64]  # over UCX on loopback
    assert all(p.seconds > 0 for p in profile.transfer) and profile.kv_transfer_s(64) > 0
    assert [(p.tier, p.num_blocks) for p in profile.tier_loads] == [("host", 1), ("host", 4), ("file", 1), ("file", 4),
                                                                    ("peer", 1), ("peer", 4)]
    seeds = load_cost_seeds(str(output))  # what an instance's --kv-cost-profile reads
    assert set(seeds.tiers) == {"host", "file", "peer"} and seeds.compute_seconds_per_token > 0
    assert all(cost.seconds_per_block > 0 for cost in seeds.tiers.values())
    out = capsys.readouterr().out
    assert "KV capacity" in out and "KV transfer of 512 tokens" in out


def test_colocated_slowdown_beside_a_real_busy_neighbour(tiny_llama_folder):
    from dataclasses import replace

    from services.planner.profiler import QUICK_PLAN, Profiler, neighbour_command_for

    plan = replace(QUICK_PLAN, transfer=None, colocated_prompts=(32, 64), colocated_decode=((4, 16),))
    probe = build_engine_probe(tiny_engine_args(tiny_llama_folder))
    profile = Profiler(probe, plan).run("tiny", "float32", 1, neighbour_command_for(str(tiny_llama_folder),
                                                                                   "float32", 1, 64))
    assert profile.colocated_slowdown >= 1.0 and profile.host_cores >= 1 and profile.transfer == []
    assert_every_block_free(probe)


def test_a_neighbour_that_dies_is_reported(tiny_llama_folder):
    import sys
    from dataclasses import replace

    from services.planner.profiler import QUICK_PLAN, Profiler

    plan = replace(QUICK_PLAN, transfer=None, colocated_prompts=(32,))
    probe = build_engine_probe(tiny_engine_args(tiny_llama_folder))
    with pytest.raises(RuntimeError, match="exited before it was ready"):
        Profiler(probe, plan).run("tiny", "float32", 1, [sys.executable, "-c", "pass"])


def test_profiling_returns_every_kv_block(tiny_llama_folder):
    from services.planner.profiler import QUICK_PLAN, Profiler

    probe = build_engine_probe(tiny_engine_args(tiny_llama_folder))
    Profiler(probe, QUICK_PLAN).run("tiny", "float32", None)
    assert_every_block_free(probe)
