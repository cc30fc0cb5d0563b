"""The executor's wire pieces, in one process: the shared-memory ring and the step messages."""

import pytest

from shared.core.scheduler_output import ScheduledRequest, SchedulerOutput
from shared.executor.shm_ring import RingClosedError, ShmRing
from shared.executor.step_message import StepEncoder, WorkerRequests, decode_step, encode_step
from shared.executor.stage_runner import split_micro_batches
from shared.parallel.config import ParallelConfig, stage_layers
from shared.errors import ConfigurationError
from shared.sampling.params import SamplingParams


def test_ring_delivers_every_message_to_every_reader_in_order_across_wraparound():
    ring = ShmRing.create(num_readers=2, num_slots=2, slot_bytes=64)
    readers = [ShmRing.attach(*ring.spec) for _ in range(2)]
    try:
        for index in range(5):
            ring.write(f"message {index}".encode(), check=lambda: None)
            assert [reader.read(rank, check=lambda: None) for rank, reader in enumerate(readers)] == \
                [f"message {index}".encode()] * 2
    finally:
        for reader in readers:
            reader.close()
        ring.close(unlink=True)


def test_ring_writer_waits_for_slow_reader_and_check_ends_the_wait():
    ring = ShmRing.create(num_readers=1, num_slots=1, slot_bytes=8)
    try:
        ring.write(b"first", check=lambda: None)

        def give_up():
            raise RingClosedError("reader gone")
        with pytest.raises(RingClosedError):
            ring.write(b"second", check=give_up)  # the only slot is still unread
        with pytest.raises(ValueError, match="exceeds"):
            ring.write(b"x" * 9, check=lambda: None)
    finally:
        ring.close(unlink=True)


def _scheduled(request_id, token_ids, start, blocks, prompt, output, sample=True):
    return ScheduledRequest(request_id, token_ids, start, blocks, SamplingParams(temperature=0) if sample else None,
                            prompt, output)


def test_running_requests_travel_as_deltas_and_workers_rebuild_the_same_rows():
    encoder, workers = StepEncoder(), WorkerRequests()
    prompt = list(range(10, 30))
    first = SchedulerOutput([_scheduled("a", prompt[:16], 0, [3], prompt, [], sample=False)])
    second = SchedulerOutput([_scheduled("a", prompt[16:], 16, [3, 7], prompt, [])])
    third = SchedulerOutput([_scheduled("a", [99], 20, [3, 7], prompt, [99])])
    messages = [decode_step(encode_step(encoder.encode(step))) for step in (first, second, third)]
    assert [len(m.new_requests) for m in messages] == [1, 0, 0]
    assert [(d.new_output_token_ids, d.new_block_ids) for m in messages[1:] for d in m.deltas] == [([], [7]), ([99], [])]
    for step, message in zip((first, second, third), messages):
        rebuilt = workers.apply(message).scheduled[0]
        original = step.scheduled[0]
        assert (rebuilt.token_ids, rebuilt.start_position, rebuilt.block_ids, rebuilt.output_token_ids) == \
            (original.token_ids, original.start_position, original.block_ids, original.output_token_ids)
        assert rebuilt.sampling_params == original.sampling_params  # handed over with the first sampling row
    workers.apply(decode_step(encode_step(encoder.encode(SchedulerOutput(finished_request_ids={"a"})))))
    assert len(workers) == 0


def test_a_requests_lora_adapter_travels_once_and_every_row_carries_it():
    from dataclasses import replace
    from shared.lora.request import LoRARequest
    adapter = LoRARequest("sql", 3, "/adapters/sql")
    encoder, workers = StepEncoder(), WorkerRequests()
    prompt = [1, 2, 3, 4]
    steps = [SchedulerOutput([replace(_scheduled("a", prompt, 0, [2], prompt, []), lora_request=adapter),
                              _scheduled("b", prompt, 0, [5], prompt, [])]),
             SchedulerOutput([replace(_scheduled("a", [9], 4, [2], prompt, [9]), lora_request=adapter)])]
    rebuilt = [workers.apply(decode_step(encode_step(encoder.encode(step)))).scheduled for step in steps]
    assert [[item.lora_request for item in rows] for rows in rebuilt] == [[adapter, None], [adapter]]


