"""The gateway and the cache settings instances register (fake instances in a real Redis):
it pairs only a prefill and a decode instance whose settings agree, logs each mismatched
pair once and counts it in its metrics, fails with UNAVAILABLE naming the mismatch when no
pair agrees, hashes a prompt with each instance's own recipe for the prefix lookup, and
passes the decode instance's num_skip_blocks on to the prefill instance."""

import asyncio
import logging

import grpc
import pytest

from shared.cluster.versions import KV_PROTOCOL_VERSION, PDSERVE_VERSION, UNREGISTERED_PROTOCOL
from shared.kv_cache.block_hash import HashRecipe, prompt_block_hashes
from tests.unit.conftest_tokenizer import smollm2_tokenizer  # noqa: F401 - fixture
from tests.unit.gateway_fakes import Behaviour, FakeInstance
from tests.unit.metrics_scrape import scrape, value
from tests.unit.test_gateway_service import (  # noqa: F401 - fixture
    MODEL_NAME, PROMPT_IDS, collect, gateway, generate_request, model, run)


def pairing_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().endswith("never paired")]


def test_mismatched_instances_are_never_paired_and_each_pair_is_logged_once(redis_server, model, caplog):  # noqa: F811
    caplog.set_level(logging.WARNING, logger="services.gateway.pairing")

    async def scenario():
        async with gateway(redis_server.url, model, metrics_port=0) as gate:
            # p0 and d0 rank first (instance id) but agree with no instance of the other role.
            p0, p1 = FakeInstance("p0", "prefill", dtype="float32"), FakeInstance("p1", "prefill")
            d0, d1 = FakeInstance("d0", "decode", block_size=32), FakeInstance("d1", "decode")
            await gate.add(p0, p1, d0, d1)
            for request_id in ("r1", "r2"):
                request = generate_request(max_tokens=3)
                request.request_id = request_id
                assert [t for m in await collect(gate.stub.Generate(request)) for t in m.token_ids] == [42, 43, 44]
            assert (p0.methods(), d0.methods()) == ([], [])
            assert p1.methods() == ["StreamPrefill"] * 2 and d1.methods() == ["Reserve", "Decode"] * 2
            samples = await asyncio.to_thread(scrape, gate.server.metrics_address)
            assert value(samples, "pdserve:gateway_live_incompatible_pairs") == 3  # all but p1/d1
            assert value(samples, "pdserve:gateway_incompatible_pairs_total") == 3
        assert sorted(pairing_warnings(caplog)) == [
            "prefill p0 and decode d0 differ in cache settings (block_size 16 != 32, dtype float32 != bfloat16): "
            "never paired",
            "prefill p0 and decode d1 differ in cache settings (dtype float32 != bfloat16): never paired",
            "prefill p1 and decode d0 differ in cache settings (block_size 16 != 32): never paired"]
    run(scenario)


def test_no_agreeing_pair_is_unavailable_naming_the_mismatch(redis_server, model):  # noqa: F811
    async def scenario():
        async with gateway(redis_server.url, model) as gate:
            p0, d0 = FakeInstance("p0", "prefill"), FakeInstance("d0", "decode", prefix_hash_algo="blake2b")
            await gate.add(p0, d0)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await collect(gate.stub.Generate(generate_request()))
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
            assert caught.value.details() == (
                "no prefill and decode instance can pair: prefill p0 and decode d0 differ in cache settings "
                "(prefix_hash_algo sha256 != blake2b), and no live colocated instance is registered")
            assert (p0.methods(), d0.methods()) == ([], [])
    run(scenario)


def test_the_prefix_lookup_hashes_the_prompt_as_each_instance_does(redis_server, model):  # noqa: F811
    async def scenario():
        async with gateway(redis_server.url, model) as gate:
            fakes = [FakeInstance("p0", "prefill"), FakeInstance("p1", "prefill", prefix_hash_algo="blake2b"),
                     FakeInstance("d0", "decode"), FakeInstance("d1", "decode", prefix_hash_algo="blake2b")]
            await gate.add(*fakes)
            p0, p1, d0, d1 = fakes
            blake2b_hashes = prompt_block_hashes(PROMPT_IDS, HashRecipe(MODEL_NAME, 16, "blake2b"))
            await gate.index.add("d1", blake2b_hashes[:2])
            await gate.index.add("d0", blake2b_hashes)  # not how d0 hashes: counts for nothing
            await collect(gate.stub.Generate(generate_request()))
            assert (d0.methods(), d1.methods()) == ([], ["Reserve", "Decode"])
            assert (p0.methods(), p1.methods()) == ([], ["StreamPrefill"])  # the only prefill d1 pairs with
            assert gate.stats.routing["decode:prefix"] == 1
    run(scenario)


