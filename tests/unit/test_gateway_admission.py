"""Load shedding at the gateway (services.gateway.admission, services.gateway.wait_prediction): a
new request is admitted when its predicted wait for a first token (the prompts ahead of it on the
best prompt instance and its own, at the measured prompt tokens/s) fits within max_queue_wait_s,
or within its deadline when sooner; otherwise it is refused at once with RESOURCE_EXHAUSTED /
HTTP 429, a Retry-After of when the queue ahead will have drained enough, and a message naming
the prediction and the limit, before anything is reserved. A count limit per prompt instance
(max_queued_per_instance) is an option, off by default. Admitted requests are never checked
again, whatever instances leave or join."""

import asyncio

import grpc
import pytest

from services.gateway.admission import PREDICTED_WAIT, QUEUED_COUNT, Admission, prompt_pool
from services.gateway.errors import GatewayError
from services.gateway.settings import GatewaySettings
from services.gateway.wait_prediction import GUESS_REPLACED_AFTER_S, PRIOR_WEIGHT_S, WINDOW_S, PromptPool, PromptRate, predict_wait
from shared.cluster.instances import InstanceInfo, InstanceLoad
from shared.pb.pdserve.v1 import gateway_pb2 as gw
from shared.pb.pdserve.v1 import gateway_pb2_grpc
from tests.helpers.raw_http import assert_openai_error
from tests.unit.conftest_tokenizer import smollm2_tokenizer  # noqa: F401 - fixture
from tests.unit.gateway_fakes import Behaviour, FakeInstance
from tests.unit.metrics_scrape import scrape, value
from tests.unit.test_gateway_bad_input import apost
from tests.unit.test_openai_http import http_gateway, model, run, wait_until, with_pair  # noqa: F401

BODY = {"prompt": [1, 2, 3], "max_tokens": 2}
ONE = PromptPool(num_instances=1, num_waiting=0, fewest_waiting=0)
TWO = PromptPool(num_instances=2, num_waiting=0, fewest_waiting=0)


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def info(instance_id: str, role: str) -> InstanceInfo:
    return InstanceInfo(instance_id=instance_id, role=role, grpc_address="127.0.0.1:1", ucx_address="", model="m")


def shed(admit) -> GatewayError:
    with pytest.raises(GatewayError) as refused:
        admit()
    assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    return refused.value


# ---- the prompt pool and the prediction ------------------------------------------------------

def test_the_prompt_pool_is_the_prefill_instances_else_the_colocated_ones():
    listing = [(info("p0", "prefill"), InstanceLoad(queue_depth=3, num_running_requests=1, num_prefilling=1)),
               (info("p1", "prefill"), InstanceLoad(queue_depth=2)),
               (info("d0", "decode"), InstanceLoad(queue_depth=9, num_running_requests=9)),
               (info("c0", "colocated"), InstanceLoad(queue_depth=7))]
    assert prompt_pool(listing) == PromptPool(num_instances=2, num_waiting=6, fewest_waiting=2)
    assert prompt_pool(listing[2:]) == PromptPool(1, 7, 7)
    assert prompt_pool(listing[2:3]) == PromptPool(0, 0, 0)


def test_a_colocated_instances_decoding_requests_do_not_wait_for_a_first_token():
    busy = InstanceLoad(queue_depth=1, num_running_requests=30, num_prefilling=2)  # 28 of them decode
    assert prompt_pool([(info("c0", "colocated"), busy)]) == PromptPool(1, 3, 3)


def test_the_wait_is_the_best_instances_share_of_the_queue_and_the_own_prompt_at_the_rate():
    # 5 prompts of 300 tokens wait at this gateway, spread over 2 instances: 2 ahead on the best one.
    prediction = predict_wait(300, TWO, num_local_waiting=5, num_local_tokens=1500, tokens_per_s=300.0)
    assert (prediction.num_prompts_ahead, prediction.num_tokens_ahead, prediction.wait_s) == (2, 600.0, 3.0)
    # The heartbeats show more on the least loaded instance (other gateways' requests): they count.
    busier = PromptPool(num_instances=2, num_waiting=9, fewest_waiting=4)
    assert predict_wait(300, busier, 5, 1500, 300.0).wait_s == 5.0
    # Nothing waits here: the prompts ahead are taken as long as the new one.
    assert predict_wait(100, busier, 0, 0, 100.0).wait_s == 5.0


