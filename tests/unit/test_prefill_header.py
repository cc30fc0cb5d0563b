"""Reading the endpoint picker's prefill header, and choosing among the endpoints it names
(services.instance.prefill_header, services.instance.pod_view.choose_prefills)."""

import dataclasses

import pytest

from services.gateway.router import Candidate
from services.instance.pod_view import choose_prefills
from services.instance.prefill_header import NamedPrefills, named_prefills
from shared.cluster.versions import KV_PROTOCOL_VERSION
from shared.engine_api.client import CacheSettings
from starlette.datastructures import Headers

CACHE = CacheSettings("m", 16, "sha256", "float32", "layers=2,kv_heads=2,head_dim=16")


def test_both_header_names_are_read_and_the_issues_name_wins():
    assert named_prefills(Headers({"X-Gateway-Prefill-Endpoints": "p0:50052, p1:50052"})) == NamedPrefills(
        ("p0:50052", "p1:50052"))
    assert named_prefills(Headers({"x-prefiller-host-port": "10.0.0.7:50052"})) == NamedPrefills(("10.0.0.7:50052",))
    both = Headers({"x-prefiller-host-port": "b:2", "x-gateway-prefill-endpoints": "a:1"})
    assert named_prefills(both).addresses == ("a:1",)
    assert named_prefills(Headers({})) == NamedPrefills()
    assert named_prefills(Headers({"x-gateway-prefill-endpoints": "[::1]:50052"})).addresses == ("[::1]:50052",)


@pytest.mark.parametrize("value, why", [
    ("", "x-gateway-prefill-endpoints: empty"),
    ("p0", "'p0' is not host:port"),
    ("p0:http", "'p0:http' has no port in 1..65535"),
    ("p0:0", "has no port in 1..65535"),
    ("p0:70000", "has no port in 1..65535"),
    ("http://p0:80", "has a bad host"),
    (",".join(f"p{i}:1" for i in range(9)), "9 endpoints, at most 8"),
])
def test_a_malformed_header_says_why_and_names_no_endpoint(value, why):
    named = named_prefills(Headers({"x-gateway-prefill-endpoints": value}))
    assert named.addresses == () and why in named.malformed


def candidate(instance_id: str, role: str, address: str, **changes) -> Candidate:
    return Candidate(instance_id, role, address, **{"cache": CACHE, **changes})


def test_the_named_prefill_instances_that_can_feed_this_one_are_chosen():
    own = candidate("d0", "decode", "d0:1")
    listed = [own, candidate("p0", "prefill", "p0:1"), candidate("p1", "prefill", "p1:1"),
              candidate("p2", "prefill", "p2:1")]
    assert [c.instance_id for c in choose_prefills(("p1:1", "p0:1"), listed, own).prefills] == ["p1", "p0"]
    assert choose_prefills(("x:1", "p2:1"), listed, own).prefills == (listed[3],)  # an unknown one is skipped


@pytest.mark.parametrize("named, reason, detail", [
    ("x:1", "unknown", "no live instance registered x:1"),
    ("d0:1", "not_prefill", "d0:1 is decode d0"),
    ("old:1", "incompatible", f"KV protocol version ({KV_PROTOCOL_VERSION + 1} != {KV_PROTOCOL_VERSION}"),
    ("other:1", "incompatible", "cache settings (block_size 32 != 16)"),
])
def test_an_endpoint_that_cannot_feed_this_instance_says_why(named, reason, detail):
    own = candidate("d0", "decode", "d0:1")
    listed = [own, candidate("old", "prefill", "old:1", kv_protocol_version=KV_PROTOCOL_VERSION + 1),
              candidate("other", "prefill", "other:1", cache=dataclasses.replace(CACHE, block_size=32))]
    choice = choose_prefills((named,), listed, own)
    assert choice.prefills == () and choice.reason == reason and detail in choice.detail
