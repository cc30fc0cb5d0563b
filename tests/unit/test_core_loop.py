"""The engine-core loop's order within one turn: KV that arrived (or was sent) while the last
step ran is reported before the next step computes, so a decode service can start that
request without waiting a whole step for the news."""

import zmq

from shared.engine.core_process.core_loop import CoreLoop
from shared.engine_api.client import ReservationEvent, ReservationEventKind
from shared.engine.core_process.messages import StepOutputs, decode_core_message
from shared.engine import SamplingParams
from shared.kv_transfer.types import KVConnectorRole
from tests.unit.kv_split import connected_llm, send_params

PROMPT = list(range(30, 67))


def test_an_arrival_is_reported_before_the_next_step_computes(tiny_llama_folder):
    producer = connected_llm(tiny_llama_folder, KVConnectorRole.PRODUCER, enable_prefix_caching=False)
    consumer = connected_llm(tiny_llama_folder, KVConnectorRole.CONSUMER, enable_prefix_caching=False)
    core = consumer.engine.core
    context = zmq.Context()
    inbox, outbox, service = context.socket(zmq.PAIR), context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    inbox.bind("inproc://core-inbox")
    outbox.bind("inproc://core-outbox")
    service.connect("inproc://core-outbox")
    try:
        loop = CoreLoop(core, inbox, outbox)
        busy = consumer.engine.add_request(list(range(3, 20)), SamplingParams(max_tokens=8, ignore_eos=True))
        reservation = consumer.engine.reserve_request(PROMPT, SamplingParams(max_tokens=4), "d")
        # the KV lands (the in-memory copy reports it at once) while the consumer is busy
        producer.engine.add_request(PROMPT, SamplingParams(temperature=0, max_tokens=1), "p",
                                    kv_send=send_params(consumer.engine, reservation, "d"))
        while producer.engine.has_unfinished_requests():
            producer.engine.step()
        reported_before_step = []
        real_step = core.step

        def step():
            while service.poll(0):
                message = decode_core_message(service.recv())
                if isinstance(message, StepOutputs):
                    reported_before_step.extend(message.reservation_events)
            return real_step()
        core.step = step
        loop._run_once()
        assert reported_before_step == [ReservationEvent("d", ReservationEventKind.ARRIVED)]
        consumer.engine.abort_request("d")
        consumer.engine.abort_request(busy)
        for llm in (producer, consumer):
            assert llm.engine.core.block_pool.num_free_blocks == llm.engine.core.block_pool.num_blocks
    finally:
        for socket in (inbox, outbox, service):
            socket.close(linger=0)
        context.term()
