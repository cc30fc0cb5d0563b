"""LeaseTable (local records with their expiry on an injected clock; the engine's scheduler times
the reservations out) and its best-effort Redis mirror."""

import asyncio

import pytest

from shared.cluster.keys import ClusterNamespace
from shared.cluster.lease_mirror import LeaseMirror, list_mirrored_leases
from shared.cluster.leases import BlockLeaseRecord, LeaseTable
from shared.errors import InternalError, InvalidRequestError
from tests.helpers.redis_server import connect_async

NAMESPACE = ClusterNamespace("test", "smollm2")


class FakeClock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_lease_expires_exactly_at_grant_time_plus_ttl():
    table = LeaseTable("d0", clock=FakeClock(100.0))
    lease = table.grant("req-1", [4, 5, 6], ttl_s=5.0)
    assert lease == BlockLeaseRecord("req-1", "d0", (4, 5, 6), 105.0)
    assert table.get("req-1") == lease and len(table) == 1
    assert table.release("req-1") == lease
    assert table.get("req-1") is None and len(table) == 0
    assert table.release("req-1") is None


def test_renew_moves_the_expiry_to_now_plus_the_new_ttl():
    clock = FakeClock(100.0)
    table = LeaseTable("d0", clock=clock)
    table.grant("req-1", [4, 5], ttl_s=5.0)
    clock.now = 104.0
    assert table.renew("req-1", ttl_s=5.0) == BlockLeaseRecord("req-1", "d0", (4, 5), 109.0)
    assert table.get("req-1").expires_at == 109.0
    assert table.renew("never-granted", ttl_s=5.0) is None
    with pytest.raises(InvalidRequestError, match="ttl_s"):
        table.renew("req-1", ttl_s=0)


def test_released_blocks_can_be_leased_again_but_not_double_leased():
    table = LeaseTable("d0", clock=FakeClock(0.0))
    table.grant("req-1", [1, 2], ttl_s=1.0)
    with pytest.raises(InternalError,
                       match=r"^block_ids: already leased \(block -> request\): \{2: 'req-1'\}"):
        table.grant("req-2", [2, 3], ttl_s=1.0)
    assert table.get("req-2") is None
    table.release("req-1")
    assert table.grant("req-2", [2, 3], ttl_s=1.0).block_ids == (2, 3)


@pytest.mark.parametrize("request_id, block_ids, ttl_s, field", [
    ("", [1], 1.0, "request_id"),
    ("req-1", [9], 1.0, "request_id"),  # already holds a lease
    ("req-2", [], 1.0, "block_ids"),
    ("req-2", [3, 3], 1.0, "block_ids"),
    ("req-2", [-1], 1.0, "block_ids"),
    ("req-2", [True], 1.0, "block_ids"),
    ("req-2", [3], 0.0, "ttl_s"),
    ("req-2", [3], float("inf"), "ttl_s"),
])
def test_bad_grants_name_the_field(request_id, block_ids, ttl_s, field):
    """Request ids and leases come from requests; the blocks from the engine (a bug if wrong)."""
    table = LeaseTable("d0", clock=FakeClock(0.0))
    table.grant("req-1", [1], ttl_s=1.0)
    with pytest.raises(InternalError if field == "block_ids" else InvalidRequestError) as caught:
        table.grant(request_id, block_ids, ttl_s)
    assert str(caught.value).startswith(f"{field}: ")


def test_leases_are_mirrored_into_redis_with_ttl_and_removed_on_release(redis_server):
    async def scenario():
        client = connect_async(redis_server.url)
        mirror = LeaseMirror(client, NAMESPACE)
        table = LeaseTable("d0", clock=FakeClock(0.0), mirror=mirror)
        table.grant("req-1", [4, 5], ttl_s=30.0)
        table.grant("req-2", [6], ttl_s=0.3)
        table.grant("req-3", [7], ttl_s=30.0)
        table.release("req-3")
        await mirror.flush()
        leases = await list_mirrored_leases(client, NAMESPACE)
        assert [(lease.request_id, lease.block_ids) for lease in leases] == [
            ("req-1", (4, 5)), ("req-2", (6,))]
        assert 29.0 < leases[0].remaining_s <= 30.0
        await asyncio.sleep(0.4)  # req-2's key expires in Redis by itself
        remaining = await list_mirrored_leases(client, NAMESPACE)
        assert [(lease.request_id, lease.instance_id, lease.block_ids)
                for lease in remaining] == [("req-1", "d0", (4, 5))]
        assert await list_mirrored_leases(client, ClusterNamespace("other", "smollm2")) == []
        await mirror.close()
        await client.aclose()

    asyncio.run(scenario())


def test_redis_outage_never_reaches_the_lease_table(redis_server):
    async def scenario():
        client = connect_async(redis_server.url)
        mirror = LeaseMirror(client, NAMESPACE, op_timeout_s=1.0)
        table = LeaseTable("d0", clock=FakeClock(0.0), mirror=mirror)
        redis_server.stop()
        lease = table.grant("req-1", [1], ttl_s=5.0)
        assert table.release("req-1") == lease
        await mirror.flush()
        assert mirror.num_failures == 2
        await mirror.close()
        await client.aclose()

    asyncio.run(scenario())


def test_mirror_without_running_event_loop_drops_and_counts():
    mirror = LeaseMirror(connect_async("redis://127.0.0.1:1/0"), NAMESPACE)
    table = LeaseTable("d0", clock=FakeClock(0.0), mirror=mirror)
    table.grant("req-1", [1], ttl_s=5.0)
    assert mirror.num_failures == 1
    assert table.get("req-1") is not None