def test_the_prompt_rate_starts_at_the_prior_and_follows_the_measurements():
    clock = FakeClock()
    rate = PromptRate(prior_tokens_per_s=100.0, clock=clock)
    assert rate.tokens_per_s() == 100.0
    rate.set_busy(1.0)
    clock.now += 2.0
    rate.add_done(1000)  # 500 tokens/s for 2 s, against the prior's 100 for PRIOR_WEIGHT_S
    assert rate.tokens_per_s() == (1000 + 100 * PRIOR_WEIGHT_S) / (2.0 + PRIOR_WEIGHT_S)
    for _ in range(100):  # long after: the measurements alone, the newest pace
        clock.now += 1.0
        rate.add_done(300)
    assert 290.0 < rate.tokens_per_s() <= 300.0


def test_the_prompt_rate_forgets_old_measurements_after_the_window():
    clock = FakeClock()
    rate = PromptRate(prior_tokens_per_s=100.0, clock=clock)
    rate.set_busy(1.0)
    for pace in (300, 900):
        for _ in range(round(3 * WINDOW_S)):
            clock.now += 1.0
            rate.add_done(pace)
    assert 850.0 < rate.tokens_per_s() < 900.0


def test_a_stalled_pool_slows_the_rate_down_while_it_stalls():
    clock = FakeClock()
    rate = PromptRate(prior_tokens_per_s=500.0, clock=clock)
    rate.set_busy(1.0)
    clock.now += 8.0  # nothing done for 8 s of waiting
    assert rate.tokens_per_s() == 500.0 * PRIOR_WEIGHT_S / (8.0 + PRIOR_WEIGHT_S)


def test_the_rate_is_per_busy_instance_and_this_gateways_share_of_it():
    clock = FakeClock()
    admission = Admission(prior_tokens_per_s=100.0, clock=clock)
    ticket = admission.admit(1000, TWO)  # one request: one of the two instances busy
    clock.now += 2.0
    ticket.first_token()
    assert admission.rate.tokens_per_s() == (1000 + 200) / (2.0 + PRIOR_WEIGHT_S)
    # The heartbeat shows 4 prompts waiting on the one instance, 1 of them ours: a quarter of it is ours.
    admission = Admission(prior_tokens_per_s=100.0, clock=clock)
    ticket = admission.admit(1000, PromptPool(num_instances=1, num_waiting=4, fewest_waiting=4))
    clock.now += 2.0
    ticket.first_token()
    assert admission.rate.tokens_per_s() == (1000 + 200) / (0.5 + PRIOR_WEIGHT_S)


# ---- admission decisions ---------------------------------------------------------------------

def test_a_burst_far_past_the_old_count_limit_is_admitted_by_default():
    admission = Admission(prior_tokens_per_s=500.0, clock=FakeClock())
    tickets = [admission.admit(300, ONE) for _ in range(128)]
    assert admission.num_waiting == 128 and not admission.num_shed
    assert admission.last_prediction.wait_s == 128 * 300 / 500.0  # 76.8 s, within the default 120 s
    assert len(tickets) == 128


def test_a_request_is_shed_when_its_predicted_wait_is_over_the_limit():
    admission = Admission(max_queue_wait_s=5.0, prior_tokens_per_s=500.0, clock=FakeClock())
    admission.admit(1000, ONE)  # nothing ahead: admitted (2 s)
    admission.admit(1000, ONE)  # 4 s
    refused = shed(lambda: admission.admit(1000, ONE))  # 6 s
    assert refused.message == ("overloaded: the predicted wait for a first token is 6.0 s (2 prompt(s), about "
                               "2000 tokens ahead on the best of 1 prompt instance(s) at 500 prompt tokens/s "
                               "each), over the limit of 5 s (max_queue_wait_s); retry after 1 s")
    assert refused.retry_after_s == 1.0
    assert admission.num_shed == {PREDICTED_WAIT: 1} and admission.num_waiting == 2
    admission.admit(500, ONE)  # a shorter prompt still fits: 5 s