def test_a_request_whose_blocks_changed_is_sent_in_full_again():
    encoder = StepEncoder()
    encoder.encode(SchedulerOutput([_scheduled("a", [1, 2], 0, [4], [1, 2], [])]))
    message = encoder.encode(SchedulerOutput([_scheduled("a", [1, 2], 0, [5], [1, 2], [])]))
    assert [new.block_ids for new in message.new_requests] == [[5]]


def test_micro_batches_split_requests_by_token_count():
    items = [_scheduled(str(i), [1] * n, 0, [0], [1] * n, []) for i, n in enumerate([1, 1, 8, 6])]
    batches = split_micro_batches(items, 2)
    assert [[item.request_id for item in batch] for batch in batches] == [["0", "1", "2"], ["3"]]
    assert split_micro_batches(items[:1], 2) == [items[:1]]


def test_stages_cover_every_layer_once():
    assert [list(stage_layers(5, 2, s)) for s in range(2)] == [[0, 1, 2], [3, 4]]
    assert [list(stage_layers(30, 4, s))[0] for s in range(4)] == [0, 8, 16, 23]


def test_tensor_parallel_size_must_divide_the_heads():
    with pytest.raises(ConfigurationError, match="tensor_parallel_size: 3 must divide"):
        ParallelConfig(tensor_parallel_size=3).check_model(num_heads=8, num_kv_heads=4, num_layers=2)
    with pytest.raises(ConfigurationError, match="pipeline_parallel_size"):
        ParallelConfig(pipeline_parallel_size=3).check_model(num_heads=8, num_kv_heads=4, num_layers=2)
    with pytest.raises(ConfigurationError, match="tensor_parallel_size"):
        ParallelConfig(tensor_parallel_size=0)


def test_kv_shards_split_layers_by_stage_and_heads_by_rank():
    import torch
    from shared.executor.kv_shards import SharedKVShards
    from shared.kv_cache.layout import KVCacheLayout
    layout = KVCacheLayout(num_layers=3, num_blocks=4, block_size=2, num_kv_heads=2, head_dim=3, dtype=torch.float32)
    shards = SharedKVShards(layout, tensor_parallel_size=2, pipeline_parallel_size=2)
    try:
        source = torch.randn(layout.shape)
        shards.scatter(source, [1, 3])
        assert torch.equal(shards.gather([3, 1]), source[:, :, [3, 1]])
        assert not shards.gather([0, 2]).any()
        # Rank 3 = stage 1 (layer 2), tensor rank 1 (KV head 1).
        assert shards.tensors[3].shape == (2, 1, 4, 2, 1, 3)
        assert torch.equal(shards.tensors[3][:, 0, 1, :, 0], source[:, 2, 1, :, 1])
    finally:
        shards.close()


def test_worker_startup_round_trips_and_names_the_shard_the_engine_made():
    import torch
    from shared.executor.kv_shards import SharedKVShards, shard_of_rank
    from shared.executor.worker_startup import (AdapterSettings, CacheLayout, StartupError, WorkerStartup,
                                                decode_startup, encode_startup)
    from shared.lora.config import LoRAConfig
    from shared.kv_cache.layout import KVCacheLayout
    layout = KVCacheLayout(num_layers=3, num_blocks=4, block_size=2, num_kv_heads=2, head_dim=3, dtype=torch.bfloat16)
    shards = SharedKVShards(layout, tensor_parallel_size=2, pipeline_parallel_size=2)
    ring = ShmRing.create(num_readers=4, num_slots=1, slot_bytes=8)
    try:
        startup = WorkerStartup(3, 2, 2, 1234, 5678, "/models/x", CacheLayout.of(layout), shards.folder, 1, 0,
                                ring.spec, ring.spec, AdapterSettings.of(LoRAConfig(True, 2, 8, None)))
        received = decode_startup(encode_startup(startup))
        assert received == startup and received.world_size == 4
        assert received.lora.to_config() == LoRAConfig(True, 2, 8, None)
        assert received.kv_layout.to_layout() == layout
        assert shard_of_rank(received.kv_folder, layout, 2, 2, 3) == shards.shards[3]
        ShmRing.attach(*received.step_ring).close()
    finally:
        ring.close(unlink=True)
        shards.close()
    with pytest.raises(StartupError, match="not a worker startup message"):
        decode_startup(b"\x93")
    with pytest.raises(StartupError, match="kv_layout.dtype: 'nonsense' is not a torch dtype"):
        CacheLayout(3, 4, 2, 2, 3, "nonsense").to_layout()
