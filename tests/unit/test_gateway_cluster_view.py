"""ClusterView through a Redis restart (a fake registry, a fake clock): a partial or empty
listing right after Redis comes back (a failed listing before, or a new run id) adds to the
last view instead of replacing it, until the grace period ends; outside it a listing is the
truth (a dead instance drops out)."""

import asyncio

from services.gateway.cluster_view import ClusterView
from services.gateway.prompt_hashes import PromptHashes
from shared.cluster.instances import DRAINING, SERVING, InstanceInfo, InstanceLoad

LOAD = InstanceLoad(0, 0, 10, 10)


def record(instance_id: str, role: str = "decode", state: str = SERVING):
    return InstanceInfo(instance_id, role, f"{instance_id}:1", "", "m", state=state), LOAD


class FakeRegistry:
    def __init__(self):
        self.listing = []
        self.run_id = "run-1"
        self.is_down = False

    async def list_live(self, include_draining=False):
        if self.is_down:
            raise ConnectionError("redis is down")
        return [r for r in self.listing if include_draining or not r[0].is_draining]

    async def server_run_id(self):
        return self.run_id


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def ids(listing) -> list[str]:
    return [info.instance_id for info, _ in listing]


def make_view():
    registry, clock = FakeRegistry(), Clock()
    view = ClusterView(registry, prefix_index=None, cache_s=0.0, reconnect_grace_s=5.0, clock=clock)
    return view, registry, clock


def test_a_restarted_redis_does_not_empty_the_view_until_the_grace_ends():
    async def scenario():
        view, registry, clock = make_view()
        registry.listing = [record("d0"), record("d1"), record("p0", "prefill")]
        assert ids(await view.live()) == ["d0", "d1", "p0"]
        registry.listing, registry.run_id = [], "run-2"  # restarted empty
        clock.now += 1
        assert ids(await view.live()) == ["d0", "d1", "p0"] and view.is_reconnecting()
        registry.listing = [record("d1")]  # the first re-registration
        clock.now += 1
        assert ids(await view.live()) == ["d0", "d1", "p0"]
        clock.now += 5  # grace over: the listing is the truth again
        assert ids(await view.live()) == ["d1"] and not view.is_reconnecting()
    asyncio.run(scenario())


def test_an_outage_keeps_the_last_view_and_the_first_listing_after_it_only_adds():
    async def scenario():
        view, registry, clock = make_view()
        registry.listing = [record("d0"), record("p0", "prefill")]
        await view.live()
        registry.is_down = True
        clock.now += 1
        assert ids(await view.live()) == ["d0", "p0"]
        registry.is_down, registry.listing = False, [record("d2")]
        clock.now += 1
        assert ids(await view.live()) == ["d0", "d2", "p0"]
    asyncio.run(scenario())


def test_without_a_reconnect_a_listing_replaces_the_view():
    async def scenario():
        view, registry, clock = make_view()
        registry.listing = [record("d0"), record("d1")]
        await view.live()
        registry.listing = [record("d1")]  # d0's registration lapsed
        clock.now += 1
        assert ids(await view.live()) == ["d1"]
    asyncio.run(scenario())


def test_a_draining_instance_is_counted_but_never_a_candidate():
    async def scenario():
        view, registry, clock = make_view()
        registry.listing = [record("d0"), record("d1", state=DRAINING), record("p0", "prefill", DRAINING)]
        assert ids(await view.live()) == ["d0"]
        assert ids(view.draining()) == ["d1", "p0"]
        assert [c.instance_id for c in await view.candidates(PromptHashes([], None))] == ["d0"]
        registry.listing = [record("d0")]  # d1 and p0 finished and deregistered
        clock.now += 1
        assert ids(await view.live()) == ["d0"] and view.draining() == []
    asyncio.run(scenario())


def test_an_instance_that_drains_during_a_reconnect_leaves_routing_at_once():
    async def scenario():
        view, registry, clock = make_view()
        registry.listing = [record("d0"), record("d1")]
        await view.live()
        registry.listing, registry.run_id = [record("d1", state=DRAINING)], "run-2"  # d0 not yet re-registered
        clock.now += 1
        assert ids(await view.live()) == ["d0"] and ids(view.draining()) == ["d1"]
    asyncio.run(scenario())


def test_the_first_listing_is_made_by_the_first_request_and_has_every_instance_registered_by_then():
    """A gateway started beside its instances lists none before a request asks (its metrics
    read the last listing, no Redis): `pdserve up` is ready once every instance is registered,
    so the first request's listing has them all, however soon it comes (cache_s or not)."""
    async def scenario():
        registry, clock = FakeRegistry(), Clock()
        view = ClusterView(registry, prefix_index=None, cache_s=0.5, clock=clock)
        registry.list_live = counted(registry.list_live, listings := [])
        registry.listing = [record("d0"), record("p0", "prefill")]
        assert listings == []
        assert ids(await view.live()) == ["d0", "p0"] and len(listings) == 1
    asyncio.run(scenario())


def counted(list_live, calls: list):
    async def listing(include_draining=False):
        calls.append(include_draining)
        return await list_live(include_draining)
    return listing