def test_retry_after_is_when_the_queue_ahead_will_have_drained_enough():
    clock = FakeClock()
    admission = Admission(max_queue_wait_s=4.0, prior_tokens_per_s=500.0, clock=clock)
    other_gateways = PromptPool(num_instances=1, num_waiting=10, fewest_waiting=10)  # 22 s ahead
    refused = shed(lambda: admission.admit(1000, other_gateways))
    assert refused.retry_after_s == 18.0 and "retry after 18 s" in refused.message
    # 18 s later, at 500 tokens/s, 9 of the 10 prompts are done: the wait is 4 s, admitted.
    clock.now += refused.retry_after_s
    admission.admit(1000, PromptPool(num_instances=1, num_waiting=1, fewest_waiting=1))


def test_the_requests_own_deadline_is_the_limit_when_sooner():
    admission = Admission(max_queue_wait_s=120.0, prior_tokens_per_s=500.0, clock=FakeClock())
    admission.admit(1000, ONE)
    refused = shed(lambda: admission.admit(1000, ONE, seconds_left=3.0))  # 4 s > 3 s
    assert "over the 3.0 s left before the request's deadline" in refused.message
    assert refused.retry_after_s == 1.0
    admission.admit(1000, ONE, seconds_left=300.0)  # a later deadline does not raise the limit past 120 s


def test_a_request_with_nothing_ahead_is_admitted_however_long_its_own_prompt():
    admission = Admission(max_queue_wait_s=0.001, prior_tokens_per_s=1.0, clock=FakeClock())
    admission.admit(100_000, TWO)
    admission.admit(100_000, TWO)  # the second instance is free
    shed(lambda: admission.admit(1, TWO))


def test_nothing_is_shed_when_off_or_when_no_prompt_instance_is_live():
    admission = Admission(max_queue_wait_s=0, clock=FakeClock())
    for _ in range(3):
        admission.admit(10**6, PromptPool(1, 10**6, 10**6))
    admission = Admission(max_queue_wait_s=0.001, max_queued_per_instance=1, clock=FakeClock())
    admission.admit(10, PromptPool(0, 0, 0))
    admission.admit(10, PromptPool(0, 0, 0))  # routing answers UNAVAILABLE instead
    assert not admission.num_shed


def test_a_stalled_pool_sheds_new_requests_and_keeps_the_admitted_ones():
    clock = FakeClock()
    admission = Admission(max_queue_wait_s=10.0, prior_tokens_per_s=500.0, clock=clock)
    tickets = [admission.admit(1000, ONE) for _ in range(3)]  # 2, 4, 6 s
    clock.now += 30.0  # no first token for 30 s: the measured rate falls to 500 * 2 / 32 tokens/s
    refused = shed(lambda: admission.admit(1000, ONE))
    assert refused.retry_after_s == pytest.approx(4000 / (500 * PRIOR_WEIGHT_S / 32.0) - 10.0)
    for ticket in tickets:
        ticket.first_token()
    assert admission.num_waiting == 0


def test_admitted_requests_stay_ahead_of_later_arrivals_when_instances_leave_or_join():
    admission = Admission(max_queue_wait_s=7.0, prior_tokens_per_s=500.0, clock=FakeClock())
    tickets = [admission.admit(1000, TWO) for _ in range(4)]  # 2 ahead on the best of two: 6 s
    # One instance leaves: the four admitted keep their tickets, and a new arrival counts all
    # four ahead of it on the one left (10 s): shed, while the admitted ones go on.
    shed(lambda: admission.admit(1000, ONE))
    assert admission.num_waiting == 4
    # One joins again: the new arrival still has its share of the admitted ones ahead.
    assert admission.admit(1000, TWO) and admission.last_prediction.num_prompts_ahead == 2
    for ticket in tickets:
        ticket.first_token()
        ticket.release()
    assert admission.num_waiting == 1


