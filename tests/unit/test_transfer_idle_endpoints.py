"""The KV sender's reused connections are counted (the instance's
`pdserve:kv_transfer_idle_endpoints` and `..._idle_addresses` gauges), and a receiver address
whose connections all died keeps no entry: a decode instance restarted on another port, or on
the same one, leaves nothing behind in the prefill instances that sent to it."""

import asyncio

from shared.kv_transfer.types import KVConnectorStats
from shared.kv_transfer.ucx import sender as sender_module
from shared.kv_transfer.ucx.sender import KVSender


class FakeEndpoint:
    def __init__(self, closed: bool = False):
        self.closed = closed

    def abort(self) -> None:
        self.closed = True


def test_idle_connections_are_counted_by_endpoint_and_by_address():
    sender = KVSender(max_idle_per_address=2)
    for address in ("a:1", "a:1", "a:1", "b:2"):
        sender._checkin(address, FakeEndpoint())  # the third to a:1 is over the limit: aborted
    assert (sender.num_idle_endpoints, sender.num_idle_addresses) == (3, 2)


def test_an_address_whose_connections_died_keeps_no_entry(monkeypatch):
    sender = KVSender()
    sender._checkin("dead:1", FakeEndpoint())
    sender._idle_endpoints["dead:1"][0].closed = True  # its receiver went away
    fresh = FakeEndpoint()

    async def create_endpoint(host, port):
        return fresh

    monkeypatch.setattr(sender_module.ucxx, "create_endpoint", create_endpoint)
    assert asyncio.run(sender._checkout("dead:1")) is fresh
    assert "dead:1" not in sender._idle_endpoints
    assert (sender.num_idle_endpoints, sender.num_idle_addresses) == (0, 0)


def test_a_connector_without_a_sender_reports_no_idle_connections():
    stats = KVConnectorStats()
    assert (stats.num_idle_endpoints, stats.num_idle_addresses) == (0, 0)
