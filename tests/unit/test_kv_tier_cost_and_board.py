"""The load-or-recompute cost model (measured means, seeded from a profile), the tier counters
in Redis (the board `pdserve status` prints) and the host tier index in the prefix index."""

import asyncio
import json

import pytest

from services.cli.status_command import print_tiers
from shared.cluster.keys import ClusterNamespace
from shared.cluster.prefix_index import PrefixIndex
from shared.cluster.tier_board import TierBoard
from shared.errors import ConfigurationError
from shared.kv_tier.cost import CostModel
from shared.kv_tier.cost_seeds import load_cost_seeds
from shared.kv_tier.stats import KVTierStats
from tests.helpers.redis_server import connect_async

NAMESPACE = ClusterNamespace("unit", "model")
A, B, C = (bytes([n]) * 32 for n in (1, 2, 3))


def test_loading_is_chosen_only_while_measured_cheaper_than_computing():
    model = CostModel({"host": 1e-3, "peer": 1e-3}, compute_seconds_per_token=1e-3, fixed_load_seconds={"peer": 0.05})
    assert model.decide({"host": 4}, block_size=16).load  # 4 ms against 64 ms
    assert not model.decide({"peer": 2}, block_size=16).load  # 52 ms against 32 ms: the round trip dominates
    assert model.decide({"peer": 8}, block_size=16).load  # 58 ms against 128 ms
    for _ in range(20):  # the machine got faster at computing (a GPU, or an idle host)
        model.record_compute(num_tokens=512, seconds=512 * 1e-5)
    assert not model.decide({"peer": 8}, block_size=16).load
    model.record_compute(num_tokens=8, seconds=100.0)  # a decode-sized step says nothing about prefill speed
    assert model.compute_seconds_per_token < 2e-5


def test_measured_loads_replace_the_seeds_then_move_their_means():
    model = CostModel({"peer": 1e-3}, 1e-3, fixed_load_seconds={"peer": 0.01})
    model.record_load("peer", num_blocks=10, seconds=0.032, fixed_seconds=0.002)  # the first measurement wins
    assert model.load_seconds_per_block("peer") == pytest.approx(3e-3)
    assert model.decide({"peer": 1}, 16).load_seconds == pytest.approx(0.002 + 3e-3)
    model.record_load("peer", num_blocks=10, seconds=0.012, fixed_seconds=0.002)  # then a weighted mean
    assert model.load_seconds_per_block("peer") == pytest.approx(0.8 * 3e-3 + 0.2 * 1e-3)


def test_cost_seeds_come_from_a_profiles_points(tmp_path):
    path = tmp_path / "profile.json"
    points = [{"tier": "host", "num_blocks": n, "seconds": 1e-4 * n} for n in (1, 4, 16)]
    points += [{"tier": "peer", "num_blocks": n, "seconds": 0.004 + 1e-3 * n} for n in (1, 4, 16)]
    path.write_text(json.dumps({"tier_loads": points, "prefill_fit": [0.01, 8e-4, 0.0]}))
    seeds = load_cost_seeds(str(path))
    assert seeds.tiers["host"].seconds_per_block == pytest.approx(1e-4)
    assert (seeds.tiers["peer"].fixed_seconds, seeds.tiers["peer"].seconds_per_block) == pytest.approx((0.004, 1e-3))
    assert seeds.compute_seconds_per_token == pytest.approx(0.01 / 512 + 8e-4)
    with pytest.raises(ConfigurationError, match="kv_cost_profile"):
        load_cost_seeds(str(tmp_path / "missing.json"))


def test_tier_counters_go_through_redis_to_pdserve_status(redis_server, capsys):
    host = KVTierStats("host", num_blocks=5, capacity_blocks=10, block_bytes=2**20, num_hits=7, num_loads=4,
                       load_seconds=0.002, recompute_avoided_tokens=64, num_load_decisions=2)
    peer = KVTierStats("peer", num_hits=3, num_misses=1, num_loads=3, load_seconds=0.03, num_recompute_decisions=1)

    async def scenario():
        client = connect_async(redis_server.url)
        board = TierBoard(client, NAMESPACE, ttl_s=5.0)
        await board.write("p0", [host, peer])
        found = await board.read(["p0", "d0"])
        await client.aclose()
        return found
    assert asyncio.run(scenario()) == {"p0": [host, peer]}
    print_tiers({"p0": [host, peer]})
    out = capsys.readouterr().out
    assert "KV tiers" in out and "5/10" in out and "0.50" in out and "2/0" in out and "10.00" in out


def test_a_host_tiers_entry_in_the_prefix_index(redis_server):
    async def scenario():
        client = connect_async(redis_server.url)
        index = PrefixIndex(client, NAMESPACE)
        await index.update_tier("tier-1", [A, B, C], [])
        await index.update_tier("tier-1", [], [B])
        runs = await index.longest_tier_prefix([A, B, C], ["tier-1", "tier-2"])
        await index.replace_tier("tier-2", [A, B])
        runs_after = await index.longest_tier_prefix([A, B, C], ["tier-1", "tier-2"])
        await client.aclose()
        return runs, runs_after
    assert asyncio.run(scenario()) == ({"tier-1": 1, "tier-2": 0}, {"tier-1": 1, "tier-2": 2})