def test_release_without_a_first_token_frees_the_slot_once_and_measures_nothing():
    clock = FakeClock()
    admission = Admission(prior_tokens_per_s=100.0, clock=clock)
    ticket = admission.admit(500, ONE)
    ticket.release()
    ticket.release()
    ticket.first_token()
    clock.now += 5.0
    assert (admission.num_waiting, admission.num_waiting_tokens, admission.rate.tokens_per_s()) == (0, 0, 100.0)


# ---- the count limit, an option -------------------------------------------------------------

def test_the_count_limit_sheds_at_so_many_waiting_per_instance_when_set():
    admission = Admission(max_queue_wait_s=0, max_queued_per_instance=2, prior_tokens_per_s=100.0, clock=FakeClock())
    tickets = [admission.admit(100, TWO) for _ in range(4)]
    refused = shed(lambda: admission.admit(100, TWO))
    assert "max_queued_per_instance=2" in refused.message and "limit is 4" in refused.message
    assert refused.retry_after_s == 1.0  # one prompt of 100 tokens drains in 0.5 s from two instances
    assert admission.num_shed == {QUEUED_COUNT: 1}
    tickets[0].first_token()
    tickets[0].release()  # after its first token, a request no longer counts
    admission.admit(100, TWO)
    assert admission.num_waiting == 4


def test_the_count_limit_counts_the_heartbeats_when_they_see_more_than_this_gateway():
    admission = Admission(max_queue_wait_s=0, max_queued_per_instance=3, clock=FakeClock())
    shed(lambda: admission.admit(10, PromptPool(1, 3, 3)))  # other gateways' requests fill the pool
    admission.admit(10, PromptPool(2, 5, 2)).release()
    assert admission.num_waiting == 0


def test_the_settings_default_to_a_generous_wait_and_no_count_limit():
    settings = GatewaySettings()
    assert (settings.max_queue_wait_s, settings.max_queued_per_instance) == (120.0, 0)
    admission = settings.admission()
    assert (admission.max_queue_wait_s, admission.max_queued_per_instance) == (120.0, 0)


def test_the_profile_gives_the_prompt_rate_assumed_until_measured():
    settings = GatewaySettings(profile="docs/autoscaling/profile-smollm2-cpu-fp32.json", max_queue_wait_s=30)
    assert 400.0 < settings.admission().rate.tokens_per_s() < 600.0
    assert settings.admission().rate.is_known


def test_a_given_prompt_rate_comes_first_and_without_one_the_rate_is_a_guess():
    settings = GatewaySettings(profile="docs/autoscaling/profile-smollm2-cpu-fp32.json", prompt_tokens_per_s=4000)
    assert settings.admission().rate.tokens_per_s() == 4000.0 and settings.admission().rate.is_known
    assert not GatewaySettings().admission().rate.is_known


def test_a_guessed_rate_refuses_nothing_and_the_first_measurement_replaces_it():
    clock = FakeClock()
    admission = Admission(max_queue_wait_s=5.0, prior_tokens_per_s=500.0, clock=clock, prior_is_a_guess=True)
    tickets = [admission.admit(1000, ONE) for _ in range(512)]  # ~1,000 s at the guess: all admitted
    assert admission.last_prediction.wait_s > 5.0 and not admission.num_shed
    clock.now += 1.0
    tickets[0].first_token()  # 1,000 tokens in 1 s: too little measured to replace the guess
    assert not admission.rate.is_known
    admission.admit(1000, ONE)
    clock.now += GUESS_REPLACED_AFTER_S
    tickets[1].first_token()  # 2,000 tokens in 6 s of one busy instance: the guess is gone
    assert admission.rate.is_known and admission.rate.tokens_per_s() == 2000 / (1.0 + GUESS_REPLACED_AFTER_S)
    shed(lambda: admission.admit(1000, ONE))  # 511 ahead at 333 tokens/s: over 5 s


def test_a_bad_max_queue_wait_is_refused_naming_the_setting():
    with pytest.raises(Exception, match="max_queue_wait_s"):
        GatewaySettings(max_queue_wait_s=-1)


# ---- both front doors, on fakes --------------------------------------------------------------

