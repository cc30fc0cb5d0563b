"""The lifetime of what several end-to-end modules share (tests/e2e/shared_stacks.py): a stack
or an offline reference engine is started by the first test that asks for it, reused by the
next ones, stopped once the last one is done, and started afresh if a later test asks again."""

from collections.abc import Iterator

from tests.e2e.shared_stacks import SharedOnDemand


def recording_start(events: list[str]):
    def start() -> Iterator[str]:
        number = events.count("started") + 1
        events.append("started")
        try:
            yield f"engine {number}"
        finally:
            events.append("stopped")
    return start


def test_started_on_first_use_and_reused_until_stopped():
    events = []
    shared = SharedOnDemand(recording_start(events))
    assert events == []
    assert shared.get() == "engine 1"
    assert shared.get() == "engine 1"
    assert events == ["started"]
    shared.stop()
    assert events == ["started", "stopped"]


def test_a_later_user_gets_a_fresh_one_and_stop_is_idempotent():
    events = []
    shared = SharedOnDemand(recording_start(events))
    shared.get()
    shared.stop()
    assert shared.get() == "engine 2"
    shared.stop()
    shared.stop()
    assert events == ["started", "stopped", "started", "stopped"]
