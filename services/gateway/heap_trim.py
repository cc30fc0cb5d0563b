"""The gateway gives freed heap memory back to the kernel, as the instances do
(shared.memory.idle_trim.HeapTrimmer: when idle after work, and under load once the resident
set has grown by a set amount).

Request bodies parsed, refused and dropped (a 10 MB schema, a 1 MB prompt, JSON nested 5,000
deep) leave their memory free but resident in glibc's heaps, fragmented across the threads'
arenas: the bad-input corpus left the gateway 85 MiB larger than it started, for good
(docs/bad_input.md; issue 37 saw 200). `trim_heap_forever` looks once a `look_interval_s`; the gateway counts
as idle in a look when its event loop's thread used less than `IDLE_CPU_FRACTION` of that
interval's CPU (every request, at either door, refused or not, passes through the loop; other
threads' CPU, e.g. gRPC's pollers, is not counted, nor is what the trim itself costs).
Before trimming it collects Python's garbage cycles (an exception's traceback holds the
frames that held the request).
"""

import asyncio
import gc
import time
from collections.abc import Awaitable, Callable

from shared.memory.idle_trim import HeapTrimmer, TrimPolicy
from shared.memory.malloc_stats import release_free_memory

LOOK_INTERVAL_S = 1.0
IDLE_CPU_FRACTION = 0.02


def collect_and_trim() -> None:
    gc.collect()
    release_free_memory()


def gateway_heap_trimmer(idle_interval_s: float) -> HeapTrimmer:
    return HeapTrimmer(TrimPolicy(idle_interval_s=idle_interval_s), trim=collect_and_trim)


def is_idle(cpu_seconds: float, interval_s: float) -> bool:
    return cpu_seconds < IDLE_CPU_FRACTION * interval_s


async def trim_heap_forever(trimmer: HeapTrimmer, look_interval_s: float = LOOK_INTERVAL_S,
                            cpu_clock: Callable[[], float] = time.thread_time,
                            sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
    last_cpu = cpu_clock()
    while True:
        await sleep(look_interval_s)
        trimmer.on_loop(is_idle(cpu_clock() - last_cpu, look_interval_s))
        last_cpu = cpu_clock()
