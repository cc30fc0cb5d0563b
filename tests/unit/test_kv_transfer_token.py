"""A decode instance writes KV only from the sender presenting its reservation's random
token (ReserveResponse.transfer_token, relayed by the gateway in PrefillRequest): a
transfer with no token or a wrong one is rejected, writes nothing and leaves the
reservation waiting for the real sender. Real instances in-process, real UCX over loopback."""

import asyncio

import grpc

from tests.unit.test_instance_services import (  # noqa: F401 - fixtures
    TIMEOUT_S, decode_request, expect_status, fresh_ucx, greedy, offline, offline_output, prefill_and_decode,
    prefill_request, prompt_ids, reserve)


def test_a_transfer_without_the_reservations_token_writes_nothing(redis_server, tiny_llama_folder, offline):  # noqa: F811
    prompt = prompt_ids(35, 8)

    async def scenario():
        async with prefill_and_decode(tiny_llama_folder, redis_server.url) as (prefill, decode):
            reserved = await reserve(decode, "guarded", prompt, greedy(5))
            assert len(reserved.transfer_token) == 16
            kv_cache = decode.runtime.engine.transport.core.executor.kv_cache  # white box: a canary in the cache
            block_ids = list(reserved.block_ids)
            kv_cache[:, :, block_ids] = 7.0  # a canary: any write shows
            real = reserved.transfer_token
            last_byte_flipped = real[:-1] + bytes([real[-1] ^ 0xFF])  # never the real token (a fixed byte is, 1 in 256)
            for token in (b"", b"not-the-token-16", last_byte_flipped):
                request = prefill_request(reserved, "guarded", prompt, sampling=greedy(5), transfer_token=token)
                details = await expect_status(prefill.stub.Prefill(request, timeout=TIMEOUT_S), grpc.StatusCode.ABORTED)
                assert "transfer_token" in details
            assert bool((kv_cache[:, :, block_ids] == 7.0).all())
            prefilled = await prefill.stub.Prefill(prefill_request(reserved, "guarded", prompt, sampling=greedy(5)),
                                                   timeout=TIMEOUT_S)
            messages = [m async for m in decode.stub.Decode(decode_request("guarded", prefilled), timeout=TIMEOUT_S)]
            expected = offline_output(offline, prompt, temperature=0.0, max_tokens=5, ignore_eos=True)
            assert [t for m in messages for t in m.token_ids] == expected.token_ids
    asyncio.run(scenario())
