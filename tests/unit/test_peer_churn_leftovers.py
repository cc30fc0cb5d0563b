"""What bench-faults' churn scenarios and tests/e2e/test_peer_churn.py call left behind in a
survivor (benchmarks.harness.peer_churn): lingering transport operations, cached connections to
more receiver addresses than run; and the survivors' RSS growth across the cycles."""

from benchmarks.harness.peer_churn import TransportState, leftovers, rss_growth_mib

MIB = 2**20


def test_a_clean_survivor_leaves_nothing():
    state = TransportState(idle_endpoints=3, idle_addresses=2, lingering=0, rss_bytes=500 * MIB)
    assert leftovers({"prefill-0": state}, {"prefill-0": state}, num_receivers=2) == []


def test_lingering_operations_and_stale_addresses_are_named():
    after = {"prefill-0": TransportState(idle_endpoints=5, idle_addresses=3, lingering=2, rss_bytes=0)}
    found = leftovers({}, after, num_receivers=2)
    assert found == ["prefill-0: 2 lingering transport operation(s)",
                     "prefill-0: cached connections to 3 addresses (2 receivers run)"]


def test_rss_growth_is_per_survivor_in_mib():
    before = {"decode-0": TransportState(0, 0, 0, 400 * MIB)}
    after = {"decode-0": TransportState(0, 0, 0, 424 * MIB)}
    assert rss_growth_mib(before, after) == {"decode-0": 24.0}
