"""The heap trimmer's policy (shared.memory.idle_trim): when it looks at the heap, when it trims
while idle and while busy, and that live growth costs one trim per step of growth, not one per
look. A fake clock and a fake heap stand in for time and glibc: no sleeps, no real trims."""

from dataclasses import dataclass

from shared.memory.idle_trim import HeapReading, HeapTrimmer, TrimPolicy

MIB = 1 << 20
POLICY = TrimPolicy(min_free_bytes=32 * MIB, idle_interval_s=10.0, busy_growth_bytes=64 * MIB, busy_interval_s=5.0)


@dataclass
class FakeHeap:
    """RSS and free heap bytes; a trim returns `returned_by_trim` bytes of the free ones' pages."""

    resident_bytes: int = 2000 * MIB
    free_bytes: int = 100 * MIB
    returned_by_trim: int = 0
    num_reads: int = 0
    num_trims: int = 0

    def read(self) -> HeapReading:
        self.num_reads += 1
        return HeapReading(self.resident_bytes, self.free_bytes)

    def trim(self) -> None:
        self.num_trims += 1
        self.resident_bytes -= self.returned_by_trim  # free bytes stay free, just not resident


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_trimmer(heap: FakeHeap, clock: FakeClock, policy: TrimPolicy = POLICY) -> HeapTrimmer:
    return HeapTrimmer(policy, read=heap.read, trim=heap.trim, clock=clock)


def test_an_idle_engine_trims_once_after_it_ran_and_not_again_until_it_runs():
    heap, clock = FakeHeap(), FakeClock()
    trimmer = make_trimmer(heap, clock)
    assert trimmer.on_loop(is_idle=True) is False  # never ran: nothing to give back
    assert heap.num_reads == 0
    trimmer.on_loop(is_idle=False)
    assert trimmer.on_loop(is_idle=True) is True
    for _ in range(5):
        clock.now += 60
        assert trimmer.on_loop(is_idle=True) is False
    assert (heap.num_trims, trimmer.num_idle_trims, trimmer.num_busy_trims) == (1, 1, 0)


def test_idle_trims_are_at_most_one_per_idle_interval():
    heap, clock = FakeHeap(), FakeClock()
    trimmer = make_trimmer(heap, clock)
    trimmer.on_loop(is_idle=False)  # the busy look does not delay the idle one
    assert trimmer.on_loop(is_idle=True) is True
    trimmer.on_loop(is_idle=False)  # ran again, went idle again 9.9 s after the last idle trim
    clock.now += 9.9
    assert trimmer.on_loop(is_idle=True) is False
    clock.now += 0.1
    assert trimmer.on_loop(is_idle=True) is True
    assert heap.num_trims == 2


def test_an_idle_engine_with_little_free_heap_does_not_trim():
    heap, clock = FakeHeap(free_bytes=31 * MIB), FakeClock()
    trimmer = make_trimmer(heap, clock)
    trimmer.on_loop(is_idle=False)
    clock.now += 10
    assert trimmer.on_loop(is_idle=True) is False
    assert heap.num_trims == 0


def test_a_busy_engine_trims_once_it_has_grown_by_the_busy_growth():
    heap, clock = FakeHeap(returned_by_trim=80 * MIB), FakeClock()
    trimmer = make_trimmer(heap, clock)
    assert trimmer.on_loop(is_idle=False) is False  # the baseline: 2000 MiB
    heap.resident_bytes += 63 * MIB
    clock.now += 5
    assert trimmer.on_loop(is_idle=False) is False
    heap.resident_bytes += 1 * MIB
    assert trimmer.on_loop(is_idle=False) is False  # grown enough, but looked 0 s ago
    clock.now += 5
    assert trimmer.on_loop(is_idle=False) is True
    assert heap.resident_bytes == 1984 * MIB
    assert (trimmer.num_busy_trims, trimmer.num_idle_trims) == (1, 0)


def test_busy_growth_counts_from_the_rss_after_the_last_trim():
    heap, clock = FakeHeap(returned_by_trim=100 * MIB), FakeClock()
    trimmer = make_trimmer(heap, clock)
    trimmer.on_loop(is_idle=False)
    heap.resident_bytes += 64 * MIB
    clock.now += 5
    assert trimmer.on_loop(is_idle=False) is True  # 2064 -> 1964 MiB: the new baseline
    heap.resident_bytes += 60 * MIB  # 2024: 60 above the baseline, 24 above the first one
    clock.now += 5
    assert trimmer.on_loop(is_idle=False) is False
    heap.resident_bytes += 4 * MIB
    clock.now += 5
    assert trimmer.on_loop(is_idle=False) is True


def test_busy_growth_counts_from_the_lowest_rss_seen():
    heap, clock = FakeHeap(), FakeClock()
    trimmer = make_trimmer(heap, clock)
    trimmer.on_loop(is_idle=False)
    heap.resident_bytes -= 50 * MIB  # a burst's buffers went back to the kernel
    clock.now += 5
    trimmer.on_loop(is_idle=False)
    heap.resident_bytes += 64 * MIB  # 14 MiB above the first reading, 64 above the lowest
    clock.now += 5
    assert trimmer.on_loop(is_idle=False) is True


def test_live_growth_costs_one_trim_per_step_of_growth_not_one_per_look():
    heap, clock = FakeHeap(free_bytes=500 * MIB, returned_by_trim=0), FakeClock()  # a leak: nothing to return
    trimmer = make_trimmer(heap, clock)
    trimmer.on_loop(is_idle=False)
    for _ in range(100):  # 100 looks, 1 MiB more each: 100 MiB of growth
        heap.resident_bytes += 1 * MIB
        clock.now += 5
        trimmer.on_loop(is_idle=False)
    assert heap.num_trims == 1
    assert heap.num_reads == 102  # 101 looks and one reading after the trim


def test_between_looks_the_trimmer_reads_nothing():
    heap, clock = FakeHeap(), FakeClock()
    trimmer = make_trimmer(heap, clock)
    for _ in range(1000):
        clock.now += 0.004  # a step every 4 ms for 4 s
        trimmer.on_loop(is_idle=False)
    assert heap.num_reads == 1


def test_a_busy_engine_with_little_free_heap_does_not_trim():
    heap, clock = FakeHeap(free_bytes=10 * MIB), FakeClock()
    trimmer = make_trimmer(heap, clock)
    trimmer.on_loop(is_idle=False)
    heap.resident_bytes += 200 * MIB
    clock.now += 5
    assert trimmer.on_loop(is_idle=False) is False


def test_zero_turns_each_trigger_off():
    heap, clock = FakeHeap(returned_by_trim=10 * MIB), FakeClock()
    trimmer = make_trimmer(heap, clock, TrimPolicy(idle_interval_s=0, busy_growth_bytes=0))
    for _ in range(10):
        heap.resident_bytes += 100 * MIB
        clock.now += 60
        assert trimmer.on_loop(is_idle=False) is False
        assert trimmer.on_loop(is_idle=True) is False
    assert heap.num_reads == 0


def test_without_glibc_the_trimmer_does_nothing():
    clock, trims = FakeClock(), []
    trimmer = HeapTrimmer(POLICY, read=lambda: None, trim=lambda: trims.append(1), clock=clock)
    trimmer.on_loop(is_idle=False)
    clock.now += 60
    assert trimmer.on_loop(is_idle=True) is False
    assert trims == []
