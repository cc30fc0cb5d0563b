"""The prefix publisher consumes the engine's KV-cache events through the engine API: changes
become SREM/SADD, a snapshot (asked for, or forced by the engine after dropping events
nobody drained) replaces the instance's entry."""

import asyncio

from services.instance.prefix_publisher import PrefixPublisher
from shared.engine_api.client import KVCacheEvents

A, B, C = (bytes([n]) * 32 for n in (1, 2, 3))


class FakeIndex:
    def __init__(self):
        self.calls: list[tuple] = []

    async def replace_all(self, instance_id, hashes):
        self.calls.append(("replace_all", sorted(hashes)))

    async def add(self, instance_id, hashes):
        self.calls.append(("add", sorted(hashes)))

    async def remove(self, instance_id, hashes):
        self.calls.append(("remove", sorted(hashes)))

    async def update_tier(self, tier_id, stored, removed):
        self.calls.append(("update_tier", tier_id, sorted(stored), sorted(removed)))

    async def replace_tier(self, tier_id, hashes):
        self.calls.append(("replace_tier", tier_id, sorted(hashes)))


class ScriptedEngine:
    """kv_events answers from a script; records whether a snapshot was asked for."""

    def __init__(self, *answers: KVCacheEvents):
        self.answers = list(answers)
        self.asked: list[bool] = []

    async def kv_events(self, snapshot: bool = False) -> KVCacheEvents:
        self.asked.append(snapshot)
        return self.answers.pop(0)


def test_changes_are_applied_and_a_forced_snapshot_replaces_the_entry():
    engine = ScriptedEngine(KVCacheEvents(stored=(A,), is_snapshot=True),
                            KVCacheEvents(stored=(B,), removed=(A,)),
                            KVCacheEvents(stored=(B, C), is_snapshot=True))
    index = FakeIndex()
    publisher = PrefixPublisher(index, "i0", engine, interval_s=1.0)

    async def scenario():
        await publisher.republish()
        await publisher.publish_changes()
        await publisher.publish_changes()  # the engine dropped events: it answers with a snapshot
    asyncio.run(scenario())
    assert engine.asked == [True, False, False]
    assert index.calls == [("replace_all", [A]), ("remove", [A]), ("add", [B]), ("replace_all", [B, C])]


def test_the_host_tier_entry_follows_the_tier_events():
    engine = ScriptedEngine(KVCacheEvents(stored=(A,), is_snapshot=True, tier_stored=(A, B), is_tier_snapshot=True),
                            KVCacheEvents(stored=(C,), tier_stored=(C,), tier_removed=(B,)))
    index = FakeIndex()
    publisher = PrefixPublisher(index, "i0", engine, interval_s=1.0, tier_id="tier-1")

    async def scenario():
        await publisher.republish()
        await publisher.publish_changes()
    asyncio.run(scenario())
    assert index.calls == [("replace_all", [A]), ("replace_tier", "tier-1", [A, B]),
                           ("remove", []), ("add", [C]), ("update_tier", "tier-1", [C], [B])]