def test_the_prefill_skips_the_blocks_the_decode_instance_says_it_holds(redis_server, model):  # noqa: F811
    async def scenario():
        async with gateway(redis_server.url, model) as gate:
            # 48 cached tokens would be 3 blocks of 16 or 1 of 32: the decode instance's count wins.
            held = Behaviour(num_cached_prompt_tokens=48, num_skip_blocks=1)
            p0, d0 = FakeInstance("p0", "prefill", block_size=32), FakeInstance("d0", "decode", held, block_size=32)
            await gate.add(p0, d0)
            await collect(gate.stub.Generate(generate_request()))
            assert p0.requests_of("StreamPrefill")[0].num_skip_blocks == 1
    run(scenario)


def test_instances_of_two_kv_protocol_versions_run_side_by_side_and_are_never_paired(  # noqa: F811
        redis_server, model, caplog):
    """A rolling upgrade: old (protocol 1, pdserve 0.0.9) and new instances of both roles are
    live at once; each request goes to a same-version pair, mixed pairs are logged once and
    counted, and an instance that registered no protocol (an older release) pairs with nobody."""
    caplog.set_level(logging.WARNING, logger="services.gateway.pairing")
    old = {"kv_protocol_version": 1, "pdserve_version": "0.0.9"}

    async def scenario():
        async with gateway(redis_server.url, model, metrics_port=0) as gate:
            # The old ones sort first by instance id, so the router would pick them first.
            p_old, d_old = FakeInstance("p0-old", "prefill", versions=old), FakeInstance("d0-old", "decode", versions=old)
            p_new, d_new = FakeInstance("p1-new", "prefill"), FakeInstance("d1-new", "decode")
            await gate.add(p_old, d_old, p_new, d_new)
            for request_id in ("r1", "r2", "r3"):
                request = generate_request(max_tokens=3)
                request.request_id = request_id
                assert [t for m in await collect(gate.stub.Generate(request)) for t in m.token_ids] == [42, 43, 44]
            pairs = {(p.instance_id, d.instance_id) for p in (p_old, p_new) for d in (d_old, d_new)
                     for call, message in d.calls if call == "Decode"
                     if any(name == "StreamPrefill" and m.request_id == message.request_id for name, m in p.calls)}
            assert pairs <= {("p0-old", "d0-old"), ("p1-new", "d1-new")} and pairs
            samples = await asyncio.to_thread(scrape, gate.server.metrics_address)
            assert value(samples, "pdserve:gateway_live_incompatible_pairs") == 2
            assert value(samples, "pdserve:gateway_incompatible_pairs_total") == 2
        warnings = sorted(pairing_warnings(caplog))
        assert warnings == [
            f"prefill p0-old and decode d1-new differ in KV protocol version (1 != {KV_PROTOCOL_VERSION}; "
            f"pdserve 0.0.9 != {PDSERVE_VERSION}): never paired",
            f"prefill p1-new and decode d0-old differ in KV protocol version ({KV_PROTOCOL_VERSION} != 1; "
            f"pdserve {PDSERVE_VERSION} != 0.0.9): never paired"]
    run(scenario)


def test_an_instance_without_a_registered_protocol_pairs_with_nobody(redis_server, model):  # noqa: F811
    async def scenario():
        async with gateway(redis_server.url, model) as gate:
            p0 = FakeInstance("p0", "prefill", versions={"kv_protocol_version": UNREGISTERED_PROTOCOL,
                                                         "pdserve_version": ""})
            d0 = FakeInstance("d0", "decode")
            await gate.add(p0, d0)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await collect(gate.stub.Generate(generate_request()))
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "differ in KV protocol version (unregistered != " in caught.value.details()
            assert (p0.methods(), d0.methods()) == ([], [])
    run(scenario)
