"""ThreadGovernor on scripted CPU figures: it follows the CPUs other processes leave free."""

from shared.executor.thread_governor import ThreadGovernor, busy_seconds


class Script:
    """A clock, busy seconds of the governed CPUs and own CPU seconds, advanced by hand."""

    def __init__(self):
        self.now, self.busy, self.own = 0.0, 0.0, 0.0
        self.applied: list[int] = []

    def advance(self, seconds: float, other_cpus: float, own_cpus: float) -> None:
        self.now += seconds
        self.busy += seconds * (other_cpus + own_cpus)
        self.own += seconds * own_cpus

    def governor(self, max_threads=2, num_cpus=2) -> ThreadGovernor:
        return ThreadGovernor(max_threads, set(range(num_cpus)), interval_s=0.5, clock=lambda: self.now,
                              read_busy=lambda: self.busy, read_own=lambda: self.own,
                              set_threads=self.applied.append)


def test_a_hog_on_one_of_two_cpus_drops_to_one_thread_after_two_intervals_and_back():
    script = Script()
    governor = script.governor()
    script.advance(0.6, other_cpus=0.05, own_cpus=1.9)
    assert governor.maybe_adjust() == 2
    for expected in (2, 1, 1):  # seen once, then applied, then kept
        script.advance(0.6, other_cpus=1.0, own_cpus=0.9)
        assert governor.maybe_adjust() == expected
    for expected in (1, 2):
        script.advance(0.6, other_cpus=0.0, own_cpus=1.0)
        assert governor.maybe_adjust() == expected
    assert script.applied == [1, 2]


def test_a_single_busy_interval_changes_nothing_and_checks_wait_for_the_interval():
    script = Script()
    governor = script.governor()
    script.advance(0.6, other_cpus=1.0, own_cpus=1.0)
    assert governor.maybe_adjust() == 2
    script.advance(0.6, other_cpus=0.0, own_cpus=2.0)
    assert governor.maybe_adjust() == 2
    script.advance(0.1, other_cpus=2.0, own_cpus=0.0)
    assert governor.maybe_adjust() == 2 and script.applied == []


def test_never_more_than_the_configured_threads_nor_fewer_than_one():
    script = Script()
    governor = script.governor(max_threads=2, num_cpus=4)
    for _ in range(3):
        script.advance(0.6, other_cpus=0.0, own_cpus=2.0)
        assert governor.maybe_adjust() == 2
    for _ in range(3):
        script.advance(0.6, other_cpus=4.0, own_cpus=0.0)
        governor.maybe_adjust()
    assert governor.num_threads == 1 and script.applied == [1]


def test_busy_seconds_reads_only_the_given_cpus(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  9 9 9 9 9 9 9 9\ncpu0 100 0 50 800 7 0 0 0 0 0\ncpu1 1 0 0 900 0 0 0 0 0 0\nintr 5\n")
    import os
    ticks = os.sysconf("SC_CLK_TCK")
    assert busy_seconds({0}, stat) == 150 / ticks
    assert busy_seconds({0, 1}, stat) == 151 / ticks
    assert busy_seconds({0}, tmp_path / "missing") is None
