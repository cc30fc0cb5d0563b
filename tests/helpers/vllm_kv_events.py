"""A KV-event subscriber as an indexer outside pdserve would write it: vLLM's event schema
written out again here (vllm/distributed/kv_events.py, array layout), independent of
shared.kv_events, and a ZeroMQ SUB socket that reads (topic, sequence, batch) messages."""

import msgspec
import zmq


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


DECODER = msgspec.msgpack.Decoder(KVEventBatch)


class Subscriber:
    """SUB socket connected to `endpoint`, subscribed to every topic."""

    def __init__(self, endpoint: str):
        self.socket = zmq.Context.instance().socket(zmq.SUB)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(endpoint)
        self.socket.setsockopt(zmq.SUBSCRIBE, b"")

    def receive(self, timeout_ms: int) -> tuple[bytes, int, KVEventBatch] | None:
        """(topic, sequence number, batch) of the next message, None if none came in time."""
        if not self.socket.poll(timeout_ms):
            return None
        topic, sequence, payload = self.socket.recv_multipart()
        assert len(sequence) == 8
        return topic, int.from_bytes(sequence, "big"), DECODER.decode(payload)

    def close(self) -> None:
        self.socket.close()
