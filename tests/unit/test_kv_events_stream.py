"""An engine's KV-event stream as a subscriber sees it: ZeroMQ multipart messages (topic, 8-byte
big-endian sequence number, vLLM batch) decoded with vLLM's schema (tests.helpers.vllm_kv_events);
BlockStored for the blocks the prefix cache gains, with their parent, tokens and extra keys,
BlockRemoved when the pool reuses them, AllBlocksCleared on a reset; and a publisher that never
makes the engine wait (a full queue drops and counts)."""

import threading

import msgspec

from shared.core.kv_cache_manager import KVCacheManager
from shared.core.request import Request
from shared.engine import LLM, SamplingParams
from shared.kv_cache.block_hash import HashRecipe, prompt_block_hashes
from shared.kv_cache.block_pool import BlockPool
from shared.kv_events.config import KVEventsConfig, offset_endpoint_port
from shared.kv_events.log import KVEventLog
from shared.kv_events.publisher import KVEventPublisher
from shared.kv_events.stream import KVEventStream
from shared.kv_events.wire import TYPES, external_hash
from services.launcher.ports import find_free_port
from tests.helpers.vllm_kv_events import DECODER, AllBlocksCleared, BlockRemoved, BlockStored, Subscriber

WARM_UP_TRIES = 200  # 50 ms polls: a SUB socket misses what is sent before its subscription lands


def connected(stream: KVEventStream, port: int) -> Subscriber:
    """A subscriber that has received one message (a warm-up AllBlocksCleared), so that it
    misses nothing the stream sends from now on."""
    subscriber = Subscriber(f"tcp://127.0.0.1:{port}")
    for _ in range(WARM_UP_TRIES):
        stream.log.cleared()
        stream.flush()
        if subscriber.receive(50) is not None:
            while subscriber.receive(0) is not None:
                pass
            return subscriber
    raise AssertionError("the subscriber never received the warm-up messages")


def test_a_subscriber_reads_topic_sequence_and_vllms_batch():
    port = find_free_port()
    stream = KVEventStream(KVEventsConfig(f"tcp://*:{port}", topic="kv@pod-1@m", data_parallel_rank=3))
    subscriber = connected(stream, port)
    try:
        stream.log.stored([b"\x01" * 32, b"\x02" * 32], None, [7, 8, 9, 10], 2, "GPU", lora_id=4, lora_name="a")
        stream.flush()
        stream.log.removed([b"\x01" * 32], "GPU")
        stream.flush()
        (topic, first, stored), (_, second, removed) = subscriber.receive(5000), subscriber.receive(5000)
        assert topic == b"kv@pod-1@m" and second == first + 1 and stored.data_parallel_rank == 3
        assert stored.events == [BlockStored([external_hash(b"\x01" * 32), external_hash(b"\x02" * 32)], None,
                                             [7, 8, 9, 10], 2, 4, "GPU", "a")]
        assert removed.events == [BlockRemoved([external_hash(b"\x01" * 32)], "GPU")]
    finally:
        subscriber.close()
        stream.close()


class StalledPublisher(KVEventPublisher):
    """A publisher whose thread has not started sending yet (a slow network, say)."""

    def __init__(self, config):
        self.release = threading.Event()
        super().__init__(config)

    def _run(self):
        self.release.wait()
        super()._run()


def test_a_full_queue_drops_batches_without_waiting_and_counts_them():
    config = KVEventsConfig(f"tcp://*:{find_free_port()}", max_queue_batches=2)
    publisher = StalledPublisher(config)
    batch = TYPES["array"].batch(0.0, [], 0)
    for _ in range(5):
        publisher.publish(batch)
    assert publisher.num_dropped == 3
    publisher.release.set()
    publisher.close()
    assert publisher.num_published == 2


def test_instance_k_of_a_stack_gets_port_plus_k():
    assert offset_endpoint_port("tcp://*:5557", 0) == "tcp://*:5557"
    assert offset_endpoint_port("tcp://*:5557", 2) == "tcp://*:5559"
    assert offset_endpoint_port("ipc:///tmp/kv", 1) == "ipc:///tmp/kv_dp1"


