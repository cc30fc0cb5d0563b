"""The Triton paged-attention kernels against a float64 reference, through the engine's layouts.

Each step (tests/unit/test_attention.py's `Step`) gives every sequence shuffled, non-contiguous
blocks in a cache full of unrelated data, with ragged lengths that end mid-block and on block
boundaries, fresh prompts and chunks behind a cached prefix. Off a GPU the kernels run under
Triton's interpreter (see triton_setup.py), so the shapes stay small.
"""

from tests.unit.triton_setup import DEVICE, KERNEL_DTYPES, TOLERANCE  # noqa: I001  (skips without triton)

import pytest
import torch

from shared.attention.triton_kernels.cache_write import store_kv
from shared.attention.triton_kernels.decode_attention import choose_num_splits
from shared.attention.triton_paged import TritonPagedAttention
from tests.unit.test_attention import BLOCK_SIZE, DECODES, HEAD_DIM, NUM_BLOCKS, PREFILLS, Step, expected_output

# Longer sequences: several kernel loop iterations, two query-row blocks, a 32-token
# context ending exactly on a block boundary.
LONG_DECODES = [(40, 1, 0), (32, 1, 1)]
LONG_PREFILLS = [(36, 33, 0)]


def run_on_device(step: Step, backend: TritonPagedAttention, dtype: torch.dtype) -> torch.Tensor:
    step.key_cache = step.key_cache.to(DEVICE)
    step.value_cache = step.value_cache.to(DEVICE)
    metadata = backend.prepare(step.batch.metadata, BLOCK_SIZE, dtype)
    rows = [step.new_rows(tensors, dtype).to(DEVICE) for tensors in (step.queries, step.keys, step.values)]
    return backend.forward(*rows, step.key_cache, step.value_cache, metadata).cpu()


def check(step: Step, backend: TritonPagedAttention, dtype: torch.dtype) -> None:
    output = run_on_device(step, backend, dtype)
    assert output.dtype == dtype
    torch.testing.assert_close(output.double(), expected_output(step, dtype), rtol=0, atol=TOLERANCE[dtype])


@pytest.mark.parametrize("num_heads, num_kv_heads", [(4, 2), (4, 1), (3, 3)])
def test_mixed_step_matches_float64_reference_in_float32(num_heads, num_kv_heads):
    step = Step(num_heads, num_kv_heads, torch.float32)
    check(step, TritonPagedAttention(num_heads, num_kv_heads, HEAD_DIM, DEVICE), torch.float32)


@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=str)
def test_mixed_step_matches_float64_reference_in_each_dtype(dtype):
    step = Step(4, 2, dtype)
    check(step, TritonPagedAttention(4, 2, HEAD_DIM, DEVICE), dtype)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("decodes, prefills", [(DECODES, []), ([], PREFILLS), (LONG_DECODES, LONG_PREFILLS)],
                         ids=["decodes", "prefills", "long"])
def test_decodes_and_prefills_alone_and_across_splits(decodes, prefills, num_splits):
    step = Step(6, 2, torch.float32, decodes=decodes, prefills=prefills)
    check(step, TritonPagedAttention(6, 2, HEAD_DIM, DEVICE, num_splits=num_splits), torch.float32)


def test_more_splits_than_context_blocks_leaves_empty_splits_harmless():
    step = Step(4, 2, torch.float32, decodes=[(1, 1, 0), (2, 1, 0)], prefills=[])
    check(step, TritonPagedAttention(4, 2, HEAD_DIM, DEVICE, num_splits=4), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_new_tokens_land_in_their_slots_and_nothing_else_changes(dtype):
    step = Step(4, 2, dtype)
    key_cache, value_cache = step.key_cache.to(DEVICE), step.value_cache.to(DEVICE)
    keys_before, values_before = key_cache.clone(), value_cache.clone()
    slots = step.batch.metadata.slot_mapping
    new_keys, new_values = step.new_rows(step.keys, dtype), step.new_rows(step.values, dtype)
    store_kv(new_keys.to(DEVICE), new_values.to(DEVICE), key_cache, value_cache, slots.to(DEVICE))
    flat_keys, flat_values = key_cache.cpu().view(-1, 2, HEAD_DIM), value_cache.cpu().view(-1, 2, HEAD_DIM)
    assert torch.equal(flat_keys[slots], new_keys)
    assert torch.equal(flat_values[slots], new_values)
    untouched = torch.ones(NUM_BLOCKS * BLOCK_SIZE, dtype=torch.bool)
    untouched[slots] = False
    assert torch.equal(flat_keys[untouched], keys_before.cpu().view(-1, 2, HEAD_DIM)[untouched])
    assert torch.equal(flat_values[untouched], values_before.cpu().view(-1, 2, HEAD_DIM)[untouched])


def test_negative_slots_are_skipped():
    key_cache = torch.zeros(2, BLOCK_SIZE, 1, HEAD_DIM, device=DEVICE)
    value_cache = torch.zeros_like(key_cache)
    rows = torch.ones(2, 1, HEAD_DIM, device=DEVICE)
    store_kv(rows, rows, key_cache, value_cache, torch.tensor([-1, 5], device=DEVICE))
    assert key_cache.sum().item() == HEAD_DIM and key_cache[1, 1].sum().item() == HEAD_DIM


def test_split_count_grows_with_context_and_shrinks_with_batch():
    assert choose_num_splits(num_seqs=1, num_kv_heads=3, max_context_len=100) == 1
    assert choose_num_splits(num_seqs=1, num_kv_heads=3, max_context_len=4096) == 16
    assert choose_num_splits(num_seqs=256, num_kv_heads=3, max_context_len=4096) == 1
