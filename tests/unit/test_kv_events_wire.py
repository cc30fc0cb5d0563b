"""KV events in vLLM's wire format, byte for byte: batches built through the engine's event log
encode to golden payloads written by hand from the MessagePack rules (tests/unit/data), and a
reader with its own copy of vLLM's schema decodes them."""

from pathlib import Path

import msgspec
import pytest

from shared.kv_events.log import KVEventLog
from shared.kv_events.wire import TYPES, external_hash
from tests.helpers.vllm_kv_events import DECODER, AllBlocksCleared, BlockRemoved, BlockStored

DATA = Path(__file__).parent / "data"


def golden(name: str) -> bytes:
    lines = (line.split("#", 1)[0] for line in (DATA / name).read_text().splitlines())
    return bytes.fromhex("".join(lines))


def digest(low_64_bits: int) -> bytes:
    """A 32-byte digest whose low 64 bits are `low_64_bits` (the rest must not matter)."""
    return b"\xaa" * 24 + low_64_bits.to_bytes(8, "big")


def test_the_external_hash_is_the_digests_low_64_bits_unsigned():
    assert external_hash(bytes(range(32))) == int.from_bytes(bytes(range(24, 32)), "big")
    assert external_hash(digest(2**64 - 1)) == 2**64 - 1


def test_the_array_layout_matches_the_golden_payload():
    log = KVEventLog(TYPES["array"])
    log.stored([digest(1), digest(2**64 - 1)], None, [1, 2], 2, "GPU")
    log.removed([digest(3)], "GPU")
    log.cleared()
    payload = msgspec.msgpack.encode(TYPES["array"].batch(1.5, log.drain(), 0))
    assert payload == golden("kv_events_array_batch.hex")


def test_the_map_layout_matches_the_golden_payload():
    log = KVEventLog(TYPES["map"])
    log.stored([digest(5)], digest(7), [1, 2], 2, "GPU", lora_id=1, lora_name="a", extra_keys=[("x",)])
    log.removed([digest(3)], "GPU")
    payload = msgspec.msgpack.encode(TYPES["map"].batch(1.5, log.drain(), 2))
    assert payload == golden("kv_events_map_batch.hex")


def test_a_reader_with_vllms_schema_decodes_the_array_layout():
    batch = DECODER.decode(golden("kv_events_array_batch.hex"))
    assert (batch.ts, batch.data_parallel_rank) == (1.5, 0)
    assert batch.events == [BlockStored([1, 2**64 - 1], None, [1, 2], 2, None, "GPU", None),
                            BlockRemoved([3], "GPU"), AllBlocksCleared()]


def test_consecutive_removals_from_one_medium_join_one_event():
    log = KVEventLog(TYPES["array"])
    log.removed([digest(1)], "GPU")
    log.removed([digest(2)], "GPU")
    log.removed([digest(3)], "CPU")
    assert [(event.block_hashes, event.medium) for event in log.drain()] == [([1, 2], "GPU"), ([3], "CPU")]


def test_a_log_nobody_drains_drops_past_its_bound_and_counts():
    log = KVEventLog(TYPES["array"], max_pending=2)
    for _ in range(3):
        log.cleared()
    assert (len(log.drain()), log.num_dropped) == (2, 1)


@pytest.mark.parametrize("bad", ["http://x:1", "5557", ""])
def test_an_endpoint_without_a_zeromq_scheme_is_refused_by_name(bad):
    from shared.errors import ConfigurationError
    from shared.kv_events.config import KVEventsConfig
    with pytest.raises(ConfigurationError, match="^kv_events_endpoint"):
        KVEventsConfig(bad)
