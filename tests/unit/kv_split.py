"""Prefill/decode splits inside one process through the in-memory KV connector (helpers)."""

from shared.engine import LLM, LoRARequest, SamplingParams
from shared.engine_api.client import KVReservation, ReservationEventKind
from shared.engine.llm_engine import LLMEngine
from shared.kv_transfer.types import KVConnectorRole, KVSendParams, KVTransferConfig

IN_MEMORY = "shared.kv_transfer.in_memory:InMemoryConnector"


def connected_llm(folder, role: KVConnectorRole = KVConnectorRole.BOTH, **kwargs) -> LLM:
    return LLM(model=str(folder), dtype="float32", num_blocks=kwargs.pop("num_blocks", 32),
               kv_transfer=kwargs.pop("kv_transfer", KVTransferConfig(IN_MEMORY, role)), **kwargs)


def send_params(consumer: LLMEngine, reservation: KVReservation, consumer_id: str) -> KVSendParams:
    return KVSendParams(consumer.core.connector.address, consumer_id, tuple(reservation.block_ids),
                        reservation.num_skip_blocks, reservation.transfer_token)


def kv_arrivals(engine: LLMEngine) -> list[tuple[str, str | None]]:
    """(request id, error or None) for each transfer into a reservation the engine applied
    since the last call (its ARRIVED and TRANSFER_FAILED events)."""
    return [(event.request_id, event.error) for event in engine.drain_reservation_events()
            if event.kind != ReservationEventKind.EXPIRED]


def first_token_params(params: SamplingParams, num_resumed: int = 0) -> SamplingParams:
    return SamplingParams(**{**params.__dict__, "max_tokens": num_resumed + 1,
                             "min_tokens": min(params.min_tokens, num_resumed + 1)})


def run_prefill(engine: LLMEngine, prompt: list[int], params: SamplingParams, request_id: str,
                send: KVSendParams, num_resumed: int = 0, lora_request: LoRARequest | None = None):
    """Prefill `prompt` with its KV sent per `send`; the final output (after the send)."""
    engine.add_request(prompt, params, request_id, num_resumed_output_tokens=num_resumed, kv_send=send,
                       lora_request=lora_request)
    while True:
        for output in engine.step():
            if output.request_id == request_id and output.finished:
                return output


def decode_after(engine: LLMEngine, request_id: str, first_token_id: int) -> list[int]:
    """Start a reservation whose KV arrived and decode it to the end; its tokens."""
    engine.step()  # applies the arrival
    [output] = engine.start_reserved(request_id, first_token_id)
    while not output.finished:
        output = next(o for o in engine.step() if o.request_id == request_id)
    return output.outputs[0].token_ids


def run_split(llm: LLM, prompt: list[int], params: SamplingParams, num_resumed: int = 0,
              lora_request: LoRARequest | None = None) -> list[int]:
    """Reserve on the consumer side, prefill with the KV sent there, decode: one engine, both
    roles (both sides with `lora_request`'s adapter, if any)."""
    engine = llm.engine
    reservation = engine.reserve_request(prompt, params, "d", num_resumed_output_tokens=num_resumed,
                                         lora_request=lora_request)
    prefilled = run_prefill(engine, prompt, first_token_params(params, num_resumed), "p",
                            send_params(engine, reservation, "d"), num_resumed, lora_request)
    assert prefilled.kv_transfer is not None, prefilled.kv_transfer_error
    return decode_after(engine, "d", prefilled.outputs[0].token_ids[-1])
