"""Two batches in flight (pipeline parallelism): requests still computing are neither
scheduled again nor preempted; once their results are applied they run on as usual."""

from tests.unit.test_scheduler import assert_all_blocks_free, make_request, make_scheduler, run_step


def test_requests_in_flight_are_skipped_until_their_results_arrive():
    scheduler = make_scheduler()
    scheduler.add_request(make_request("a", range(1, 6)))
    first = scheduler.schedule()
    scheduler.in_flight.update(item.request_id for item in first.scheduled)
    scheduler.add_request(make_request("b", range(1, 4)))
    second = scheduler.schedule()
    assert [item.request_id for item in second.scheduled] == ["b"]  # "a" is still computing
    scheduler.update_from_output(first, {"a": 7})
    scheduler.in_flight.clear()
    scheduler.update_from_output(second, {"b": 7})
    third = scheduler.schedule()
    assert sorted(item.request_id for item in third.scheduled) == ["a", "b"]
    assert [item.token_ids for item in third.scheduled] == [[7], [7]]


def test_a_request_in_flight_is_never_preempted():
    scheduler = make_scheduler(num_blocks=2)
    scheduler.add_request(make_request("older", range(1, 5), max_tokens=8, arrival=1.0))
    scheduler.add_request(make_request("newer", range(1, 5), max_tokens=8, arrival=2.0))
    run_step(scheduler)  # each holds its one full block; the pool is empty
    scheduler.in_flight.add("newer")
    output = scheduler.schedule()  # "older" needs a block: the newest request would be the victim
    assert output.scheduled == [] and output.preempted_request_ids == ["older"]
    assert scheduler.requests["newer"].status.name == "RUNNING"
    scheduler.in_flight.clear()
    scheduler.abort(list(scheduler.requests))
    assert_all_blocks_free(scheduler)
