"""The gateway gives the memory that requests leave free in the heaps back to the kernel
(services.gateway.heap_trim): a look each second, idle when the gateway's event loop used
under 2 % of that second's CPU, the instances' trim policy (shared.memory.idle_trim)
deciding; after large bad requests it trims once idle, and stays within 50 MiB of where it
started (in this process the test's own memory blurs the figure:
tests/e2e/test_bad_input_fuzz.py checks the gateway process)."""

import asyncio
import gc

import pytest

from services.gateway.heap_trim import IDLE_CPU_FRACTION, is_idle, trim_heap_forever
from shared.memory.process import resident_bytes
from tests.helpers.raw_http import post
from tests.unit.conftest_tokenizer import smollm2_tokenizer  # noqa: F401 - fixture
from tests.unit.test_gateway_bad_input import OVERSIZED_BODIES
from tests.unit.test_openai_http import http_gateway, model, wait_until, with_pair  # noqa: F401

MIB = 1 << 20


class EnoughLooks(Exception):
    pass


class RecordingTrimmer:
    """Records each look's is_idle; its "trim" (an idle look) costs 5 s of CPU."""

    def __init__(self, cpu: list[float], num_looks: int):
        self.cpu, self.num_looks, self.looks = cpu, num_looks, []

    def on_loop(self, is_idle: bool) -> bool:
        self.looks.append(is_idle)
        if is_idle:
            self.cpu[0] += 5.0
        if len(self.looks) == self.num_looks:
            raise EnoughLooks
        return is_idle


def test_a_look_is_idle_when_the_gateway_used_under_2_percent_of_the_cpu():
    assert is_idle(0.0, 1.0) and is_idle(IDLE_CPU_FRACTION * 0.99, 1.0)
    assert not is_idle(IDLE_CPU_FRACTION, 1.0) and is_idle(0.1, 10.0) and not is_idle(0.5, 10.0)


def test_each_look_judges_the_cpu_used_since_the_last_and_never_counts_the_trim():
    cpu = [100.0]
    used_between_looks = iter([0.5, 0.0, 0.0, 0.3, 0.0])
    trimmer = RecordingTrimmer(cpu, num_looks=5)

    def cpu_clock() -> float:
        return cpu[0]

    async def sleep_using_cpu(_):
        cpu[0] += next(used_between_looks)

    async def scenario():
        with pytest.raises(EnoughLooks):
            await trim_heap_forever(trimmer, look_interval_s=1.0, cpu_clock=cpu_clock, sleep=sleep_using_cpu)
    asyncio.run(scenario())
    assert trimmer.looks == [False, True, True, False, True]


def test_the_gateway_trims_once_idle_after_large_bad_requests_and_stays_within_50_mib(redis_server, model):
    async def send_corpus(address: str) -> None:
        for body in OVERSIZED_BODIES.values():
            path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
            await asyncio.to_thread(post, address, path, body)

    async def scenario():
        async with http_gateway(redis_server.url, model, idle_trim_interval_s=0.5) as gate:
            await with_pair(gate)
            address, trimmer = gate.server.http_address, gate.server.heap_trimmer
            await send_corpus(address)  # first use: whatever the gateway keeps for good
            await wait_until(lambda: trimmer.num_idle_trims >= 1, timeout_s=300)
            gc.collect()
            started = resident_bytes()
            for _ in range(3):
                await send_corpus(address)
            num_trims = trimmer.num_idle_trims
            await wait_until(lambda: trimmer.num_idle_trims > num_trims, timeout_s=300)
            assert resident_bytes() - started < 50 * MIB, (started / MIB, resident_bytes() / MIB)
    asyncio.run(asyncio.wait_for(scenario(), timeout=600))  # ~40 MB of bodies parsed: slow on a busy machine
