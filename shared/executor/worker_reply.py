"""What the output rank answers the engine: readiness, then one reply per step (typed msgspec)."""

import msgspec

from shared.executor.base import ModelRunnerOutput


class WorkerReply(msgspec.Struct, omit_defaults=True):
    output: ModelRunnerOutput | None = None
    # Seconds the output rank spent in collectives and transfers this step (waits included).
    comm_seconds: float = 0.0
    ready: bool = False
    # LoRA: the adapters the output rank holds in memory after this step (every rank reads the
    # same adapters in the same steps, so they hold the same ones).
    resident_lora_ids: list[int] = []


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(WorkerReply)


def encode_reply(reply: WorkerReply) -> bytes:
    return _encoder.encode(reply)


def decode_reply(payload: bytes) -> WorkerReply:
    return _decoder.decode(payload)
