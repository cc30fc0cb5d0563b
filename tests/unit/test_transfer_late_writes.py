"""A transfer that arrives after its request was withdrawn (the client aborted, the reservation
was freed, its blocks perhaps given to another request) writes nothing and is counted
(KVReceiver.late_writes_refused, the decode instance's `pdserve:kv_transfer_late_writes_refused_total`).
Real UCX over loopback."""

import asyncio

import pytest
import torch

from shared.kv_cache.layout import KVCacheLayout
from shared.kv_transfer.ucx.lifecycle import reset_ucx
from shared.kv_transfer.ucx.protocol import KVTransferRejected
from shared.kv_transfer.ucx.transport import KVReceiver, KVSender

LAYOUT = KVCacheLayout(num_layers=2, num_blocks=8, block_size=16, num_kv_heads=2, head_dim=64, dtype=torch.float32)
BLOCKS = [1, 2, 3]


@pytest.fixture(autouse=True)
def fresh_ucx():
    yield
    reset_ucx()


def test_a_transfer_for_a_withdrawn_request_writes_nothing_and_is_counted():
    async def scenario():
        receive_cache = LAYOUT.allocate().fill_(7.0)  # a canary: any write shows
        receiver = KVReceiver(receive_cache, LAYOUT)
        address = await receiver.start()
        sender = KVSender()
        try:
            receiver.expect("aborted", BLOCKS)
            receiver.withdraw("aborted", "was aborted by its client")
            with pytest.raises(KVTransferRejected, match="request_id"):
                await sender.send(address, "aborted", LAYOUT.allocate().normal_(), LAYOUT, BLOCKS, BLOCKS)
        finally:
            await sender.close()
            await receiver.close()
        return receive_cache, receiver.late_writes_refused

    cache, refused = asyncio.run(scenario())
    assert bool((cache == 7.0).all())
    assert (refused.not_expected, refused.withdrawn, refused.superseded, refused.total) == (1, 0, 0, 1)
