"""After Redis lost an instance's keys, presence republishes through its resync hooks: plain
functions (LeaseTable.republish returns a count) and coroutines alike."""

import asyncio

from services.instance.presence import run_resync_hooks


def test_resync_hooks_may_be_plain_functions_returning_values_or_coroutines():
    calls = []

    def republish_leases() -> int:
        calls.append("leases")
        return 3

    async def republish_index() -> None:
        calls.append("index")

    asyncio.run(run_resync_hooks([republish_leases, republish_index, lambda: None]))
    assert calls == ["leases", "index"]