def as_vllm(events: list) -> list:
    """The events as a reader with vLLM's schema decodes them."""
    return DECODER.decode(msgspec.msgpack.encode(TYPES["array"].batch(0.0, events, 0))).events


def manager_with_log(num_blocks: int, algo: str = "sha256") -> KVCacheManager:
    pool = BlockPool(num_blocks)
    pool.kv_event_log = KVEventLog(TYPES["array"])
    return KVCacheManager(pool, 4, True, algo, model_key="m")


def computed(manager: KVCacheManager, request: Request) -> None:
    assert manager.allocate(request, request.num_tokens)
    request.num_computed_tokens = request.num_tokens
    manager.cache_computed_blocks(request)


def test_the_pool_stores_a_chain_then_removes_what_it_reuses_then_clears():
    manager = manager_with_log(3)
    request = Request("r", list(range(10)), SamplingParams(), cache_salt="s")
    computed(manager, request)  # 10 tokens: two full blocks of 4, a third partial
    hashes = prompt_block_hashes(request.all_token_ids, HashRecipe("m", 4), "s")
    [stored] = as_vllm(manager.pool.kv_event_log.drain())
    assert (stored.block_hashes, stored.parent_block_hash) == ([external_hash(h) for h in hashes], None)
    assert (stored.token_ids, stored.block_size, stored.medium) == (list(range(8)), 4, "GPU")
    manager.free(request)
    # Freed tail first: the next two blocks taken are the partial one and block 1 (evicted).
    computed(manager, Request("other", [90, 91, 92, 93, 94, 95, 96], SamplingParams()))
    removed, stored_other = as_vllm(manager.pool.kv_event_log.drain())
    assert removed == BlockRemoved([external_hash(hashes[1])], "GPU")
    assert stored_other.token_ids == [90, 91, 92, 93]
    manager.pool.reset_prefix_cache()
    assert as_vllm(manager.pool.kv_event_log.drain())[-1] == AllBlocksCleared()


def test_a_later_store_names_its_parent_and_the_extra_keys_in_the_map_layout():
    pool = BlockPool(8)
    pool.kv_event_log = KVEventLog(TYPES["map"])
    manager = KVCacheManager(pool, 4, True, "sha256_cbor", model_key="m")
    request = Request("r", list(range(6)), SamplingParams(), cache_salt="s")
    computed(manager, request)  # block 0 only
    for token in (6, 7):
        request.append_output_token(token)
    request.num_computed_tokens = 8
    manager.cache_computed_blocks(request)
    first, second = pool.kv_event_log.drain()
    hashes = prompt_block_hashes(list(range(8)), HashRecipe("m", 4, "sha256_cbor"), "s")
    assert (first.parent_block_hash, first.extra_keys, first.group_idx) == (None, [("s",)], 0)  # salt: block 0 only
    assert (second.block_hashes, second.parent_block_hash) == ([external_hash(hashes[1])], external_hash(hashes[0]))
    assert (second.token_ids, second.extra_keys) == ([4, 5, 6, 7], None)


def test_an_engine_publishes_each_steps_events_after_the_step(tiny_llama_folder):
    port = find_free_port()
    llm = LLM(model=str(tiny_llama_folder), dtype="float32", block_size=4, num_blocks=64,
              prefix_hash_algo="sha256_cbor", kv_events_endpoint=f"tcp://*:{port}")
    subscriber = connected(llm.engine.core.kv_events, port)
    try:
        prompt = list(range(10, 23))  # 13 tokens: three full blocks
        llm.generate([prompt], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
        events = []
        while (message := subscriber.receive(2000)) is not None and not events:
            events = [event for event in message[2].events if isinstance(event, BlockStored)]
        hashes = prompt_block_hashes(prompt, HashRecipe("unused", 4, "sha256_cbor"))
        assert events[0].block_hashes == [external_hash(h) for h in hashes]
        assert events[0].token_ids == prompt[:12] and events[0].parent_block_hash is None
    finally:
        subscriber.close()
        llm.engine.core.shutdown()