@pytest.mark.parametrize("limit, num_held, named, reason", [
    ({"max_queue_wait_s": 0.001, "prompt_tokens_per_s": 500.0}, 1, "(max_queue_wait_s)",
     PREDICTED_WAIT),  # one held: the next has it ahead
    ({"max_queue_wait_s": 0, "max_queued_per_instance": 2}, 2, "(max_queued_per_instance=2 per instance)",
     QUEUED_COUNT),
])
def test_a_full_pool_sheds_with_429_and_resource_exhausted_and_reserves_nothing(redis_server, model, limit,
                                                                                 num_held, named, reason):
    """Requests wait in a prefill that holds them; the next is shed on both front doors and
    counted by reason in the metrics; once the held ones are cancelled their reservations are
    given back and requests pass again."""
    async def scenario():
        async with http_gateway(redis_server.url, model, **limit) as gate:
            p0, d0 = await with_pair(gate, prefill_behaviour=Behaviour(prefill_blocks=True))
            channel = grpc.aio.insecure_channel(gate.server.address)
            stub = gateway_pb2_grpc.GatewayStub(channel)
            request = gw.GenerateRequest(token_ids=gw.TokenIds(ids=[1, 2, 3]))
            waiting = []
            for count in range(1, num_held + 1):
                waiting.append(asyncio.create_task(stub.Generate(request).read()))
                await wait_until(lambda: sum(name == "StreamPrefill" for name, _ in p0.calls) == count)

            status, body, headers = await apost(gate.server.http_address, "/v1/completions", BODY)
            assert_openai_error(status, body, 429)
            assert named in body["error"]["message"]
            assert int(headers["retry-after"]) >= 1
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Generate(request).read()
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert named in refused.value.details()
            assert int(dict(refused.value.trailing_metadata())["retry-after"]) >= 1
            assert sum(name == "Reserve" for name, _ in d0.calls) == num_held  # the shed ones reserved nothing
            samples = await asyncio.to_thread(scrape, gate.server.http_address)
            assert value(samples, "pdserve:gateway_requests_shed_total", reason=reason) == 2
            assert value(samples, "pdserve:gateway_requests_waiting_first_token") == num_held
            assert value(samples, "pdserve:gateway_predicted_wait_seconds") > 0
            assert value(samples, "pdserve:gateway_prompt_tokens_per_second") > 0

            for task in waiting:
                task.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)
            await wait_until(lambda: sum(name == "Release" for name, _ in d0.calls) == num_held)
            await wait_until(lambda: gate.server.state.admission.num_waiting == 0)
            p0.behaviour.prefill_blocks = False
            replies = [m async for m in stub.Generate(request)]
            assert replies[-1].usage.completion_tokens == 3
            assert sum(gate.server.state.admission.num_shed.values()) == 2
            await channel.close()
    run(scenario)


def test_an_admitted_request_whose_prefill_instance_leaves_completes_elsewhere_unrefused(redis_server, model):
    """A request waits on p0 (its prompt held); a second is shed (its wait over the tiny limit);
    p1 joins and p0 goes away: the admitted request's prefill moves to p1 and completes, never
    checked against the limit again."""
    async def scenario():
        async with http_gateway(redis_server.url, model, max_queue_wait_s=0.001,
                                prompt_tokens_per_s=500.0) as gate:
            p0, d0 = await with_pair(gate, prefill_behaviour=Behaviour(prefill_blocks=True))
            channel = grpc.aio.insecure_channel(gate.server.address)
            stub = gateway_pb2_grpc.GatewayStub(channel)
            request = gw.GenerateRequest(token_ids=gw.TokenIds(ids=[1, 2, 3]))
            admitted = asyncio.create_task(stub.Generate(request).read())
            await wait_until(lambda: any(name == "StreamPrefill" for name, _ in p0.calls))
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Generate(request).read()
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

            p1 = FakeInstance("p1", "prefill")
            await gate.add(p1)
            await gate.registry.deregister("p0")
            await p0.stop()
            reply = await admitted
            assert reply.token_ids and any(name == "StreamPrefill" for name, _ in p1.calls)
            assert gate.server.state.admission.num_shed == {PREDICTED_WAIT: 1}
            await wait_until(lambda: gate.server.state.admission.num_waiting == 0)
            await channel.close()
    run(scenario)
